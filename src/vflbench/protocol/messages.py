"""Messages exchanged between parties."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor

ACTIVE = "active"
MessageKind = Literal["embedding", "cut_gradient"]
Phase = Literal["train", "eval"]


def passive_name(index: int) -> str:
    """Name of the ``index``-th passive party (1-based, as in the papers' P_1..P_{K-1})."""
    return f"passive_{index}"


@dataclass(frozen=True)
class Message:
    """One tensor sent from one party to another.

    ``ids`` are the aligned sample ids of the batch (known to every party in VFL after
    private set intersection); ``payload`` is detached from the sender's autograd graph.
    """

    kind: MessageKind
    sender: str
    receiver: str
    payload: Tensor
    ids: Tensor
    epoch: int
    step: int
    phase: Phase = "train"

    @property
    def nbytes(self) -> int:
        """Bytes of the payload as it would travel on a wire."""
        return self.payload.numel() * self.payload.element_size()
