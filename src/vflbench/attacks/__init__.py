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

from vflbench.attacks.label import active, embedding_extension, gradient, mixmatch, model_completion  # noqa: E402,F401,I001  (register)
from vflbench.attacks.label import vmask_recovery  # noqa: E402,F401,I001  (register)
from vflbench.attacks.feature import agn, dmavfl, fsha  # noqa: E402,F401,I001  (register)
from vflbench.attacks.feature import gia, grna, inversion, pcat, sdar  # noqa: E402,F401,I001  (register)
