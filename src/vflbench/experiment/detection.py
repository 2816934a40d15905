"""Detectors judged by both rates: how often they flag the attack and how often honest training.

A detector (:class:`~vflbench.defenses.detectors.Detector`) decides at each of its scoring rounds; a run's
``result.json`` gives, per detector entry, the decisions it made and flagged on the run (``details``) and on
honest training of the same scenario (``honest_reference``: the same config without its malicious attacks, same
data, pool and seed). The share of flagged decisions is the *detection rate* on a run with a malicious attack and
the *false-alarm rate* on honest training. A detector that flags honest training as often as the attack detects
nothing, so a verdict names both.

Over seeds each rate is a mean with a Student-t interval over the per-seed rates
(:func:`~vflbench.metrics.stats.mean_interval`, clipped to [0, 1]), and their difference is paired by seed (the
honest reference of seed s is seed s's scenario without the attack). A detector *detects* the attack when the
interval of that difference lies above 0; it *detects nothing* when it flags honest training at least as often as
the attack; in between (the interval reaches 0) the detection is not measurable. One seed gives no interval (the
decisions within one run are far from independent), only the two rates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from vflbench.metrics.stats import CONFIDENCE, Interval, difference_interval, mean_interval

#: summary.csv's per-run columns of detector ``<d>`` (each name followed by ``.<d>``).
RUN_COLUMNS = ("detection_rate", "decisions", "flagged", "false_alarm_rate", "honest_decisions", "honest_flagged")
#: summary.csv's group columns of detector ``<d>`` (over the seeds of its (dataset, algorithm, setting, defense,
#: strength) group).
GROUP_COLUMNS = (
    "detection_rate_mean",
    "detection_rate_ci_low",
    "detection_rate_ci_high",
    "false_alarm_rate_mean",
    "false_alarm_rate_ci_low",
    "false_alarm_rate_ci_high",
    "detector_verdict",
)
#: the keys a detector's numbers are grouped by: one scenario and detector setting, over seeds
KEYS = ["dataset", "algorithm", "setting", "defense", "strength"]


def _rate(numbers: dict[str, Any]) -> float:
    decisions = numbers.get("decisions")
    return float(numbers["flagged"]) / decisions if decisions else math.nan


def run_columns(defense: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """summary.csv's per-run detector columns of one run, from its result's ``defense`` entries
    (:data:`RUN_COLUMNS`, each ``.<detector>``); the detection rate is left empty on a run without a malicious
    attack (it is honest training: its own rate is the false-alarm rate)."""
    out: dict[str, Any] = {}
    for entry in defense:
        reference = entry.get("honest_reference")
        if reference is None:
            continue
        name, own = entry["name"], entry.get("details", {})
        attacked = not reference.get("same_run", False)
        out[f"decisions.{name}"] = own.get("decisions") if attacked else math.nan
        out[f"flagged.{name}"] = own.get("flagged") if attacked else math.nan
        out[f"detection_rate.{name}"] = _rate(own) if attacked else math.nan
        out[f"honest_decisions.{name}"] = reference.get("decisions")
        out[f"honest_flagged.{name}"] = reference.get("flagged")
        out[f"false_alarm_rate.{name}"] = _rate(reference)
        out[f"detected_attacks.{name}"] = "+".join(reference.get("without") or [])
    return out


def detectors_of(table: pd.DataFrame) -> list[str]:
    """The detectors that have columns in ``table`` (summary.csv)."""
    return sorted(c.split(".", 1)[1] for c in table.columns if c.startswith("false_alarm_rate."))


def _clipped(interval: Interval, low: float, high: float) -> Interval:
    """``interval`` with its bounds clipped to ``[low, high]`` (a rate's t interval may reach past 0 or 1)."""
    if not interval.defined:
        return interval
    return Interval(
        interval.mean,
        max(low, interval.low),
        min(high, interval.high),
        interval.basis,
        interval.seeds,
        interval.repeats,
        interval.confidence,
    )


def _percent(interval: Interval) -> str:
    text = f"{100.0 * interval.mean:.1f}%"
    if interval.defined:
        text += f" [{100.0 * interval.low:.1f}, {100.0 * interval.high:.1f}]"
    return text


def verdict(attack: str, detection: Interval, false_alarm: Interval, difference: Interval | None) -> str:
    """ "flags ATTACK at X% of decisions, honest training at Y%", with the intervals and what follows from them."""
    if math.isnan(detection.mean):
        return f"flags honest training at {_percent(false_alarm)} of decisions (no attack in these runs)"
    if math.isnan(false_alarm.mean):
        return f"flags {attack} at {_percent(detection)} of decisions; no decision on honest training, so no verdict"
    text = f"flags {attack} at {_percent(detection)} of decisions, honest training at {_percent(false_alarm)}"
    if detection.mean <= false_alarm.mean:
        return text + ": detects nothing (it flags honest training at least as often as the attack)"
    if difference is not None and difference.defined:
        span = (
            f"{round(100 * difference.confidence)}% interval of the difference "
            f"[{100.0 * difference.low:.1f}, {100.0 * difference.high:.1f}] percentage points"
        )
        if difference.above(0.0):
            return text + f": detects it ({span})"
        return text + f": no measurable detection ({span} reaches 0)"
    return text + " (one seed: no interval; run more seeds for a verdict)"


def group_statistics(table: pd.DataFrame) -> None:
    """Add :data:`GROUP_COLUMNS` of every detector to ``table`` (summary.csv), in place: the rates' means and
    intervals over the seeds of each group (one value per run, whatever its number of attack rows) and the
    verdict (:func:`verdict`)."""
    detectors = detectors_of(table)
    if not detectors or table.empty:
        return
    columns: dict[str, list[Any]] = {f"{c}.{d}": [math.nan] * len(table) for d in detectors for c in GROUP_COLUMNS}
    for d in detectors:
        columns[f"detector_verdict.{d}"] = [""] * len(table)
    confidence = float(table["confidence"].iloc[0]) if "confidence" in table else CONFIDENCE
    for _, group in table.groupby(KEYS, dropna=False):
        runs = group.drop_duplicates("config_hash")
        for d in detectors:
            if runs[f"false_alarm_rate.{d}"].isna().all():
                continue
            detected = {int(s): [float(v)] for s, v in zip(runs["seed"], runs[f"detection_rate.{d}"], strict=True)}
            honest = {int(s): [float(v)] for s, v in zip(runs["seed"], runs[f"false_alarm_rate.{d}"], strict=True)}
            di = _clipped(mean_interval(detected, confidence), 0.0, 1.0)
            fi = _clipped(mean_interval(honest, confidence), 0.0, 1.0)
            diff = _clipped(difference_interval(detected, honest, confidence), -1.0, 1.0)
            names = [str(a) for a in runs[f"detected_attacks.{d}"].dropna().unique() if str(a)]
            values = {
                "detection_rate_mean": di.mean,
                "detection_rate_ci_low": di.low,
                "detection_rate_ci_high": di.high,
                "false_alarm_rate_mean": fi.mean,
                "false_alarm_rate_ci_low": fi.low,
                "false_alarm_rate_ci_high": fi.high,
                "detector_verdict": verdict(" and ".join(names) or "the attack", di, fi, diff),
            }
            for i in group.index:
                for key, value in values.items():
                    columns[f"{key}.{d}"][table.index.get_loc(i)] = value
    for key, column in columns.items():
        table[key] = column


def frame(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, algorithm, setting, defense, strength, detector) of a summary with detector columns:
    seeds, both rates with their intervals (fractions) and the verdict; empty without detectors."""
    rows = []
    for d in detectors_of(table):
        if f"detector_verdict.{d}" not in table:
            continue
        have = table[table[f"false_alarm_rate.{d}"].notna()]
        for key, group in have.groupby(KEYS, dropna=False):
            first = group.iloc[0]
            rows.append(
                {
                    **dict(zip(KEYS, key, strict=True)),
                    "detector": d,
                    "attack": first.get(f"detected_attacks.{d}", ""),
                    "seeds": int(group.drop_duplicates("config_hash")["seed"].nunique()),
                    **{c: first[f"{c}.{d}"] for c in GROUP_COLUMNS},
                }
            )
    return pd.DataFrame(rows)


def scores_column(table: pd.DataFrame) -> dict[tuple[Any, ...], str]:
    """scores.csv's ``detectors`` text per (dataset, algorithm, setting, defense): each detector's verdict at each
    strength, ``"<detector> (<strength>): <verdict>"`` joined by ``"; "``."""
    out: dict[tuple[Any, ...], list[str]] = {}
    rows = frame(table)
    for _, r in rows.iterrows():
        where = "" if pd.isna(r["strength"]) else f" at {float(r['strength']):g}"
        out.setdefault((r["dataset"], r["algorithm"], r["setting"], r["defense"]), []).append(
            f"{r['detector']}{where}: {r['detector_verdict']}"
        )
    return {k: "; ".join(v) for k, v in out.items()}
