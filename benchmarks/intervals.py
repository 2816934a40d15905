"""Formatting a mean with its interval for the reproduction tables (``mean [low, high]``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vflbench.metrics.stats import Interval, mean_interval


def show(interval: Interval, sign: str = "", digits: int = 2, missing: str = "–") -> str:
    """``mean [low, high]`` with ``digits`` decimals (just the mean without an interval; ``missing`` without a
    value); ``sign="+"`` signs them."""
    if interval.seeds == 0:
        return missing
    spec = f"{sign}.{digits}f"
    if not interval.defined:
        return f"{interval.mean:{spec}}"
    return f"{interval.mean:{spec}} [{interval.low:{spec}}, {interval.high:{spec}}]"


def show_mean(per_seed: Mapping[int, Sequence[float]], sign: str = "", digits: int = 2, missing: str = "–") -> str:
    """:func:`show` of the mean over ``per_seed`` (seed -> values) and its interval (:func:`mean_interval`)."""
    return show(mean_interval(per_seed), sign, digits, missing)
