"""Privacy-utility scores: Kang et al.'s score table, PU score and optimal PU score, and
VFLAIR's DCS family with the attack's prior (not 0) as the ideal attack performance.

All leakages and utility losses are in points (percentage points of AUC or accuracy), as in
Kang et al.'s tables: ε_p = attack value − prior, ε_u = utility without defense − with it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

#: Kang et al. Table 8: (score, upper bound of ε_p, upper bound of ε_u); above the last bounds: 0.
KANG_SCORE_TABLE: tuple[tuple[int, float, float], ...] = (
    (5, 5.0, 0.5),
    (4, 10.0, 1.0),
    (3, 15.0, 2.0),
    (2, 20.0, 4.0),
    (1, 25.0, 6.0),
)


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


def optimal_pu_score(points: Iterable[tuple[float | None, float, Mapping[str, float]]],
                     table: ScoreTable = ScoreTable()) -> OptimalPU:
    """Kang eq. 22: max over strengths v of PU(max over attacks of ε_p(K, v), ε_u(v)).

    ``points`` are ``(strength, utility_loss, {attack: leakage})``; ties keep the first point.
    """
    best: OptimalPU | None = None
    for strength, loss, leakages in points:
        worst = max(leakages.values()) if leakages else 0.0
        score = pu_score(worst, loss, table)
        if best is None or score > best.score:
            best = OptimalPU(score, strength, loss, dict(leakages))
    if best is None:
        raise ValueError("optimal_pu_score needs at least one point")
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
