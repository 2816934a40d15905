"""Attacks: the API, the registry, and the runner that scores them."""

from vflbench.attacks.base import (
    Attack,
    BatchRecord,
    KnownLabels,
    LabelInference,
    PartyView,
    Scenario,
    Scores,
)
from vflbench.attacks.runner import ATTACKS, AttackPlan, create_attack, run_attacks, scenario_of, validate_attacks

__all__ = ["ATTACKS", "Attack", "AttackPlan", "BatchRecord", "KnownLabels", "LabelInference", "PartyView",
           "Scenario", "Scores", "create_attack", "run_attacks", "scenario_of", "validate_attacks"]

from vflbench.attacks.label import active, gradient, mixmatch, model_completion  # noqa: E402,F401  (register)
