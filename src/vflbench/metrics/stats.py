"""Confidence intervals for leakages measured over seeds (training randomness) and repeats (attack
randomness on one trained model).

A leakage is measured ``R`` times (repeats, independent attack streams) on each of ``S`` trained models
(seeds). Repeats on one model are not independent samples of the model's randomness, so the unit of
independence is the seed: the interval of the mean is a Student-t interval over the per-seed means (each
the mean over its repeats), with ``S − 1`` degrees of freedom. This is exact for a balanced one-way
random-effects design (the variance of the grand mean is ``σ²_seed/S + σ²_repeat/(S·R)``, estimated
without bias by the variance of the per-seed means over ``S``). With a single seed the interval is over
the repeats of that one trained model (``basis = "repeats"``): it says how sure the attack's own
randomness lets us be about *this* model, not about the training. With one seed and one repeat, or
repeats that all agree (a deterministic attack: they measure no randomness), there is no interval
(``basis = "none"``). No interval covers the sampling of the test rows themselves (every seed scores the
same test split).

A difference between a defended and an undefended leakage is paired by seed (same seed: same data split,
same initial weights, same batches), so its interval is the t interval of the per-seed differences; with
one seed it is Welch's interval over the two sets of repeats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from scipy import stats

Basis = Literal["seeds", "repeats", "none"]
CONFIDENCE = 0.95  #: the default level of every interval vflbench reports


@dataclass(frozen=True)
class Interval:
    """A mean with its two-sided confidence interval (``low``/``high`` are NaN without one).

    ``basis``: what the interval is over (``"seeds"``: per-seed means; ``"repeats"``: the repeats of one
    seed; ``"none"``: a single measurement). ``seeds`` and ``repeats``: how many went in (repeats per seed,
    the smallest when they differ).
    """

    mean: float
    low: float
    high: float
    basis: Basis
    seeds: int
    repeats: int
    confidence: float = CONFIDENCE

    @property
    def defined(self) -> bool:
        """Whether there is an interval (not only a point)."""
        return not (math.isnan(self.low) or math.isnan(self.high))

    def above(self, value: float = 0.0) -> bool:
        """Whether the whole interval lies above ``value`` (False without an interval)."""
        return self.defined and self.low > value

    def below(self, value: float = 0.0) -> bool:
        """Whether the whole interval lies below ``value`` (False without an interval)."""
        return self.defined and self.high < value


def _t_interval(values: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """Mean and Student-t interval of ``values`` (NaN bounds for fewer than two values)."""
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, math.nan, math.nan
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * math.sqrt(var / n)
    return mean, mean - half, mean + half


def _finite(per_seed: Mapping[int, Sequence[float]]) -> dict[int, list[float]]:
    return {
        s: [float(v) for v in vs if not math.isnan(float(v))]
        for s, vs in per_seed.items()
        if any(not math.isnan(float(v)) for v in vs)
    }


def mean_interval(per_seed: Mapping[int, Sequence[float]], confidence: float = CONFIDENCE) -> Interval:
    """The mean of measurements grouped by seed and its interval (module docstring); NaNs are ignored.

    ``per_seed``: seed -> the leakage of each repeat on that seed's trained model.
    """
    groups = _finite(per_seed)
    if not groups:
        return Interval(math.nan, math.nan, math.nan, "none", 0, 0, confidence)
    repeats = min(len(v) for v in groups.values())
    if len(groups) >= 2:
        means = [math.fsum(v) / len(v) for v in groups.values()]
        mean, low, high = _t_interval(means, confidence)
        return Interval(mean, low, high, "seeds", len(groups), repeats, confidence)
    (values,) = groups.values()
    if len(set(values)) < 2:  # one measurement, or a deterministic attack: the repeats measure no randomness
        return Interval(values[0], math.nan, math.nan, "none", 1, len(values), confidence)
    mean, low, high = _t_interval(values, confidence)
    return Interval(mean, low, high, "repeats", 1, len(values), confidence)


def difference_interval(
    treated: Mapping[int, Sequence[float]], control: Mapping[int, Sequence[float]], confidence: float = CONFIDENCE
) -> Interval:
    """The mean of ``treated − control`` and its interval, paired by seed (module docstring).

    Only seeds present in both count. With one common seed, Welch's interval over the two sets of
    repeats (``basis = "repeats"``); NaN bounds when either side has a single repeat.
    """
    a, b = _finite(treated), _finite(control)
    common = sorted(set(a) & set(b))
    if not common:
        return Interval(math.nan, math.nan, math.nan, "none", 0, 0, confidence)
    repeats = min(min(len(a[s]), len(b[s])) for s in common)
    if len(common) >= 2:
        diffs = [math.fsum(a[s]) / len(a[s]) - math.fsum(b[s]) / len(b[s]) for s in common]
        mean, low, high = _t_interval(diffs, confidence)
        return Interval(mean, low, high, "seeds", len(common), repeats, confidence)
    x, y = a[common[0]], b[common[0]]
    mean = math.fsum(x) / len(x) - math.fsum(y) / len(y)
    if len(x) < 2 or len(y) < 2:
        return Interval(mean, math.nan, math.nan, "none", 1, repeats, confidence)
    vx = math.fsum((v - math.fsum(x) / len(x)) ** 2 for v in x) / (len(x) - 1) / len(x)
    vy = math.fsum((v - math.fsum(y) / len(y)) ** 2 for v in y) / (len(y) - 1) / len(y)
    se = math.sqrt(vx + vy)
    if se == 0.0:  # deterministic on both sides: the repeats measure no randomness
        return Interval(mean, math.nan, math.nan, "none", 1, repeats, confidence)
    df = (vx + vy) ** 2 / ((vx**2 / (len(x) - 1) if vx else 0.0) + (vy**2 / (len(y) - 1) if vy else 0.0))
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se
    return Interval(mean, mean - half, mean + half, "repeats", 1, repeats, confidence)
