"""Privacy-utility scores: one leakage scale for every attack, Kang et al.'s score table, PU
score and optimal PU score, and VFLAIR's DCS family with the attack's prior (not 0) as the ideal
attack performance.

Every attack's leakage ε_p is in points on one scale where higher always means more leakage
(:func:`leakage_points`): label attacks (AUC, accuracy; higher value = more leakage) leak
``100·(value − prior)`` as in Kang et al.'s Table 7; feature attacks (MSE; lower value = more
leakage) leak ``100·(1 − MSE / MSE_prior)``, the share of the prior guess's error the attack
removes. Utility losses ε_u are in points too: utility without defense − with it.

Kang's score table (Table 8) and PU scores (eq. 21-22) are defined for label leakage only
(§8.3 leaves the feature setting out), so :func:`pu_scorable` says which attack kinds they apply to.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from vflbench.metrics.stats import Interval

#: Kang et al. Table 8: (score, upper bound of ε_p, upper bound of ε_u); above the last bounds: 0.
KANG_SCORE_TABLE: tuple[tuple[int, float, float], ...] = (
    (5, 5.0, 0.5),
    (4, 10.0, 1.0),
    (3, 15.0, 2.0),
    (2, 20.0, 4.0),
    (1, 25.0, 6.0),
)


#: Which direction of each attack metric means more leakage.
DIRECTIONS: Mapping[str, str] = MappingProxyType(
    {"auc": "higher", "accuracy": "higher", "balanced_accuracy": "higher", "mse": "lower", "ssim": "higher"}
)


def direction_of(metric: str) -> str:
    """``"higher"`` when a higher value of ``metric`` means more leakage, ``"lower"`` otherwise."""
    if metric not in DIRECTIONS:
        raise ValueError(f"unknown attack metric {metric!r}; known metrics are: {', '.join(DIRECTIONS)}")
    return DIRECTIONS[metric]


def leakage_points(metric: str, value: float, prior: float) -> float:
    """ε_p in points, higher = more leakage, for every attack metric (see the module docstring).

    Higher-is-leakier metrics (AUC, accuracy, balanced accuracy, SSIM): ``100·(value − prior)``. MSE:
    ``100·(1 − value / prior)``, which is NaN when the prior's error is 0 (a constant slice:
    nothing to reconstruct).
    """
    if direction_of(metric) == "higher":
        return 100.0 * (value - prior)
    return 100.0 * (1.0 - value / prior) if prior > 0 else math.nan


def attack_leakage(attack: Mapping[str, object]) -> float:
    """The leakage in points of one attack of a ``result.json``.

    Results written before leakage had one scale carry no ``direction`` and, for feature attacks,
    a leakage in MSE units: for those it is recomputed from the metric, value and prior.
    """
    if "direction" in attack:
        return float(attack["leakage"])  # type: ignore[arg-type]
    return leakage_points(str(attack["metric"]), float(attack["value"]), float(attack["prior"]))  # type: ignore[arg-type]


def leaks(interval: Interval | None) -> bool | None:
    """Whether an attack leaks without a defense: the whole confidence interval of its undefended leakage
    lies above 0 points (:mod:`vflbench.metrics.stats`). ``False`` when the interval reaches 0 or below
    (no measurable leakage: no defense can be credited for stopping it); ``None`` when there is no interval
    (one seed and one repeat, or a deterministic attack on one seed): unknown."""
    if interval is None or not interval.defined:
        return None
    return interval.above(0.0)


def pu_scorable(target: str, metric: str) -> str | None:
    """``None`` when Kang's score table applies to an attack, otherwise the reason it does not."""
    if target != "labels" or direction_of(metric) != "higher":
        return (
            "not defined for feature attacks: Kang's score table (Table 8) and PU scores (eq. 21-22) "
            "apply to label leakage only (§8.3)"
        )
    return None


