"""Dataset containers shared by every loader."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import Tensor

Kind = Literal["image", "tabular", "text"]


@dataclass(frozen=True)
class Dataset:
    """A centralized dataset before vertical partitioning.

    ``x_*`` are float32 for images (N, C, H, W) in [0, 1] and tabular data (N, F); text is
    int64 token ids (N, L). Categorical tabular columns (Criteo) hold integer codes stored as
    floats and are listed in ``meta["categorical"]`` with their cardinalities in
    ``meta["cardinalities"]``; they are never standardised.
    """

    name: str
    kind: Kind
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int
    feature_names: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.x_train) != len(self.y_train) or len(self.x_test) != len(self.y_test):
            raise ValueError(f"{self.name}: features and labels differ in length")
        if self.y_train.dtype != torch.long or self.y_test.dtype != torch.long:
            raise ValueError(f"{self.name}: labels must be int64 class indices")

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample's features."""
        return tuple(self.x_train.shape[1:])


@dataclass(frozen=True)
class PartySlice:
    """One party's vertical slice of the features (train and test rows aligned by index)."""

    x_train: Tensor
    x_test: Tensor
    kind: Kind
    columns: tuple[int, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    rows: Tensor | None = None
    """The training row ids ``x_train`` holds, sorted, when it holds only some rows (another party's columns for the
    rows a threat model grants, e.g. VMask's auxiliary set at the active party; no test rows then); ``None``: every
    row, aligned by index."""

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample of this slice (what the party's bottom model sees)."""
        return tuple(self.x_train.shape[1:])

    def to(self, device: torch.device | str) -> PartySlice:
        """This slice with its features on ``device`` (itself when they are there already); ``rows`` (row ids)
        stay on the CPU, as every row id does."""
        if self.x_train.device == torch.device(device) and self.x_test.device == torch.device(device):
            return self
        return replace(self, x_train=self.x_train.to(device), x_test=self.x_test.to(device))

    def train_rows(self, ids: Tensor) -> Tensor:
        """``x_train`` of training rows ``ids``; a :class:`ValueError` when this slice does not hold them all."""
        if self.rows is None:
            return self.x_train[ids]
        at = torch.searchsorted(self.rows, ids).clamp(max=max(len(self.rows) - 1, 0))
        held = len(ids) == 0 or (len(self.rows) > 0 and bool((self.rows[at] == ids).all()))
        if not held:
            raise ValueError(
                f"this slice holds training rows {self.rows.tolist()[:8]}... ({len(self.rows)}) only, "
                "not every row asked for"
            )
        return self.x_train[at]


@dataclass(frozen=True)
class VerticalData:
    """A dataset partitioned vertically among parties.

    ``passive`` holds one slice per passive party (``passive_1`` ... ``passive_{K-1}``);
    ``active`` is the active party's slice, or ``None`` when it holds no features (VSNN).
    Labels belong to the active party only.
    """

    name: str
    num_classes: int
    passive: tuple[PartySlice, ...]
    active: PartySlice | None
    y_train: Tensor
    y_test: Tensor
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_parties(self) -> int:
        """Number of parties, the active party included."""
        return len(self.passive) + 1

    @property
    def device(self) -> torch.device:
        """Where the labels (and every slice's features) live."""
        return self.y_train.device

    def to(self, device: torch.device | str) -> VerticalData:
        """This dataset with every slice's features and the labels on ``device`` (itself when they are there
        already): a run moves its data once, after loading and partitioning."""
        target = torch.device(device)
        slices = (*self.passive, *(() if self.active is None else (self.active,)))
        if (
            self.y_train.device == target
            and self.y_test.device == target
            and all(p.x_train.device == target and p.x_test.device == target for p in slices)
        ):
            return self
        return replace(
            self,
            passive=tuple(p.to(target) for p in self.passive),
            active=None if self.active is None else self.active.to(target),
            y_train=self.y_train.to(target),
            y_test=self.y_test.to(target),
        )
