"""The federation and the one VFL training loop (VLR, VHNN and VSNN alike)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch import Tensor, nn

from vflbench.models.finetune import EVAL_BATCH
from vflbench.protocol.channel import CommStats, InMemoryTransport, Transport
from vflbench.protocol.messages import ACTIVE
from vflbench.protocol.party import ActiveParty, PassiveParty, Split
from vflbench.protocol.service import PassivePeer, PassiveService, protocol_kind

log = logging.getLogger(__name__)


class Progress(Protocol):
    """What the loop reports to a progress display."""

    def start(self, epochs: int, steps_per_epoch: int) -> None: ...  # noqa: D102
    def advance(self) -> None: ...  # noqa: D102
    def epoch_done(self, record: dict[str, Any]) -> None: ...  # noqa: D102


@dataclass
class History:
    """Per-epoch records of one training run."""

    epochs: list[dict[str, Any]] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)
    refused_updates: int = 0


def classification_metrics(scores: Tensor, predicted: Tensor, y: Tensor) -> dict[str, float]:
    """Accuracy always; AUC for binary tasks; top-5 accuracy for 100+ classes.

    A diverged model (non-finite outputs) is scored as it predicts, with its non-finite scores
    treated as ties, and the fraction of such rows is reported as ``nonfinite``.
    """
    finite = torch.isfinite(scores).all(1)
    out = {"accuracy": float((predicted == y).float().mean())}
    if not finite.all():
        out["nonfinite"] = float((~finite).float().mean())
        log.warning("%d of %d outputs are not finite (training diverged?)", int((~finite).sum()), len(finite))
        scores = torch.nan_to_num(scores, nan=0.0, posinf=0.0, neginf=0.0)
    n_classes = scores.shape[1]
    if n_classes == 2 and len(torch.unique(y)) == 2:
        out["auc"] = float(roc_auc_score(y.cpu().numpy(), scores[:, 1].double().cpu().numpy()))
    if n_classes >= 100:
        top5 = scores.topk(5, 1).indices
        out["top5"] = float((top5 == y[:, None]).any(1).float().mean())
    return out


class Federation:
    """An active party and K-1 passive parties joined by a :class:`~vflbench.protocol.channel.Transport`.

    The loop talks to every passive party only through messages (:mod:`vflbench.protocol.service`): ``passives``
    are the passive parties held in this process, each serving its handlers on its own endpoint; ``remote`` are
    handles on passive parties in other processes (the active party's process of a launched run), reached through
    the same messages over the network transport ``channel``. :attr:`peers` holds one handle per passive party,
    in order.

    ``train_rows``: the rows of the training split that :meth:`fit` draws its batches from (all
    when ``None``); rows left out (e.g. an attacker's auxiliary set that is disjoint from the
    training set) are never trained on by any party. Row ids keep their meaning either way.
    """

    def __init__(
        self,
        active: ActiveParty,
        passives: Sequence[PassiveParty] = (),
        channel: Transport | None = None,
        train_rows: Tensor | None = None,
        remote: Sequence[PassivePeer] = (),
    ) -> None:
        self.active = active
        self.passives = list(passives)
        self.channel: Transport = channel if channel is not None else InMemoryTransport()
        #: The aligned training rows the loop trains on (``None``: all); rows a defense holds out
        #: (an attacker's or VMask's auxiliary set) are left out.
        self.train_rows = train_rows
        for party in (active, *self.passives):
            self.channel.register(party.transcript)
        for party in self.passives:
            PassiveService(party, self.channel.endpoint(party.name)).serve()
        endpoint = self.channel.endpoint(ACTIVE)
        self.peers: list[PassivePeer] = [*(PassivePeer(p.name, endpoint) for p in self.passives), *remote]

    def parties(self) -> list[Any]:
        """Every party held in this process, passive parties first."""
        return [*self.passives, self.active]

    def peer(self, name: str) -> PassivePeer:
        """The handle on passive party ``name``."""
        return {p.name: p for p in self.peers}[name]

    def bottom_of(self, name: str) -> nn.Module | None:
        """Passive party ``name``'s bottom model as the experimenter's scorer may query it: the party's own when it is
        held in this process, else the evaluation-only access the run granted (``None``: none)."""
        local = {p.name: p for p in self.passives}
        return local[name].bottom if name in local else self.peer(name).bottom

    def traffic(self, phase: str = "train") -> CommStats:
        """The protocol's traffic of ``phase`` that the transport counted (the requests that drive a passive party
        left out: :func:`~vflbench.protocol.service.protocol_kind`)."""
        return self.channel.stats[phase].only(protocol_kind)

    def train_step(self, ids: Tensor, *, epoch: int, step: int) -> int:
        """One batch of the protocol; returns the number of refused updates."""
        received = [p.forward(ids, epoch=epoch, step=step) for p in self.peers]
        gradients = self.active.step(ids, received, epoch=epoch, step=step, senders=[p.name for p in self.peers])
        refused = 0
        for p, g in zip(self.peers, gradients, strict=True):
            refused += not p.backward(g, ids=ids, epoch=epoch, step=step)
        return refused

    def outputs(self, split: Split, ids: Tensor | None = None) -> Tensor:
        """Model outputs for ``split`` (all rows, or ``ids``), computed through the protocol."""
        n = len(self.active.objective.targets) if split == "train" else self._n_test()
        rows = torch.arange(n) if ids is None else ids
        chunks = []
        for start in range(0, len(rows), EVAL_BATCH):
            batch = rows[start : start + EVAL_BATCH]
            received = [p.forward(batch, epoch=-1, step=-1, split=split, train=False) for p in self.peers]
            chunks.append(self.active.predict(batch, received, split))
        return torch.cat(chunks)

    def _n_test(self) -> int:
        holder = self.active if self.active.data is not None else self.passives[0]
        assert holder.data is not None
        return len(holder.data.x_test)

    def evaluate(self, y: Tensor, split: Split = "test") -> dict[str, float]:
        """Classification metrics of the joint model on ``split`` against labels ``y``."""
        out = self.outputs(split)
        obj = self.active.objective
        return classification_metrics(obj.scores(out), obj.decode(out), y)

    def fit(
        self,
        *,
        epochs: int,
        batch_size: int,
        generator: torch.Generator,
        y_test: Tensor,
        eval_every: int = 1,
        progress: Progress | None = None,
        on_epoch_end: Callable[[int, dict[str, Any]], None] | None = None,
        start_epoch: int = 0,
        history: History | None = None,
    ) -> History:
        """THE training loop: shuffled batches of aligned ids, evaluation every ``eval_every``.

        ``start_epoch`` and ``history``: continue a run restored after its epoch ``start_epoch - 1`` (with the
        ``generator`` and every party's state as they were then), adding to that run's ``history``."""
        rows = self.train_rows
        n = len(self.active.objective.targets) if rows is None else len(rows)
        steps = int(np.ceil(n / batch_size))
        history = history if history is not None else History()
        if progress is not None:
            progress.start(epochs, steps)
        for epoch in range(start_epoch, epochs):
            order = torch.randperm(n, generator=generator)
            if rows is not None:
                order = rows[order]
            tic = time.perf_counter()
            refused = 0
            for step in range(steps):
                refused += self.train_step(order[step * batch_size : (step + 1) * batch_size], epoch=epoch, step=step)
                if progress is not None:
                    progress.advance()
            history.epoch_seconds.append(time.perf_counter() - tic)
            history.refused_updates += refused
            record: dict[str, Any] = {
                "epoch": epoch,
                "loss": self.active.last_loss,
                "seconds": history.epoch_seconds[-1],
            }
            for peer in self.peers:
                record.update(peer.end_epoch(epoch))
            record.update(self.active.end_epoch(epoch))
            if refused:
                record["refused_updates"] = refused
            if (epoch + 1) % eval_every == 0 or epoch == epochs - 1:
                record.update({f"test_{k}": v for k, v in self.evaluate(y_test).items()})
            diverged = not np.isfinite(self.active.last_loss)
            if diverged:
                record["diverged"] = True
                log.warning("training diverged (loss %s) in epoch %d; stopping", self.active.last_loss, epoch + 1)
            if on_epoch_end is not None:
                on_epoch_end(epoch, record)
            history.epochs.append(record)
            if progress is not None:
                progress.epoch_done(record)
            else:
                log.debug(
                    "epoch %d/%d %s",
                    epoch + 1,
                    epochs,
                    " ".join(f"{k}={v:.4g}" for k, v in record.items() if isinstance(v, float)),
                )
            if diverged:
                break
        return history
