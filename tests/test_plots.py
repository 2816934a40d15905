"""The trade-off plot: strength labels never overlap, and the plot says what it shows."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import pandas as pd

from vflbench.report.plots import tradeoff, tradeoff_figure


def _summary(points: dict[str, list[tuple[float, float, float]]]) -> pd.DataFrame:
    rows = [
        {
            "dataset": "credit_default",
            "attack": "norm_scoring",
            "attack_metric": "auc",
            "defense": defense,
            "strength": strength,
            "utility_loss": eps_u,
            "leakage": eps_p,
        }
        for defense, series in points.items()
        for strength, eps_u, eps_p in series
    ]
    rows.append(
        {
            "dataset": "credit_default",
            "attack": "norm_scoring",
            "attack_metric": "auc",
            "defense": "none",
            "strength": None,
            "utility_loss": 0.0,
            "leakage": 32.0,
        }
    )
    return pd.DataFrame(rows)


def test_labels_of_neighbouring_points_do_not_overlap(tmp_path):
    """Before: the labels of strengths 1 and 5 at neighbouring points printed as one "15"."""
    summary = _summary(
        {
            "isotropic_noise": [(1, 0.50, 30.0), (5, 0.62, 30.0), (10, 5, 20), (50, 40, 5)],
            "marvell": [(0.1, 0.2, 31), (1, 0.4, 30.5), (4, 12, 8)],
        }
    )
    fig = tradeoff_figure(summary, "norm_scoring")
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    notes = [t for t in ax.texts if t.get_text()]
    assert sorted(t.get_text() for t in notes) == ["0.1", "1", "1", "10", "4", "5", "50"]
    boxes = [t.get_window_extent(renderer) for t in notes]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b)
    inside = ax.get_window_extent(renderer)
    assert all(inside.contains(b.x0, b.y0) and inside.contains(b.x1, b.y1) for b in boxes)
    plt.close(fig)
    assert tradeoff(summary, "norm_scoring", tmp_path / "t.png").stat().st_size > 10_000


def test_the_plot_names_the_dataset_the_metric_and_what_the_numbers_are():
    fig = tradeoff_figure(_summary({"isotropic_noise": [(1, 0.5, 30.0), (10, 5, 20)]}), "norm_scoring")
    ax = fig.axes[0]
    assert ax.get_title() == "credit_default: norm_scoring (auc): privacy-utility trade-off"
    assert ax.get_legend().get_title().get_text() == "numbers at points: defense strength"
    plt.close(fig)
