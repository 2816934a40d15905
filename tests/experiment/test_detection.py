"""Detectors in sweeps: both rates over seeds with intervals, and a verdict that names both."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from conftest import minimal

from vflbench.experiment import detection
from vflbench.experiment.config import build_config
from vflbench.experiment.sweep import run_sweep
from vflbench.metrics.stats import Interval
from vflbench.report import build_report


def _summary(groups: dict[str, tuple[list[float], list[float]]]) -> pd.DataFrame:
    """A summary.csv with one detector (``sg``): per group (the defense's label) the detection and false-alarm rate
    of each seed's run, every run on two rows (two attacks)."""
    rows = []
    for defense, (detected, honest) in groups.items():
        for seed, (d, h) in enumerate(zip(detected, honest, strict=True)):
            for attack in ("dmavfl", "model_completion"):
                rows.append(
                    {
                        "dataset": "digits",
                        "algorithm": "vhnn",
                        "setting": "",
                        "defense": defense,
                        "strength": math.nan,
                        "seed": seed,
                        "config_hash": f"{defense}{seed}",
                        "confidence": 0.95,
                        "attack": attack,
                        "detection_rate.sg": d,
                        "false_alarm_rate.sg": h,
                        "detected_attacks.sg": "dmavfl",
                    }
                )
    return pd.DataFrame(rows)


def test_verdicts_name_both_rates_and_say_whether_the_detector_detects_anything():
    table = _summary(
        {
            "works": ([0.95, 1.0, 0.9], [0.0, 0.05, 0.0]),
            "blind": ([0.1, 0.0, 0.2], [0.3, 0.2, 0.25]),  # flags honest training more than the attack
            "unsure": ([0.9, 0.1, 0.5], [0.1, 0.5, 0.2]),
            "one_seed": ([0.8], [0.1]),
        }
    )
    detection.group_statistics(table)
    frame = detection.frame(table).set_index("defense")
    assert frame.loc["works", "seeds"] == 3  # one value per run, not per attack row
    assert frame.loc["works", "detection_rate_mean"] == pytest.approx(0.95)
    assert frame.loc["works", "false_alarm_rate_mean"] == pytest.approx(0.05 / 3)
    assert frame.loc["works", "false_alarm_rate_ci_low"] == 0.0  # a rate's interval is clipped to [0, 1]
    verdicts = frame["detector_verdict"]
    assert verdicts["works"].startswith("flags dmavfl at 95.0% [") and "honest training at 1.7% [" in verdicts["works"]
    assert verdicts["works"].split(": ", 1)[1].startswith("detects it")
    assert "detects nothing" in verdicts["blind"]
    assert "no measurable detection" in verdicts["unsure"] and "reaches 0" in verdicts["unsure"]
    assert verdicts["one_seed"].endswith("(one seed: no interval; run more seeds for a verdict)")
    assert "80.0%" in verdicts["one_seed"] and "10.0%" in verdicts["one_seed"]
    texts = detection.scores_column(table)
    assert texts[("digits", "vhnn", "", "blind")].startswith("sg: flags dmavfl at 10.0%")


def test_a_run_without_an_attack_gives_only_the_false_alarm_rate():
    interval = Interval(0.25, 0.1, 0.4, "seeds", 3, 1)
    nan = Interval(math.nan, math.nan, math.nan, "none", 0, 0)
    assert detection.verdict("dmavfl", nan, interval, None).startswith("flags honest training at 25.0% [10.0, 40.0]")
    columns = detection.run_columns(
        [
            {
                "name": "splitguard",
                "details": {"decisions": 10, "flagged": 2},
                "honest_reference": {"same_run": True, "decisions": 10, "flagged": 2, "without": []},
            },
            {"name": "embedding_noise", "params": {}},
        ]
    )
    assert math.isnan(columns["detection_rate.splitguard"]) and columns["false_alarm_rate.splitguard"] == 0.2
    assert not any("embedding_noise" in key for key in columns)


def test_a_sweep_reports_both_rates_over_seeds_in_summary_scores_and_report(tmp_path):
    cfg = build_config(
        minimal(
            data={"name": "digits", "parties": 2, "aux_pool": 300},
            train={"epochs": 2, "batch_size": 32, "optimizer": "adam", "lr": 1e-3},
            defenses=[{"name": "splitguard", "p_fake": 0.3, "halt": False}],
            attacks=[{"name": "dmavfl", "pretrain_epochs": 1}],
            sweep={"seeds": [0, 1]},
        )
    )
    table = run_sweep(cfg, tmp_path)
    runs = table[table["defense"] == "splitguard"]
    assert len(runs) == 2 and runs["decisions.splitguard"].min() >= 1
    assert (runs["detection_rate.splitguard"] == runs["flagged.splitguard"] / runs["decisions.splitguard"]).all()
    assert (
        runs["false_alarm_rate.splitguard"] == runs["honest_flagged.splitguard"] / runs["honest_decisions.splitguard"]
    ).all()
    assert runs["detector_verdict.splitguard"].nunique() == 1
    verdict = runs["detector_verdict.splitguard"].iloc[0]
    assert verdict.startswith("flags dmavfl at ") and ", honest training at " in verdict
    assert table[table["defense"] == "none"]["false_alarm_rate.splitguard"].isna().all()
    scores = pd.read_csv(tmp_path / "scores.csv").set_index("defense")
    assert scores.loc["splitguard", "detectors"] == f"splitguard: {verdict}"
    report = build_report(tmp_path).read_text()
    assert "## Detectors: detection and false-alarm rates" in report and verdict in report
