"""Scores reproduce rows of Kang et al.'s Tables 10-12 from their ε_p / ε_u values."""

from __future__ import annotations

import pytest

from vflbench.eval.scores import ScoreTable, dcs, optimal_pu_score, pareto_front, pu_score


@pytest.mark.parametrize(("value", "privacy", "utility"), [
    (0.0, 5, 5), (0.5, 5, 5), (0.8, 5, 4), (2.2, 5, 2), (5.0, 5, 1), (6.2, 4, 0), (10.1, 3, 0),
    (18.1, 2, 0), (21.8, 1, 0), (46.9, 0, 0),
])
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
    points = [(0.1, 0.2, {"NS": 30.0, "DS": 1.0}),   # score 0: NS leaks
              (1.0, 0.8, {"NS": 2.0, "DS": 2.2}),    # score 4
              (10.0, 5.0, {"NS": 0.1, "DS": 0.1})]   # score 1: utility
    best = optimal_pu_score(points)
    assert best.score == 4 and best.strength == 1.0


def test_dcs_uses_the_prior_as_ideal():
    assert dcs(0.9, 0.5, main_ideal=0.9, attack_ideal=0.5) == 1.0
    assert dcs(0.9, 0.7, main_ideal=0.9, attack_ideal=0.5) < 1.0
    assert dcs(0.9, 0.4, main_ideal=0.95, attack_ideal=0.5) < 1.0


def test_pareto_front():
    pts = [(0.0, 50.0), (1.0, 5.0), (2.0, 6.0), (3.0, 1.0), (0.5, 60.0)]
    assert pareto_front(pts) == [0, 1, 3]
