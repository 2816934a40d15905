"""Attacks: the API (a party's view in, an inference out) and the registry.

Planning, running and scoring attacks against ground truth is the experiment layer's
(:mod:`vflbench.experiment.plan`, :mod:`vflbench.experiment.scoring`).
"""

from vflbench.attacks.base import (
    Attack,
    BatchRecord,
    FeatureAttack,
    FeatureInference,
    KnownLabels,
    LabelAttack,
    LabelInference,
    PartyView,
    Scenario,
    Scores,
)
from vflbench.attacks.registry import ATTACKS, create_attack

__all__ = [
    "ATTACKS",
    "Attack",
    "BatchRecord",
    "FeatureAttack",
    "FeatureInference",
    "KnownLabels",
    "LabelAttack",
    "LabelInference",
    "PartyView",
    "Scenario",
    "Scores",
    "create_attack",
]

from vflbench.attacks.label import active, embedding_extension, gradient, mixmatch, model_completion  # noqa: F401, I001  (register)
from vflbench.attacks.label import labobf_adaptive  # noqa: F401  (register)
from vflbench.attacks.label import vmask_recovery  # noqa: F401  (register)
from vflbench.attacks.feature import agn, dmavfl, fsha  # noqa: F401  (register)
from vflbench.attacks.feature import gia, grna, inversion, pcat, sdar  # noqa: F401  (register)