@dataclass(frozen=True)
class ScoreTable:
    """A score table: score s applies while a value is at most the bound of s (first match)."""

    rows: tuple[tuple[int, float, float], ...] = KANG_SCORE_TABLE

    def privacy(self, leakage: float) -> int:
        """Score of a privacy leakage ε_p (Kang Table 8, left column)."""
        return self._score(leakage, 1)

    def utility(self, loss: float) -> int:
        """Score of a utility loss ε_u (Kang Table 8, right column)."""
        return self._score(loss, 2)

    def _score(self, value: float, column: int) -> int:
        value = max(value, 0.0)
        for row in self.rows:
            if value <= row[column] + 1e-9:
                return row[0]
        return 0


def pu_score(leakage: float, utility_loss: float, table: ScoreTable = ScoreTable()) -> int:
    """Kang eq. 21: the smaller of the privacy and utility scores."""
    return min(table.privacy(leakage), table.utility(utility_loss))


@dataclass(frozen=True)
class OptimalPU:
    """Kang eq. 22 result: the best strength, its score, and the values behind it."""

    score: int
    strength: float | None
    utility_loss: float
    leakages: dict[str, float]


#: S*_PU of the run without protection. Kang et al. report 0 for every "No Protect" row of Tables
#: 10-14, also where eq. 21 gives more (Table 11 Credit: max ε_p 18.1 -> 2; Table 12 Credit: 21.8 -> 1):
#: a model without protection earns no protection score. (Table 15 applies eq. 21 to its "No Protect"
#: rows instead; we follow the convention of the five other tables, see docs/decisions/evaluation.md.)
NO_PROTECTION_SCORE = 0


def optimal_pu_score(
    points: Iterable[tuple[float | None, float, Mapping[str, float]]],
    table: ScoreTable = ScoreTable(),
    *,
    no_protection: bool = False,
) -> OptimalPU:
    """Kang eq. 22: max over strengths v of PU(max over attacks of ε_p(K, v), ε_u(v)).

    ``points`` are ``(strength, utility_loss, {attack: leakage})``; ties keep the first point. A
    strength without any attack result has no privacy score (it is not a leakage of 0).
    ``no_protection``: the points are the run without any defense, scored
    :data:`NO_PROTECTION_SCORE` by Kang's convention (the leakages and utility loss are kept).
    """
    best: OptimalPU | None = None
    for strength, loss, leakages in points:
        if not leakages:
            raise ValueError(
                f"optimal_pu_score: strength {strength} has no attack results; "
                "eq. 22 needs at least one attack's leakage per strength"
            )
        worst = max(leakages.values())
        score = pu_score(worst, loss, table)
        if best is None or score > best.score:
            best = OptimalPU(score, strength, loss, dict(leakages))
    if best is None:
        raise ValueError("optimal_pu_score needs at least one point")
    if no_protection:
        return OptimalPU(NO_PROTECTION_SCORE, best.strength, best.utility_loss, best.leakages)
    return best


def dcs(main: float, attack: float, *, main_ideal: float, attack_ideal: float, beta: float = 0.5) -> float:
    """VFLAIR's defense capability score with the ideal attack performance set to the prior.

    DCS = 1 / (1 + sqrt((1-β)·max(AP − AP*, 0)² + β·max(MP* − MP, 0)²)), values in [0, 1];
    AP* is the attack's prior (random guess, scratch or local model), MP* the undefended utility.
    """
    d_ap = max(attack - attack_ideal, 0.0)
    d_mp = max(main_ideal - main, 0.0)
    return 1.0 / (1.0 + math.sqrt((1 - beta) * d_ap**2 + beta * d_mp**2))


def type_dcs(values: Sequence[float]) -> float:
    """T-DCS: the mean DCS over the attacks of one type."""
    return float(sum(values) / len(values)) if values else float("nan")


def comprehensive_dcs(by_type: Mapping[str, float], weights: Mapping[str, float] | None = None) -> float:
    """C-DCS: the (weighted) mean of the available T-DCS values."""
    items = [(k, v) for k, v in by_type.items() if not math.isnan(v)]
    if not items:
        return float("nan")
    w = {k: (weights or {}).get(k, 1.0) for k, _ in items}
    return sum(w[k] * v for k, v in items) / sum(w.values())


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated in (utility loss, leakage), both to be minimised."""
    front = []
    for i, (u, p) in enumerate(points):
        dominated = any((u2 <= u and p2 <= p) and (u2 < u or p2 < p) for j, (u2, p2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])
