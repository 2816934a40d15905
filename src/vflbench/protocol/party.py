"""Parties: each owns its data slice, models, optimizer, RNG, defenses and transcript."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from vflbench.data.base import PartySlice
from vflbench.protocol.channel import Transcript
from vflbench.protocol.hooks import Aggregation, Defense, PartyHook, PredictFn, StepFn, StepState, TopLayout
from vflbench.protocol.objective import Objective

Split = Literal["train", "test"]


def aggregate(parts: Sequence[Tensor], how: Aggregation) -> Tensor:
    """Combine embeddings: concatenation along features, element-wise sum, or mean."""
    if how == "concat":
        return torch.cat(list(parts), 1)
    stacked = torch.stack(list(parts), 0)
    return stacked.sum(0) if how == "sum" else stacked.mean(0)


class Party:
    """State common to both roles. ``optimizer`` covers every trainable model of the party."""

    def __init__(
        self,
        name: str,
        *,
        data: PartySlice | None,
        bottom: nn.Module | None,
        optimizer: torch.optim.Optimizer | None,
        generator: torch.Generator,
        defenses: Sequence[Defense] = (),
        transcript: Transcript | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        self.name = name
        self.data = data
        self.bottom = bottom
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.generator = generator
        self.defenses = list(defenses)
        self.transcript = transcript or Transcript(name)
        self.hooks: list[tuple[str, PartyHook]] = []

    def attach(self, hook: PartyHook) -> str:
        """Add this party's own code at its protocol points (see :class:`PartyHook`); returns the tag its
        models are listed under in :meth:`models` (``<hook.name>``, or ``<hook.name>#2``... when taken)."""
        if hook.replaces_step:
            taken = [h.name for _, h in self.hooks if h.replaces_step]
            if taken:
                raise ValueError(
                    f"party {self.name} already runs {taken[0]!r}'s replacement of its step; "
                    "one malicious attack per party"
                )
        tags = {tag for tag, _ in self.hooks}
        tag, n = hook.name, 1
        while tag in tags:
            n += 1
            tag = f"{hook.name}#{n}"
        self.hooks.append((tag, hook))
        return tag

    def features(self, split: Split) -> Tensor:
        """This party's feature slice of ``split``."""
        if self.data is None:
            raise ValueError(f"party {self.name} holds no features")
        return self.data.x_train if split == "train" else self.data.x_test

    def own_models(self) -> dict[str, nn.Module]:
        """The protocol's models of this party by role."""
        return {"bottom": self.bottom} if self.bottom is not None else {}

    def models(self) -> dict[str, nn.Module]:
        """The party's models by role, its hooks' as ``<tag>.<role>``: for checkpoints and attacks."""
        out = self.own_models()
        for tag, hook in self.hooks:
            out.update({f"{tag}.{role}" if hook.prefix_models else role: m for role, m in hook.models().items()})
        return out

    def end_epoch(self, epoch: int) -> dict[str, object]:
        """Step the LR schedule and let this party's defenses report."""
        if self.scheduler is not None:
            self.scheduler.step()
        report: dict[str, object] = {}
        for d in self.defenses:
            report.update({f"{d.name}.{k}": v for k, v in d.on_epoch_end(epoch).items()})
        for _, hook in self.hooks:
            report.update(hook.on_epoch_end(epoch))
        return report


class PassiveParty(Party):
    """Holds a feature slice and a bottom model; sends embeddings, applies cut gradients."""

    def __init__(self, name: str, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self._pending: tuple[Tensor, StepState] | None = None

    def forward(self, ids: Tensor, *, epoch: int, step: int, split: Split = "train", train: bool = True) -> Tensor:
        """Compute the embedding of rows ``ids``; keep the graph when training."""
        assert self.bottom is not None
        x = self.features(split)[ids]
        state = StepState(epoch, step, ids, self.name, inputs=x)
        self.bottom.train(train)
        with torch.set_grad_enabled(train):
            h = self.bottom(x)
        state.embedding = h
        if train:
            self._pending = (h, state)
        out = h.detach()
        for d in self.defenses:
            out = d.transform_embedding(out, state)
        return out

    def backward(self, gradient: Tensor) -> bool:
        """Apply a received cut gradient to the bottom model; ``False`` if a defense refused it."""
        assert self._pending is not None and self.optimizer is not None
        h, state = self._pending
        self._pending = None
        g = gradient
        for d in self.defenses:
            changed = d.on_received_gradient(g, state)
            if changed is None:
                return False
            g = changed
        regs = [r for d in self.defenses if (r := d.regularizer(state)) is not None]
        self.optimizer.zero_grad(set_to_none=True)
        if regs:
            torch.autograd.backward([h, torch.stack(regs).sum()], [g, None])
        else:
            h.backward(g)
        for _, hook in self.hooks:
            hook.after_backward(state, g)
        self.optimizer.step()
        return True


class ActiveParty(Party):
    """Holds the labels (as an :class:`Objective`), maybe a bottom model, and the top model.

    ``labels``: the label column the party stores for the training rows (class indices, as loaded). Defenses at
    the party may change what it trains on (the ``objective``'s targets: soft labels, SplitGuard's fake batches),
    never these; ``None``: the objective's targets as given. ``layout``: the top model's input (:class:`TopLayout`,
    the one its defenses read): the party aggregates its own bottom's embedding first, then the received ones, by
    ``layout.how``.
    """

    def __init__(
        self,
        name: str,
        *,
        top: nn.Module,
        objective: Objective,
        layout: TopLayout,
        labels: Tensor | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self.top = top
        self.objective = objective
        self.layout = layout
        self.labels = objective.targets if labels is None else labels

    def own_models(self) -> dict[str, nn.Module]:  # noqa: D102
        return {**super().own_models(), "top": self.top}

    def _outputs(self, ids: Tensor, received: Sequence[Tensor], split: Split, *, own_bottom: bool = True) -> Tensor:
        parts = list(received)
        if self.bottom is not None:
            if own_bottom:
                parts.insert(0, self.bottom(self.features(split)[ids]))
            else:
                with torch.no_grad():
                    parts.insert(0, self.bottom(self.features(split)[ids]))
        return self.top(aggregate(parts, self.layout.how))

    def step(
        self, ids: Tensor, received: Sequence[Tensor], *, epoch: int, step: int, senders: Sequence[str]
    ) -> list[Tensor]:
        """One training step on a batch through this party's hooks; returns the cut gradient for each sender."""
        run: StepFn = self.honest_step
        for _, hook in self.hooks:
            run = functools.partial(hook.step, proceed=run)
        return run(ids, received, epoch=epoch, step=step, senders=senders)

    def honest_step(
        self,
        ids: Tensor,
        received: Sequence[Tensor],
        *,
        epoch: int,
        step: int,
        senders: Sequence[str],
        own_bottom: bool = True,
    ) -> list[Tensor]:
        """The protocol's training step: loss, update, and the cut gradient for each sender.

        ``own_bottom=False``: the party's own bottom model takes no part in the update (its embedding enters as a
        constant, computed in the mode the model is in); the top model is trained and the cut gradients are the
        same function of the received embeddings."""
        assert self.optimizer is not None
        for m in self.models().values():
            if own_bottom or m is not self.bottom:
                m.train()
        leaves = [r.detach().requires_grad_() for r in received]
        outputs = self._outputs(ids, leaves, "train", own_bottom=own_bottom)
        targets = self.objective.targets[ids]
        state = StepState(epoch, step, ids, self.name, embeddings=leaves, outputs=outputs, targets=targets)
        loss = self.objective.loss(outputs, targets)
        regs = [r for d in self.defenses if (r := d.regularizer(state)) is not None]
        if regs:
            loss = loss + torch.stack(regs).sum()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.last_loss = float(loss.detach())
        gradients = []
        for leaf, sender in zip(leaves, senders, strict=True):
            g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            state.receiver = sender
            for d in self.defenses:
                g = d.transform_cut_gradient(g, state)
            gradients.append(g)
        return gradients

    def predict(self, ids: Tensor, received: Sequence[Tensor], split: Split) -> Tensor:
        """Model outputs for rows ``ids`` through this party's hooks (evaluation mode, no gradients)."""
        run: PredictFn = self.honest_predict
        for _, hook in self.hooks:
            run = functools.partial(hook.predict, proceed=run)
        with torch.no_grad():
            return run(ids, received, split)

    @torch.no_grad()
    def honest_predict(self, ids: Tensor, received: Sequence[Tensor], split: Split) -> Tensor:
        """The protocol's prediction (evaluation mode, no gradients)."""
        for m in self.models().values():
            m.eval()
        return self._outputs(ids, received, split)
