"""The attack API: what an attacker sees (:class:`PartyView`) and what it returns.

An attack receives the view of ONE party, the attacker: its own features, its own trained
models, its own transcript and per-batch observations, and the auxiliary knowledge its threat
model grants (e.g. ``n`` known labels per class). Ground truth stays with the runner, which
scores what the attack returns. An attack never sees another party's data, labels or models.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from vflbench.data.base import PartySlice
from vflbench.errors import CompatibilityError
from vflbench.protocol.channel import Transcript

Target = Literal["labels", "features"]
Phase = Literal["observer", "post_training", "malicious"]
Prior = Literal["random", "scratch", "local"]


@dataclass(frozen=True)
class Scenario:
    """Public facts of the protocol that every party knows."""

    algorithm: str
    aggregation: str
    num_classes: int
    num_parties: int
    bottom: str
    top: str
    embed_dim: int
    single_logit: bool


@dataclass(frozen=True)
class KnownLabels:
    """Training rows whose labels the attacker's threat model grants it."""

    ids: Tensor
    labels: Tensor


@dataclass
class BatchRecord:
    """What the attacker observed on its own side for one training batch."""

    epoch: int
    step: int
    ids: Tensor
    embedding: Tensor
    gradient: Tensor
    param_grads: list[Tensor] | None = None


@dataclass
class PartyView:
    """Everything one attacking party holds; nothing else."""

    party: str
    scenario: Scenario
    data: PartySlice
    models: dict[str, nn.Module]
    transcript: Transcript
    records: list[BatchRecord]
    known: KnownLabels | None
    generator: torch.Generator

    def with_models(self, models: dict[str, nn.Module]) -> PartyView:
        """The same view with other models (e.g. randomly initialised for the scratch prior)."""
        return replace(self, models=models)

    def bottom(self) -> nn.Module:
        """A private copy of the attacker's bottom model (attacks may fine-tune it)."""
        return copy.deepcopy(self.models["bottom"])


@dataclass
class Scores:
    """Class scores for some rows: (n, C) scores, or (n,) scores of the positive class."""

    ids: Tensor
    scores: Tensor
    split: Literal["train", "test"] = "train"


@dataclass
class LabelInference:
    """What a label attack infers. The runner scores it against ground truth.

    ``train``/``test``: scores for training/test rows; ``batches``: one :class:`Scores` per
    training batch, scored per batch and averaged (Li et al.'s protocol for gradient attacks);
    ``per_epoch``: one inference per fine-tuning epoch, from which the runner reports the best
    or the last (``select``); ``details``: attack-specific diagnostics.
    """

    train: Scores | None = None
    test: Scores | None = None
    batches: list[Scores] | None = None
    per_epoch: list[LabelInference] | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Attack(ABC):
    """Base class of attacks: declare the threat model, implement :meth:`infer`.

    Parameters are keyword-only constructor arguments stored unmodified. Class attributes
    declare the target, what the attack reads, its phase, its requirements, its paper and the
    prior its leakage is measured against; :meth:`check` enforces requirements before any
    training; malicious attacks also override :meth:`corrupt`.
    """

    name: ClassVar[str] = ""
    target: ClassVar[Target] = "labels"
    reads: ClassVar[tuple[str, ...]] = ()
    phase: ClassVar[Phase] = "post_training"
    requirements: ClassVar[tuple[str, ...]] = ()
    paper: ClassVar[str] = ""
    threat: ClassVar[str] = ""
    known_per_class: int = 0
    party: str = "passive_1"
    prior: Prior = "random"
    every_epoch: bool = False

    def check(self, scenario: Scenario) -> None:
        """Raise :class:`CompatibilityError` if the scenario does not meet the requirements."""

    def extra_embedding_dims(self) -> int:
        """Dimensions a malicious passive attacker appends to its uploaded embedding (0: none)."""
        return 0

    def corrupt(self, party: Any, known: KnownLabels | None) -> None:
        """Change the attacker's own party before training (malicious attacks only).

        ``known`` are the labels the threat model grants (the same rows the view will hold).
        """

    @abstractmethod
    def infer(self, view: PartyView) -> LabelInference:
        """Run the attack on the attacker's view."""

    def local(self, view: PartyView) -> LabelInference:
        """The attacker's prior J_loc: its model trained on its known labels only.

        ``view.models`` are freshly initialised models of the attacker's architecture.
        """
        raise CompatibilityError(f"attack {self.name!r} has no 'local' prior; use prior: random or scratch")

    def get_params(self) -> dict[str, Any]:
        """The constructor parameters, as given."""
        return {k: v for k, v in vars(self).items() if not k.endswith("_") and not k.startswith("_")}


def require(condition: bool, attack: str, message: str) -> None:
    """Raise a :class:`CompatibilityError` naming the attack when ``condition`` fails."""
    if not condition:
        raise CompatibilityError(f"attack {attack!r} cannot run here: {message}")


def binary_only(attack: str, scenario: Scenario) -> None:
    """Norm/direction scoring and friends need a binary task."""
    require(scenario.num_classes == 2, attack,
            f"it needs binary labels, but the task has {scenario.num_classes} classes")


def stack_ids(parts: Sequence[Scores]) -> Tensor:
    """All ids of several score sets, concatenated."""
    return torch.cat([p.ids for p in parts])
