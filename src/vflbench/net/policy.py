"""Who may send which kinds of message to whom: the protocol's table, checked on every frame.

A party's role follows from its name: ``active``, ``dealer`` or ``passive_<k>``
(:func:`role_of`). Its name comes from its TLS certificate, so the role a peer plays is fixed by
the certificate it was given -- the party holding the ``active`` certificate can never act as
the dealer, and the dealer can only answer requests.

=============================  ====================  ======================  ====================
kinds                          from                  to                      as
=============================  ====================  ======================  ====================
``embedding``                  passive               active                  send
``cut_gradient``               active                passive                 send
``gradient_scrutinizer.*``     active                passive                 send
``vmask.*``                    passive and active    each other              send, request, reply
``paillier.*``                 passive and active    each other              send, request, reply
``dealer.*``                   passive, active       dealer                  request
``dealer.*``                   dealer                passive, active         reply
=============================  ====================  ======================  ====================

:data:`vflbench.experiment.party.REMOTE_PASSIVE_RULES` adds the requests with which the active party drives
a passive party in another process (``passive.*``: requests active -> passive, replies back).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from vflbench.errors import ConfigError
from vflbench.net.errors import ProtocolError
from vflbench.protocol.messages import ACTIVE, DEALER

ROLES = ("active", "passive", "dealer")
_PASSIVE = re.compile(r"passive_[1-9][0-9]*\Z")
ALL = frozenset({"send", "request", "reply"})


def role_of(name: str) -> str:
    """The role of the party called ``name``: ``active``, ``dealer`` or ``passive`` (``passive_<k>``, k >= 1)."""
    if name == ACTIVE:
        return "active"
    if name == DEALER:
        return "dealer"
    if _PASSIVE.match(name):
        return "passive"
    raise ConfigError(f"{name!r} is not a party name; valid names are {ACTIVE!r}, {DEALER!r} and 'passive_<k>' "
                      "(k = 1, 2, ...)")


@dataclass(frozen=True)
class Rule:
    """Kinds ``kinds`` (one kind, or a namespace written ``<namespace>.*``) may go from a ``sender``-role party
    to a ``receiver``-role party as the message roles ``roles`` (send, request, reply)."""

    kinds: str
    sender: str
    receiver: str
    roles: frozenset[str] = frozenset({"send"})

    def matches(self, kind: str, sender: str, receiver: str, role: str) -> bool:
        """Whether this rule allows a ``role`` message of ``kind`` from a ``sender``-role to a ``receiver``-role."""
        return (self.sender == sender and self.receiver == receiver and role in self.roles
                and self.covers(kind))

    def covers(self, kind: str) -> bool:
        """Whether ``kind`` is this rule's kind or in its namespace."""
        if self.kinds.endswith(".*"):
            return kind.startswith(self.kinds[:-1])
        return kind == self.kinds

    def describe(self) -> str:
        """E.g. ``vmask.* to active (request, reply, send)``."""
        return f"{self.kinds} to {self.receiver} ({', '.join(sorted(self.roles))})"


def _both(kinds: str) -> tuple[Rule, Rule]:
    return Rule(kinds, "passive", "active", ALL), Rule(kinds, "active", "passive", ALL)


#: The protocol's table (see the module docstring).
DEFAULT_RULES: tuple[Rule, ...] = (
    Rule("embedding", "passive", "active"),
    Rule("cut_gradient", "active", "passive"),
    Rule("gradient_scrutinizer.*", "active", "passive"),
    *_both("vmask.*"),
    *_both("paillier.*"),
    Rule("dealer.*", "passive", "dealer", frozenset({"request"})),
    Rule("dealer.*", "active", "dealer", frozenset({"request"})),
    Rule("dealer.*", "dealer", "passive", frozenset({"reply"})),
    Rule("dealer.*", "dealer", "active", frozenset({"reply"})),
)


class Policy:
    """The table a party checks every frame against (sent and received)."""

    def __init__(self, rules: Iterable[Rule] = DEFAULT_RULES) -> None:
        self.rules = tuple(rules)
        for rule in self.rules:
            for role in (rule.sender, rule.receiver):
                if role not in ROLES:
                    raise ConfigError(f"policy rule {rule}: {role!r} is not a role; valid roles are "
                                      f"{', '.join(ROLES)}")

    def allowed(self, sender: str) -> list[str]:
        """What a party named ``sender`` may send, one line per rule."""
        role = role_of(sender)
        return [r.describe() for r in self.rules if r.sender == role]

    def check(self, kind: str, sender: str, receiver: str, role: str) -> None:
        """Refuse (:class:`ProtocolError`) a ``role`` message of ``kind`` from ``sender`` to ``receiver`` that no
        rule allows; the error names the sender, the kind and what the sender may send."""
        s, r = role_of(sender), role_of(receiver)
        if any(rule.matches(kind, s, r, role) for rule in self.rules):
            return
        allowed = self.allowed(sender)
        raise ProtocolError(f"{sender} ({s}) may not send {kind!r} as a {role} to {receiver} ({r}); a {s} party "
                            f"may send: {'; '.join(allowed) if allowed else 'nothing'}")

    def peers(self, name: str, parties: Collection[str]) -> list[str]:
        """The parties among ``parties`` that ``name`` exchanges any kind of message with (its links)."""
        me = role_of(name)
        out = []
        for other in parties:
            if other == name:
                continue
            them = role_of(other)
            if any((r.sender, r.receiver) in ((me, them), (them, me)) for r in self.rules):
                out.append(other)
        return out
