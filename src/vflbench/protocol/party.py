"""Parties: each owns its data slice, models, optimizer, RNG, defenses and transcript."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from vflbench.data.base import PartySlice
from vflbench.protocol.channel import Transcript
from vflbench.protocol.hooks import Aggregation, Defense, StepState
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

    def __init__(self, name: str, *, data: PartySlice | None, bottom: nn.Module | None,
                 optimizer: torch.optim.Optimizer | None, generator: torch.Generator,
                 defenses: Sequence[Defense] = (), transcript: Transcript | None = None,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> None:
        self.name = name
        self.data = data
        self.bottom = bottom
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.generator = generator
        self.defenses = list(defenses)
        self.transcript = transcript or Transcript(name)
        #: Callables ``(epoch) -> dict`` run after every epoch by this party (its own code, e.g. a
        #: malicious party's extra training); their values go into the per-epoch metrics.
        self.epoch_callbacks: list[Callable[[int], dict[str, object]]] = []

    def features(self, split: Split) -> Tensor:
        """This party's feature slice of ``split``."""
        if self.data is None:
            raise ValueError(f"party {self.name} holds no features")
        return self.data.x_train if split == "train" else self.data.x_test

    def models(self) -> dict[str, nn.Module]:
        """The party's models by role, for checkpoints and attacks."""
        return {"bottom": self.bottom} if self.bottom is not None else {}

    def end_epoch(self, epoch: int) -> dict[str, object]:
        """Step the LR schedule and let this party's defenses report."""
        if self.scheduler is not None:
            self.scheduler.step()
        report: dict[str, object] = {}
        for d in self.defenses:
            report.update({f"{d.name}.{k}": v for k, v in d.on_epoch_end(epoch).items()})
        for callback in self.epoch_callbacks:
            report.update(callback(epoch))
        return report


class PassiveParty(Party):
    """Holds a feature slice and a bottom model; sends embeddings, applies cut gradients."""

    def __init__(self, name: str, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self._pending: tuple[Tensor, StepState] | None = None
        #: Callables ``(state, gradient)`` run after backward and before the optimizer step,
        #: when this party's own parameter gradients are set (an observing attacker's view).
        self.observers: list[Callable[[StepState, Tensor], None]] = []

    def forward(self, ids: Tensor, *, epoch: int, step: int, split: Split = "train",
                train: bool = True) -> Tensor:
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
        g: Tensor | None = gradient
        for d in self.defenses:
            g = d.on_received_gradient(g, state)
            if g is None:
                return False
        regs = [r for d in self.defenses if (r := d.regularizer(state)) is not None]
        self.optimizer.zero_grad(set_to_none=True)
        if regs:
            torch.autograd.backward([h, torch.stack(regs).sum()], [g, None])
        else:
            h.backward(g)
        for observe in self.observers:
            observe(state, g)
        self.optimizer.step()
        return True


class ActiveParty(Party):
    """Holds the labels (as an :class:`Objective`), maybe a bottom model, and the top model."""

    def __init__(self, name: str, *, top: nn.Module, objective: Objective,
                 aggregation: Aggregation, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self.top = top
        self.objective = objective
        self.aggregation = aggregation

    def models(self) -> dict[str, nn.Module]:  # noqa: D102
        return {**super().models(), "top": self.top}

    def _outputs(self, ids: Tensor, received: Sequence[Tensor], split: Split) -> Tensor:
        parts = list(received)
        if self.bottom is not None:
            parts.insert(0, self.bottom(self.features(split)[ids]))
        return self.top(aggregate(parts, self.aggregation))

    def step(self, ids: Tensor, received: Sequence[Tensor], *, epoch: int, step: int,
             senders: Sequence[str]) -> list[Tensor]:
        """One training step on a batch; returns the cut gradient for each sender."""
        assert self.optimizer is not None
        for m in self.models().values():
            m.train()
        leaves = [r.detach().requires_grad_() for r in received]
        outputs = self._outputs(ids, leaves, "train")
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

    @torch.no_grad()
    def predict(self, ids: Tensor, received: Sequence[Tensor], split: Split) -> Tensor:
        """Model outputs for rows ``ids`` (evaluation mode, no gradients)."""
        for m in self.models().values():
            m.eval()
        return self._outputs(ids, received, split)
