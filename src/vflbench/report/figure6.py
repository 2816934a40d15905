"""DMAVFL Figure 6: detector scores per training step, one curve per attack, with the thresholds.

Input: for each run label (e.g. "honest", "DMAVFL"), the detectors' records as the runs keep them
(``{detector name: {"scores": [(step, epoch, score), ...], ...}}``), and for each detector the rule
to draw (``threshold``, ``window``). Each panel shows the scores (thin) and the decision
statistic, the mean of the last ``window`` scores (thick, from the ``window``-th score on), and
the threshold as a dashed line: a run is flagged where its thick curve falls below it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

COLORS = {"honest": "black", "DMAVFL": "tab:blue", "DMAVFL_sync": "tab:cyan", "FSHA": "tab:red", "AGN": "tab:orange"}


@dataclass(frozen=True)
class Panel:
    """One detector configuration: the record's name, a title, and the rule drawn."""

    detector: str
    title: str
    threshold: float
    window: int
    min_scores: int = 0  #: the detector decides only once it holds this many scores (0: ``window``)


def decision_curve(scores: Sequence[float] | np.ndarray, window: int) -> np.ndarray:
    """The mean of the last ``window`` scores at each score from the ``window``-th on."""
    values = np.asarray(scores, dtype=float)
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if len(values) < window:
        return np.empty(0)
    sums = np.cumsum(np.concatenate([[0.0], values]))
    return (sums[window:] - sums[:-window]) / window


def decision_points(
    steps: Sequence[int] | np.ndarray,
    scores: Sequence[float] | np.ndarray,
    panel: Panel,
) -> tuple[np.ndarray, np.ndarray]:
    """The steps at which ``panel``'s detector decides and its decision statistic there: the mean of the
    last ``window`` scores, from the ``max(window, min_scores)``-th score on."""
    first = max(panel.window, panel.min_scores)
    stat = decision_curve(scores, panel.window)
    if len(scores) < first:
        return np.empty(0, dtype=int), np.empty(0)
    return np.asarray(steps)[first - 1 :], stat[first - panel.window :]


def detector_scores(
    runs: Mapping[str, Mapping[str, Any]], panels: Sequence[Panel], path: Path, title: str = ""
) -> Path:
    """Write the Figure 6 plot: one panel per detector configuration, one curve per run."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for label, detectors in runs.items():
            record = detectors.get(panel.detector)
            if not record or not record.get("scores"):
                continue
            steps = np.array([s for s, _, _ in record["scores"]])
            scores = np.array([v for _, _, v in record["scores"]])
            at, stat = decision_points(steps, scores, panel)
            color = COLORS.get(label.split(" (")[0])  # "DMAVFL (14 epochs)": a stopped run, same colour
            if panel.window > 1:
                ax.plot(steps, scores, color=color, alpha=0.25, lw=0.8)
            if len(stat):
                ax.plot(at, stat, color=color, lw=1.8, label=label)
        ax.axhline(panel.threshold, color="gray", ls="--", lw=1, label=f"threshold {panel.threshold:g}")
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("victim's training step")
        ax.set_ylabel(f"score (thin), mean of last {panel.window} (thick)" if panel.window > 1 else "score")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
