"""Messages exchanged between parties.

A message is data only: a kind, its sender and receiver, tensors, the aligned row ids of the
batch it belongs to, its position in training (epoch, step, phase) and a small header of scalars
(``meta``). Nothing in it refers to a live object of another party, so the same messages can
cross a process or machine boundary as bytes (tensors as raw buffers, the rest as a header).

Kinds: the loop's own ``embedding`` and ``cut_gradient``; protocol messages of a defense's
halves are namespaced ``<defense>.<what>`` (e.g. ``vmask.open``); every kind is counted by the
channel under its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from torch import Tensor

ACTIVE = "active"
#: The role of every passive party (named ``passive_1``, ``passive_2``, ...), e.g. as a key of ``Defense.halves()``.
PASSIVE = "passive"
#: The trusted dealer of VMask's Beaver triples (never the active party).
DEALER = "dealer"
MessageKind = str
Phase = Literal["train", "eval", "setup"]
Role = Literal["send", "request", "reply"]
Scalar = int | float | str | bool | None
NO_IDS = torch.empty(0, dtype=torch.long)


def passive_name(index: int) -> str:
    """Name of the ``index``-th passive party (1-based, as in the papers' P_1..P_{K-1})."""
    return f"passive_{index}"


def passive_names(count: int) -> list[str]:
    """The names of ``count`` passive parties, ``passive_1`` first."""
    return [passive_name(i + 1) for i in range(count)]


def passive_index(name: str) -> int:
    """0-based index of passive party ``passive_<k>`` (the inverse of :func:`passive_name`)."""
    return int(name.removeprefix("passive_")) - 1


@dataclass(frozen=True)
class Message:
    """Tensors sent from one party to another.

    ``ids`` are the aligned sample ids of the batch (known to every party in VFL after
    private set intersection); ``payload`` (and ``extra``) are detached from the sender's
    autograd graph. ``meta``: header scalars of a protocol message (a layer index, a triple
    id, a scale). ``role``: a one-way message, or a request and its reply.
    """

    kind: MessageKind
    sender: str
    receiver: str
    payload: Tensor
    ids: Tensor = NO_IDS
    epoch: int = -1
    step: int = -1
    phase: Phase = "train"
    extra: tuple[Tensor, ...] = ()
    meta: Mapping[str, Scalar] = field(default_factory=dict)
    role: Role = "send"

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        """Every tensor the message carries, payload first."""
        return (self.payload, *self.extra)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors as they would travel on a wire (headers not counted)."""
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def reply(self, *tensors: Tensor, meta: Mapping[str, Scalar] | None = None) -> Message:
        """The answer to this request: same kind and position, sender and receiver swapped."""
        first, *rest = tensors or (torch.empty(0),)
        return replace(
            self,
            sender=self.receiver,
            receiver=self.sender,
            payload=first,
            extra=tuple(rest),
            meta=dict(meta or {}),
            role="reply",
        )
