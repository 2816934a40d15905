"""Every registered attack and defense builds and runs: one epoch on a tiny embedded scenario.

Each component is tried on a few scenarios in order (VHNN on digits, VLR on breast_cancer, VHNN
with three parties); scenarios it declares incompatible (a ``CompatibilityError`` before training)
are skipped, and it must run on at least one of them. An attack that no scenario accepts alone is
run against each defense that names it as an adaptive attack. The run must produce a finite
utility, and an attack a result with a finite value and a direction.
"""

from __future__ import annotations

import math

import pytest

from vflbench.api import make_config, run
from vflbench.attacks import ATTACKS
from vflbench.defenses import DEFENSES
from vflbench.errors import CompatibilityError

pytestmark = pytest.mark.slow

SCENARIOS = [
    {
        "data": {"name": "digits", "parties": 2, "train_size": 240, "test_size": 80, "aux_pool": 60},
        "train": {"algorithm": "vhnn", "epochs": 1, "batch_size": 64, "checkpoint": "none"},
    },
    {
        "data": {"name": "breast_cancer", "parties": 2, "train_size": 240, "test_size": 80, "aux_pool": 60},
        "train": {"algorithm": "vlr", "epochs": 1, "batch_size": 64, "checkpoint": "none"},
    },
    {
        "data": {"name": "digits", "parties": 3, "train_size": 240, "test_size": 80, "aux_pool": 60},
        "train": {"algorithm": "vhnn", "epochs": 1, "batch_size": 64, "checkpoint": "none"},
    },
]
#: Parameters that keep a component's one step small (the rest are its defaults).
SMALL = {
    "paillier_he": {"key_bits": 512},
    "labobf_adaptive_mixmatch": {"epochs": 1, "val_iteration": 8},
    "coae": {"samples": 500, "epochs": 2},
    "model_completion_mixmatch": {"epochs": 1, "val_iteration": 8},
    "embedding_extension": {"known_per_class": 4, "inner_steps": 2, "epochs": 2},
    # a recipe of their own: at their defaults they refuse a training shorter than 25 epochs (issue 25)
    "dmavfl": {"lr": 1e-3},
    "dmavfl_sync": {"lr": 1e-3},
    "fsha": {"lr": 1e-4},
}


def _first_run(defenses: list[dict], attacks: list[dict]):
    refusals = []
    for scenario in SCENARIOS:
        try:
            return run(make_config({**scenario, "defenses": defenses, "attacks": attacks, "seed": 0}))
        except CompatibilityError as exc:
            refusals.append(str(exc))
    raise AssertionError("no scenario accepts it:\n" + "\n".join(refusals))


@pytest.mark.parametrize("name", DEFENSES.names())
def test_every_defense_runs(name):
    result = _first_run([{"name": name, **SMALL.get(name, {})}], [])
    assert math.isfinite(result.utility.value)


@pytest.mark.parametrize("name", ATTACKS.names())
def test_every_attack_runs(name):
    attack = {"name": name, **SMALL.get(name, {})}
    try:
        result = _first_run([], [attack])
    except AssertionError:
        adaptive = [d for d in DEFENSES.names() if name in DEFENSES.get(d).factory.adaptive_attacks]
        if not adaptive:
            raise
        result = _first_run([{"name": adaptive[0], **SMALL.get(adaptive[0], {})}], [attack])
    (outcome,) = result.attacks
    assert outcome.name == name and outcome.direction in ("higher", "lower")
    assert math.isfinite(outcome.value)
