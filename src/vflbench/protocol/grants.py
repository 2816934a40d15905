"""Evaluation-only access to a party's model that a run's plan grants (see docs/deployment-security.md, "Grants").

Scoring an attack sometimes needs ground truth that no party of the protocol has: a feature attack's
diagnostics compare the attacker's shadow model with the victim's real bottom model
(``passive.oracle_bottom``), and VMask weight recovery compares its reconstruction with the masked layer's
true weights, which takes the active party's shares (``vmask.oracle``). Between processes these are requests
that one party (the ``server``) answers for another (the ``client``). They exist only when the run's plan
grants them: a :class:`Grant` names the kind, the two parties and the attacks whose scoring needs it. Every
other evaluation-only request is refused by the network policy, and a granted one can still be refused by
the serving party's own configuration (``vflbench party run --refuse-grants``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The evaluation-only request kinds, each with what its server answers (for messages and docs).
EVALUATION_ONLY: dict[str, str] = {
    "passive.oracle_bottom": "the passive party's bottom model on inputs the scorer chooses",
    "vmask.oracle": "the active party's shares of a VMask-masked layer",
}


@dataclass(frozen=True)
class Grant:
    """``client`` may send ``kind`` (one of :data:`EVALUATION_ONLY`) to ``server``, which answers it, because the
    scoring of the attacks ``purpose`` needs it."""

    kind: str
    server: str
    client: str
    purpose: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in EVALUATION_ONLY:
            raise ValueError(f"{self.kind!r} is not an evaluation-only request; valid: {', '.join(EVALUATION_ONLY)}")

    def describe(self) -> str:
        """E.g. ``passive.oracle_bottom from active to passive_1 (for dmavfl)``."""
        why = f" (for {', '.join(self.purpose)})" if self.purpose else ""
        return f"{self.kind} from {self.client} to {self.server}{why}"

    def as_dict(self, status: str = "granted") -> dict[str, object]:
        """The record ``result.json`` keeps of this grant; ``status``: ``granted`` or who refused it."""
        return {
            "kind": self.kind,
            "server": self.server,
            "client": self.client,
            "for": list(self.purpose),
            "status": status,
        }
