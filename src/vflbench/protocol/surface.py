"""The rules of the protocol's surface: which kind of message may go from a party of one role to a party of another.

The training loop's own kinds are listed in :mod:`vflbench.net.policy`; a defense whose halves exchange messages
declares its own kinds (:attr:`~vflbench.protocol.hooks.Defense.surface`), and a party's process checks every frame
against the loop's kinds plus those of the defenses its run configures.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """Messages of kind ``kind`` (one exact kind) may go from a ``sender``-role party to a ``receiver``-role party as
    the message roles ``roles`` (send, request, reply); ``granted``: only between two parties a grant names."""

    kind: str
    sender: str
    receiver: str
    roles: frozenset[str] = frozenset({"send"})
    granted: bool = False

    def matches(self, kind: str, sender: str, receiver: str, role: str) -> bool:
        """Whether this rule allows a ``role`` message of ``kind`` from a ``sender``-role to a ``receiver``-role."""
        return self.kind == kind and self.sender == sender and self.receiver == receiver and role in self.roles


def sends(kinds: Iterable[str], sender: str, receiver: str) -> tuple[Rule, ...]:
    """One-way messages of ``kinds`` from a ``sender``-role party to a ``receiver``-role party."""
    return tuple(Rule(k, sender, receiver) for k in kinds)


def requests(kinds: Iterable[str], client: str, server: str, *, granted: bool = False) -> tuple[Rule, ...]:
    """Requests of ``kinds`` from a ``client``-role party, answered by a ``server``-role party (the reply goes back);
    ``granted``: evaluation-only requests, allowed only between the parties of a grant."""
    out: list[Rule] = []
    for k in kinds:
        out += [
            Rule(k, client, server, frozenset({"request"}), granted),
            Rule(k, server, client, frozenset({"reply"}), granted),
        ]
    return tuple(out)
