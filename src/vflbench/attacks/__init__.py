"""Attacks: the registry, compatibility checks, and running attacks on a trained run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vflbench.registry import Registry

if TYPE_CHECKING:
    from vflbench.config import ExperimentConfig
    from vflbench.data import VerticalData
    from vflbench.eval.results import AttackResult
    from vflbench.eval.run import TrainedRun

ATTACKS: Registry[Any] = Registry("attack")


@dataclass
class AttackPlan:
    """Validated attacks of a config and what each party's transcript must retain."""

    attacks: list[Any] = field(default_factory=list)
    keep: dict[str, set[str]] = field(default_factory=dict)


def validate_attacks(cfg: ExperimentConfig, vd: VerticalData) -> AttackPlan:
    """Check every configured attack against the scenario before any training."""
    for spec in cfg.attacks:
        ATTACKS.get(spec.name)
    return AttackPlan()


def run_attacks(plan: AttackPlan, run: TrainedRun) -> tuple[list[AttackResult], dict[str, float]]:
    """Run the planned attacks on a trained run."""
    return [], {}
