"""Every config shipped under configs/ loads, expands and builds its defenses and attacks, so a
renamed parameter cannot leave a reproduction config broken until someone runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from vflbench.attacks.registry import create_attack
from vflbench.defenses import create_defense
from vflbench.experiment.config import load_config
from vflbench.experiment.sweep import expand

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml"))


def test_configs_are_shipped():
    assert len(CONFIGS) >= 30


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_shipped_config_builds(path):
    cfg = load_config(path)
    for point in expand(cfg) if cfg.sweep else [cfg]:
        point = getattr(point, "config", point)
        for spec in point.defenses:
            create_defense(spec.name, **spec.params())
        for spec in point.attacks:
            create_attack(spec.name, **spec.params())
