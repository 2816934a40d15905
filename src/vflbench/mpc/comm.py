"""Communication accounting for the simulated two-party protocol.

Every ring tensor that crosses between the passive party P_k (party 0) and the active party P_K
(party 1) goes through :meth:`Comm.send`: shares handed over, masked values opened in Beaver
multiplication, output shares sent for reconstruction. Each call is one message (one round in
that direction); elements are int64 ring elements, 8 bytes each. Messages to and from the
trusted dealer are not counted here (the dealer keeps its own :attr:`Dealer.issued` counts).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

from torch import Tensor

Direction = Literal["passive_to_active", "active_to_passive"]
DIRECTIONS: tuple[Direction, Direction] = ("passive_to_active", "active_to_passive")
BYTES_PER_ELEMENT = 8

_FROM_PARTY: dict[int, Direction] = {0: "passive_to_active", 1: "active_to_passive"}


def direction_from(party: int) -> Direction:
    """The direction of a message sent by ``party`` (0 = passive, 1 = active)."""
    return _FROM_PARTY[party]


class Comm:
    """Counts elements, bytes and rounds (messages) per direction, with a per-tag breakdown."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Zero all counters."""
        self.elements: dict[str, int] = dict.fromkeys(DIRECTIONS, 0)
        self.rounds: dict[str, int] = dict.fromkeys(DIRECTIONS, 0)
        self.by_tag: dict[str, dict[str, int]] = {d: defaultdict(int) for d in DIRECTIONS}

    def send(self, direction: Direction, *payload: Tensor | int, tag: str = "") -> None:
        """Record one message carrying ``payload`` (tensors, or element counts) in ``direction``."""
        if direction not in self.elements:
            raise ValueError(f"unknown direction {direction!r}; valid: {', '.join(DIRECTIONS)}")
        n = sum(int(p.numel()) if isinstance(p, Tensor) else int(p) for p in payload)
        self.elements[direction] += n
        self.rounds[direction] += 1
        self.by_tag[direction][tag] += n

    def exchange(self, payload0: tuple[Tensor | int, ...], payload1: tuple[Tensor | int, ...], *, tag: str) -> None:
        """A simultaneous exchange (one round each way): party 0 sends ``payload0``, party 1 ``payload1``."""
        self.send("passive_to_active", *payload0, tag=tag)
        self.send("active_to_passive", *payload1, tag=tag)

    def bytes(self, direction: Direction) -> int:
        """Bytes sent in ``direction`` (8 per ring element)."""
        return self.elements[direction] * BYTES_PER_ELEMENT

    def snapshot(self) -> dict[str, dict[str, int] | dict[str, dict[str, int]]]:
        """A plain-dict copy of the counters: per direction elements, bytes, rounds and per-tag elements."""
        out: dict[str, dict] = {}
        for d in DIRECTIONS:
            out[d] = {
                "elements": self.elements[d],
                "bytes": self.bytes(d),
                "rounds": self.rounds[d],
                "by_tag": dict(self.by_tag[d]),
            }
        return out

    def as_result(self) -> dict[str, int]:
        """The results-contract ``comm`` fields: messages, bytes_up (passive->active), bytes_down."""
        return {
            "messages": sum(self.rounds.values()),
            "bytes_up": self.bytes("passive_to_active"),
            "bytes_down": self.bytes("active_to_passive"),
        }
