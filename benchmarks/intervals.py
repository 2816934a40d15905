"""Formatting a mean with its interval for the reproduction tables (``mean [low, high]``)."""

from __future__ import annotations

from vflbench.metrics.stats import Interval


def show(interval: Interval, sign: str = "", digits: int = 2, missing: str = "–") -> str:
    """``mean [low, high]`` with ``digits`` decimals (just the mean without an interval; ``missing`` without a
    value); ``sign="+"`` signs them."""
    if interval.seeds == 0:
        return missing
    spec = f"{sign}.{digits}f"
    if not interval.defined:
        return f"{interval.mean:{spec}}"
    return f"{interval.mean:{spec}} [{interval.low:{spec}}, {interval.high:{spec}}]"
