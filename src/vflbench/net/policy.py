"""Who may send which kinds of message to whom: the protocol's whole surface, kind by kind, checked on every frame.

A party's role follows from its name: ``active``, ``dealer`` or ``passive_<k>``
(:func:`role_of`). Its name comes from its TLS certificate, so the role a peer plays is fixed by
the certificate it was given -- the party holding the ``active`` certificate can never act as
the dealer, and the dealer can only answer requests.

:data:`SURFACE` lists the training loop's kinds and :func:`run_surface` adds the kinds each configured defense
declares (:attr:`~vflbench.protocol.hooks.Defense.surface`); every kind is exact (no wildcards): the one-way
messages each role sends, and the requests each role answers (``server``) for which other role (``client``). A role
serves exactly the requests listed with it as the server, and nothing else. The loop's:

==========  =======================================================================  ==========
server      requests it answers                                                      client
==========  =======================================================================  ==========
passive     ``passive.forward``, ``passive.backward``, ``passive.end_epoch``,         active
            ``passive.checkpoint``, ``passive.resume``
passive     ``passive.oracle_bottom`` -- evaluation only, when the plan grants it     active
active      ``vmask.oracle`` -- evaluation only, when the plan grants it              passive
==========  =======================================================================  ==========

One-way messages: ``embedding``, ``passive.ready`` and ``passive.report`` (passive -> active); ``cut_gradient``,
``passive.setup`` and ``passive.done`` (active -> passive). The ``passive.*`` kinds drive a passive party in its own
process (``vflbench party run``). The defenses' (each only in a run that configures it): VMask's ``vmask.*`` requests
to the active party, ``vmask.select`` to a passive party and ``dealer.*`` requests to its dealer (which only
answers); Paillier's ``paillier.*`` requests to the key holder; Gradient Scrutinizer's ``gradient_scrutinizer.labels``
(active -> passive).

An evaluation-only request (:data:`~vflbench.protocol.grants.EVALUATION_ONLY`) passes only between the two parties
of a :class:`~vflbench.protocol.grants.Grant` the policy holds (:meth:`Policy.with_grants`): the run's plan grants
it when an attack's scoring needs it, and the serving party may refuse it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

from vflbench.errors import ConfigError
from vflbench.net.errors import ProtocolError
from vflbench.protocol.grants import EVALUATION_ONLY, Grant
from vflbench.protocol.messages import ACTIVE, DEALER
from vflbench.protocol.surface import Rule, requests, sends

ROLES = ("active", "passive", "dealer")
_PASSIVE = re.compile(r"passive_[1-9][0-9]*\Z")
ALL = frozenset({"send", "request", "reply"})
__all__ = ["ALL", "DEFAULT_RULES", "ROLES", "SURFACE", "Policy", "Rule", "requests", "role_of", "run_surface", "sends"]


def role_of(name: str) -> str:
    """The role of the party called ``name``: ``active``, ``dealer`` or ``passive`` (``passive_<k>``, k >= 1)."""
    if name == ACTIVE:
        return "active"
    if name == DEALER:
        return "dealer"
    if _PASSIVE.match(name):
        return "passive"
    raise ConfigError(
        f"{name!r} is not a party name; valid names are {ACTIVE!r}, {DEALER!r} and 'passive_<k>' (k = 1, 2, ...)"
    )


REMOTE_PASSIVE_REQUESTS = (
    "passive.forward",
    "passive.backward",
    "passive.end_epoch",
    "passive.checkpoint",
    "passive.resume",
)

#: The training loop's surface (see the module docstring); a run's policy adds its defenses' declared kinds.
SURFACE: tuple[Rule, ...] = (
    # the training loop's one-way messages
    *sends(("embedding",), "passive", "active"),
    *sends(("cut_gradient",), "active", "passive"),
    # a passive party in its own process, driven by the active party
    *sends(("passive.setup", "passive.done"), "active", "passive"),
    *sends(("passive.ready", "passive.report"), "passive", "active"),
    *requests(REMOTE_PASSIVE_REQUESTS, "active", "passive"),
    # evaluation only: the scorer's ground truth, when the run's plan grants it
    *requests(("passive.oracle_bottom",), "active", "passive", granted=True),
    *requests(("vmask.oracle",), "passive", "active", granted=True),
)


def run_surface(declared: Iterable[Rule]) -> tuple[Rule, ...]:
    """The surface of a run: the loop's (:data:`SURFACE`) and, after it, the ``declared`` rules of its defenses,
    each once."""
    return tuple(dict.fromkeys((*SURFACE, *declared)))


#: The protocol's table (the same as :data:`SURFACE`).
DEFAULT_RULES = SURFACE


class Policy:
    """The table a party checks every frame against (sent and received), and the grants of the run."""

    def __init__(self, rules: Iterable[Rule] = SURFACE, grants: Iterable[Grant] = ()) -> None:
        self.rules = tuple(rules)
        self.grants = frozenset(grants)
        for rule in self.rules:
            for role in (rule.sender, rule.receiver):
                if role not in ROLES:
                    raise ConfigError(f"policy rule {rule}: {role!r} is not a role; valid roles are {', '.join(ROLES)}")
            if rule.granted and rule.kind not in EVALUATION_ONLY:
                raise ConfigError(
                    f"policy rule {rule}: only evaluation-only kinds ({', '.join(EVALUATION_ONLY)}) need a grant"
                )
        for grant in self.grants:
            if not any(
                r.granted
                and r.kind == grant.kind
                and r.sender == role_of(grant.client)
                and r.receiver == role_of(grant.server)
                and "request" in r.roles
                for r in self.rules
            ):
                raise ConfigError(f"no rule of this policy lets {grant.describe()} pass")

    def with_grants(self, grants: Iterable[Grant]) -> Policy:
        """The same table with ``grants`` (replacing this policy's)."""
        return Policy(self.rules, grants)

    def serves(self, name: str) -> list[str]:
        """The request kinds a party called ``name`` answers (evaluation-only ones only where granted to it)."""
        role = role_of(name)
        kinds = []
        for r in self.rules:
            if r.receiver != role or "request" not in r.roles or r.kind in kinds:
                continue
            if r.granted and not any(g.kind == r.kind and g.server == name for g in self.grants):
                continue
            kinds.append(r.kind)
        return kinds

    def allowed(self, sender: str) -> list[str]:
        """What a party named ``sender`` may send, one line per receiver and message role."""
        role = role_of(sender)
        groups: dict[tuple[str, str], list[str]] = {}
        for r in self.rules:
            if r.sender != role:
                continue
            for how in sorted(r.roles):
                if r.granted and not any(
                    g.kind == r.kind and sender == (g.client if how == "request" else g.server) for g in self.grants
                ):
                    continue
                groups.setdefault((r.receiver, how), []).append(r.kind)
        plural = {"send": "messages", "request": "requests", "reply": "replies"}
        return [f"{plural[how]} to {receiver}: {', '.join(kinds)}" for (receiver, how), kinds in groups.items()]

    def check(self, kind: str, sender: str, receiver: str, role: str) -> None:
        """Refuse (:class:`ProtocolError`) a ``role`` message of ``kind`` from ``sender`` to ``receiver`` that no
        rule allows, or an evaluation-only one that no grant covers; the error names the sender, the kind and what
        the sender may send."""
        s, r = role_of(sender), role_of(receiver)
        rules = [rule for rule in self.rules if rule.matches(kind, s, r, role)]
        if rules and not all(rule.granted for rule in rules):
            return
        if rules:
            server, client = (receiver, sender) if role == "request" else (sender, receiver)
            if any(g.kind == kind and g.server == server and g.client == client for g in self.grants):
                return
            held = (
                "; this run grants only " + ", ".join(sorted(g.describe() for g in self.grants))
                if self.grants
                else "; this run grants none"
            )
            raise ProtocolError(
                f"{sender} ({s}) may not send {kind!r} as a {role} to {receiver} ({r}): it is an "
                f"evaluation-only query of {EVALUATION_ONLY[kind]}, which {server} answers for "
                f"{client} only when the run's plan grants it{held}"
            )
        allowed = self.allowed(sender)
        raise ProtocolError(
            f"{sender} ({s}) may not send {kind!r} as a {role} to {receiver} ({r}); a {s} party "
            f"may send: {'; '.join(allowed) if allowed else 'nothing'}"
        )

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
