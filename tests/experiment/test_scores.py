"""Scores reproduce rows of Kang et al.'s Tables 10-12 from their ε_p / ε_u values; leakage has
one unit and direction for every attack; scores are left empty (with the reason) where undefined."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from vflbench.experiment.sweep import scores_table
from vflbench.metrics.scores import (
    ScoreTable,
    attack_leakage,
    dcs,
    direction_of,
    leakage_points,
    optimal_pu_score,
    pareto_front,
    pu_scorable,
    pu_score,
)


@pytest.mark.parametrize(
    ("value", "privacy", "utility"),
    [
        (0.0, 5, 5),
        (0.5, 5, 5),
        (0.8, 5, 4),
        (2.2, 5, 2),
        (5.0, 5, 1),
        (6.2, 4, 0),
        (10.1, 3, 0),
        (18.1, 2, 0),
        (21.8, 1, 0),
        (46.9, 0, 0),
    ],
)
def test_score_table_bounds(value, privacy, utility):
    table = ScoreTable()
    assert table.privacy(value) == privacy
    assert table.utility(value) == utility


# (method, ε_u, {attack: ε_p}, S*_PU) from Kang et al. Table 10 (Credit) and Tables 11-12.
KANG_ROWS = [
    ("Table 10 ISO", 0.8, {"NS": 0.8, "DS": 2.2, "DL": 2.6}, 4),
    ("Table 10 DP-L", 0.9, {"NS": 1.1, "DS": 2.6, "DL": 3.7}, 4),
    ("Table 10 MN", 0.1, {"NS": 6.2, "DS": 18.1, "DL": 19.8}, 2),
    ("Table 10 GC", 11.2, {"NS": 10.1, "DS": 3.3, "DL": 11.6}, 0),
    ("Table 10 no protection", 0.0, {"NS": 46.9, "DS": 50.0, "DL": 50.0}, 0),
    ("Table 10 Vehicle MN", 0.3, {"NS": 0.4, "DS": 5.1, "DL": 13.9}, 3),
    ("Table 11 MN", 0.1, {"RR": 7.8, "GI": 15.8}, 2),
    ("Table 11 DP-L", 0.9, {"RR": 1.4, "GI": 0.8}, 4),
    ("Table 12 GC", 3.5, {"MC": 17.5}, 2),
    ("Table 12 MN", 0.1, {"MC": 21.7}, 1),
    ("Table 12 Vehicle ISO", 0.8, {"MC": 1.0}, 4),
]


@pytest.mark.parametrize(("row", "loss", "leakages", "expected"), KANG_ROWS)
def test_pu_score_reproduces_kang_rows(row, loss, leakages, expected):
    assert pu_score(max(leakages.values()), loss) == expected, row


def test_optimal_pu_picks_the_best_strength_against_the_worst_attack():
    points = [
        (0.1, 0.2, {"NS": 30.0, "DS": 1.0}),  # score 0: NS leaks
        (1.0, 0.8, {"NS": 2.0, "DS": 2.2}),  # score 4
        (10.0, 5.0, {"NS": 0.1, "DS": 0.1}),
    ]  # score 1: utility
    best = optimal_pu_score(points)
    assert best.score == 4 and best.strength == 1.0


def test_dcs_uses_the_prior_as_ideal():
    assert dcs(0.9, 0.5, main_ideal=0.9, attack_ideal=0.5) == 1.0
    assert dcs(0.9, 0.7, main_ideal=0.9, attack_ideal=0.5) < 1.0
    assert dcs(0.9, 0.4, main_ideal=0.95, attack_ideal=0.5) < 1.0


def test_pareto_front():
    pts = [(0.0, 50.0), (1.0, 5.0), (2.0, 6.0), (3.0, 1.0), (0.5, 60.0)]
    assert pareto_front(pts) == [0, 1, 3]


def test_every_attack_leaks_in_points_with_higher_meaning_more_leakage():
    """A label attack at AUC 0.65 against 0.5 leaks 15 points (Kang §8.3's example); a feature
    attack cutting the MSE from the prior's 1.0 to 0.1 leaks 90 points, not 0.9 MSE units, and
    one doing worse than the prior leaks a negative amount (the old scale gave prior - MSE)."""
    assert direction_of("auc") == direction_of("accuracy") == "higher" and direction_of("mse") == "lower"
    assert leakage_points("auc", 0.65, 0.5) == pytest.approx(15.0)
    assert leakage_points("mse", 0.1, 1.0) == pytest.approx(90.0)
    assert leakage_points("mse", 0.02, 0.2) == pytest.approx(90.0)  # the same share of error removed, any scale
    assert leakage_points("mse", 2.0, 1.0) == pytest.approx(-100.0)
    assert math.isnan(leakage_points("mse", 0.0, 0.0))
    with pytest.raises(ValueError, match="unknown attack metric"):
        direction_of("psnr")


def test_old_results_without_a_direction_are_rescored_in_points():
    old_feature = {"name": "dmavfl", "metric": "mse", "value": 0.1, "prior": 1.0, "leakage": 0.9}
    assert attack_leakage(old_feature) == pytest.approx(90.0)
    assert attack_leakage({**old_feature, "direction": "lower", "leakage": 90.0}) == 90.0


# Kang et al. report S*_PU = 0 for every "No Protect" row of Tables 10-14, where eq. 21 alone gives
# 2 (Table 11 Credit, max ε_p 18.1) and 1 (Table 12 Credit, 21.8).
KANG_NO_PROTECT = [
    ("Table 11 Credit", {"RR": 16.0, "GI": 18.1}, 2),
    ("Table 12 Credit", {"MC": 21.8}, 1),
    ("Table 10 Credit", {"NS": 46.9, "DS": 50.0, "DL": 50.0}, 0),
    ("Table 11 Vehicle", {"RR": 26.4, "GI": 36.1}, 0),
]


@pytest.mark.parametrize(("row", "leakages", "eq21"), KANG_NO_PROTECT)
def test_no_protect_rows_follow_kangs_convention(row, leakages, eq21):
    """eq. 21 alone would score these rows ``eq21``; the scores table gives the sweep's no-defense row 0."""
    assert optimal_pu_score([(None, 0.0, leakages)]).score == eq21, row
    rows = [
        {
            "attack": name,
            "attack_target": "labels",
            "attack_metric": "auc",
            "prior": 0.5,
            "defense": "none",
            "strength": math.nan,
            "attack_value": 0.5 + value / 100,
            "leakage": value,
            "undefended_leakage": value,
        }
        for name, value in leakages.items()
    ]
    scores = scores_table(_table(rows)).set_index("defense")
    assert scores.loc["none", "s_pu"] == 0 and scores.loc["none", "verdict"] == "no protection (baseline)", row
    assert scores.loc["none", "worst_leakage"] == pytest.approx(max(leakages.values()), abs=0.01)


def test_optimal_pu_refuses_a_strength_without_attack_results():
    """Old behaviour: no leakages counted as ε_p = 0, i.e. a privacy score of 5."""
    with pytest.raises(ValueError, match="no attack results"):
        optimal_pu_score([(1.0, 0.2, {})])


def test_pu_score_is_not_defined_for_feature_attacks():
    assert pu_scorable("labels", "auc") is None
    assert "label leakage only" in pu_scorable("features", "mse")


def _table(rows):
    """``rows`` on three seeds, their leakages (defended and undefended) spread by -0.5, 0 and +0.5 points, so
    that every group has an interval over seeds."""
    base = {"dataset": "d", "algorithm": "vhnn", "utility": 0.9, "utility_loss": 0.0}
    out = []
    for seed, shift in enumerate((-0.5, 0.0, 0.5)):
        for r in rows:
            out.append(
                {
                    **base,
                    **r,
                    "seed": seed,
                    "leakage": r["leakage"] + shift,
                    "undefended_leakage": r["undefended_leakage"] + shift,
                }
            )
    return pd.DataFrame(out)


def test_scores_table_leaves_feature_attacks_out_instead_of_scoring_them_5():
    """Review snippet A4: an undefended feature attack that cuts MSE 1.0 -> 0.1 got S*_PU 5 and C-DCS
    1.0 because its leakage (0.9 MSE units) entered Kang's label table and DCS took MSE as higher-is-leakier."""
    feature = {
        "attack": "dmavfl",
        "attack_target": "features",
        "attack_metric": "mse",
        "attack_value": 0.1,
        "prior": 1.0,
        "leakage": 90.0,
        "undefended_leakage": 90.0,
    }
    table = _table(
        [
            {**feature, "defense": "none", "strength": math.nan},
            {
                **feature,
                "defense": "embedding_noise",
                "strength": 1.0,
                "leakage": 88.0,
                "utility": 0.899,
                "utility_loss": 0.1,
            },
        ]
    )
    scores = scores_table(table).set_index("defense")
    assert scores["s_pu"].isna().all() and scores["c_dcs"].isna().all()
    assert "not defined for feature attacks" in scores.loc["embedding_noise", "note"]
    assert scores.loc["none", "eps_p.dmavfl"] == 90.0  # reported, in points, as leaking


def test_scores_table_gives_no_credit_for_an_attack_that_does_not_leak_undefended():
    label = {"attack_target": "labels", "attack_metric": "auc", "prior": 0.5}
    rows = [
        {
            **label,
            "attack": "mc",
            "defense": "none",
            "strength": math.nan,
            "attack_value": 0.45,
            "leakage": -5.0,
            "undefended_leakage": -5.0,
        },
        {
            **label,
            "attack": "mc",
            "defense": "noise",
            "strength": 1.0,
            "attack_value": 0.5,
            "leakage": 0.0,
            "undefended_leakage": -5.0,
            "utility_loss": 0.1,
        },
        {
            **label,
            "attack": "ns",
            "defense": "none",
            "strength": math.nan,
            "attack_value": 0.8,
            "leakage": 30.0,
            "undefended_leakage": 30.0,
        },
        {
            **label,
            "attack": "ns",
            "defense": "noise",
            "strength": 1.0,
            "attack_value": 0.52,
            "leakage": 2.0,
            "undefended_leakage": 30.0,
            "utility_loss": 0.1,
        },
    ]
    scores = scores_table(_table(rows)).set_index("defense")
    assert scores.loc["noise", "s_pu"] == 5 and scores.loc["none", "s_pu"] == 0  # scored on ns alone
    assert "mc: left out" in scores.loc["noise", "note"]
    assert "does not leak measurably" in scores.loc["noise", "note"]
    only_mc = scores_table(_table(rows[:2])).set_index("defense")
    assert only_mc["s_pu"].isna().all() and only_mc["c_dcs"].isna().all()
    assert "no label attack that leaks measurably without a defense" in only_mc.loc["noise", "note"]


def test_c_dcs_is_below_1_for_a_leaking_label_attack_and_1_without_leakage():
    label = {
        "attack": "ns",
        "attack_target": "labels",
        "attack_metric": "auc",
        "prior": 0.5,
        "undefended_leakage": 40.0,
    }
    rows = [
        {**label, "defense": "none", "strength": math.nan, "attack_value": 0.9, "leakage": 40.0},
        {**label, "defense": "noise", "strength": 1.0, "attack_value": 0.5, "leakage": 0.0},
    ]
    scores = scores_table(_table(rows)).set_index("defense")
    assert scores.loc["none", "c_dcs"] < 0.9 and scores.loc["noise", "c_dcs"] == 1.0


def test_score_inference_records_a_fallback_to_the_training_split():
    """Old behaviour: a test AUC undefined (one class) silently became the training AUC."""
    from vflbench.attacks.base import LabelInference, Scores
    from vflbench.experiment.scoring import score_inference

    y_train, y_test = torch.tensor([0, 1, 0, 1]), torch.tensor([1, 1])
    inf = LabelInference(
        train=Scores(torch.arange(4), torch.tensor([0.1, 0.9, 0.2, 0.8])),
        test=Scores(torch.arange(2), torch.tensor([0.3, 0.7]), "test"),
    )
    value, details = score_inference(inf, y_train, y_test, "auc")
    assert value == 1.0 and details["scored_split"] == "train" and "test auc is undefined" in details["split_fallback"]
    both = LabelInference(train=inf.train, test=Scores(torch.arange(4), torch.tensor([0.1, 0.9, 0.2, 0.8]), "test"))
    assert score_inference(both, y_train, y_train, "auc")[1]["scored_split"] == "test"
