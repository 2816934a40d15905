"""Plots of privacy-utility results (matplotlib, Agg backend, PNG files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.transforms import Bbox

from vflbench.experiment.sweep import NO_DEFENSE
from vflbench.metrics.scores import pareto_front


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _point_labels(group: pd.DataFrame) -> dict[tuple[float, float], str]:
    """One label per plotted point: strengths that land on the same point share it ("0.05, 0.1")."""
    labels: dict[tuple[float, float], list[str]] = {}
    for _, r in group.iterrows():
        if not pd.isna(r["strength"]) and not (pd.isna(r["eps_u"]) or pd.isna(r["eps_p"])):
            key = (round(float(r["eps_u"]), 6), round(float(r["eps_p"]), 6))
            labels.setdefault(key, []).append(f"{r['strength']:g}")
    return {key: ", ".join(texts) for key, texts in labels.items()}


#: Half the width of a plotted point's marker, in points: a label keeps off it.
MARKER_POINTS = 5.0
#: Where a strength label may go relative to its point, in order of preference: (dx, dy) in points, with the text's
#: alignment. Close ones first; farther ones get a thin leader line to their point.
_LABEL_SPOTS = [
    (dx * r, dy * r, ha, va)
    for r in (1, 2.6, 4.2, 5.8)
    for dx, dy, ha, va in (
        (5, 4, "left", "bottom"),
        (5, -4, "left", "top"),
        (-5, 4, "right", "bottom"),
        (-5, -4, "right", "top"),
        (0, 7, "center", "bottom"),
        (0, -7, "center", "top"),
        (8, 0, "left", "center"),
        (-8, 0, "right", "center"),
    )
]


def place_labels(
    ax: plt.Axes,
    labels: dict[tuple[float, float], str],
    *,
    points: list[tuple[float, float]] | None = None,
    colors: dict[tuple[float, float], Any] | None = None,
    fontsize: float = 7,
) -> list[Any]:
    """Write each label next to its point (data coordinates), inside the axes, where it covers no label already
    written and no other point's marker (``points``: every plotted point, by default the labelled ones): the
    first free spot of :data:`_LABEL_SPOTS` (a far one with a leader line), else the first spot. ``colors``: a
    label's colour (its series'). Call it once the axes' limits are final. Returns the annotations."""
    fig = ax.figure
    fig.canvas.draw()  # fixes the limits and gives a renderer that measures text
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    radius = MARKER_POINTS * fig.dpi / 72.0
    markers = [(xy, ax.transData.transform(xy)) for xy in (points if points is not None else list(labels))]
    inside = ax.get_window_extent(renderer)
    placed: list[Any] = []
    taken: list[Any] = []
    for xy, text in sorted(labels.items()):
        others = [
            Bbox.from_extents(px - radius, py - radius, px + radius, py + radius)
            for other, (px, py) in markers
            if other != xy
        ]
        spots = [*_LABEL_SPOTS, _LABEL_SPOTS[0]]  # where nothing is free: the first spot after all
        for i, (dx, dy, ha, va) in enumerate(spots):
            far = abs(dx) > 8 or abs(dy) > 8
            note = ax.annotate(
                text,
                xy,
                textcoords="offset points",
                xytext=(dx, dy),
                ha=ha,
                va=va,
                fontsize=fontsize,
                zorder=6,
                color=(colors or {}).get(xy, "black"),
                arrowprops={"arrowstyle": "-", "color": "grey", "linewidth": 0.5} if far else None,
            )
            note.set_in_layout(False)  # a later tight_layout keeps the axes (and so these distances) as they are
            box = note.get_window_extent(renderer).expanded(1.1, 1.15)
            fits = inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1)
            if (fits and not any(box.overlaps(b) for b in taken + others)) or i == len(spots) - 1:
                placed.append(note)
                taken.append(box)
                break
            note.remove()
    return placed


def tradeoff_figure(summary: pd.DataFrame, attack: str) -> plt.Figure:
    """The figure :func:`tradeoff` saves: titled with the dataset, the attack and its metric; each point
    labelled with its defense strength (the legend's title says so), labels placed so that none overlaps."""
    data = summary[summary["attack"] == attack]
    agg = (
        data.groupby(["defense", "strength"], dropna=False)
        .agg(
            eps_u=("utility_loss", "mean"),
            eps_u_std=("utility_loss", "std"),
            eps_p=("leakage", "mean"),
            eps_p_std=("leakage", "std"),
        )
        .reset_index()
    )
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    markers = iter("osD^v<>phX*")
    labels: dict[tuple[float, float], str] = {}
    colors: dict[tuple[float, float], Any] = {}
    for defense, group in agg.groupby("defense"):
        if defense == NO_DEFENSE:
            continue
        group = group.sort_values("strength")
        series = ax.errorbar(
            group["eps_u"],
            group["eps_p"],
            xerr=group["eps_u_std"].fillna(0),
            yerr=group["eps_p_std"].fillna(0),
            marker=next(markers, "o"),
            linestyle="-",
            capsize=3,
            label=defense,
        )
        for xy, text in _point_labels(group).items():
            # two defenses' points at one place share a label (in black)
            colors[xy] = "black" if xy in labels else series.lines[0].get_color()
            labels[xy] = f"{labels[xy]}; {text}" if xy in labels else text
    base = agg[agg["defense"] == NO_DEFENSE]
    if not base.empty:
        ax.scatter(base["eps_u"], base["eps_p"], marker="*", s=160, color="black", zorder=5, label="no defense")
    defended = agg[agg["defense"] != NO_DEFENSE].dropna(subset=["eps_u", "eps_p"])
    if len(defended) > 1:
        pts = list(zip(defended["eps_u"], defended["eps_p"], strict=True))
        front = [pts[i] for i in pareto_front(pts)]
        # hollow rings mark the front's points, so that a front of one point is visible too
        ax.plot(
            *zip(*front, strict=True),
            color="grey",
            linestyle=":",
            linewidth=1.5,
            marker="o",
            markersize=13,
            markerfacecolor="none",
            label="Pareto front",
        )
    ax.set_xlabel("utility loss ε_u (points)")
    ax.set_ylabel("privacy leakage ε_p (points)")
    datasets = ", ".join(sorted(str(d) for d in data["dataset"].dropna().unique())) if "dataset" in data else ""
    metrics = sorted(str(m) for m in data["attack_metric"].dropna().unique()) if "attack_metric" in data else []
    metric = f" ({', '.join(metrics)})" if metrics else ""
    ax.set_title(f"{datasets + ': ' if datasets else ''}{attack}{metric}: privacy-utility trade-off", fontsize=10)
    ax.axhline(0, color="lightgrey", linewidth=0.8)
    ax.legend(fontsize=8, title="numbers at points: defense strength" if labels else None, title_fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    place_labels(
        ax,
        labels,
        colors=colors,
        points=[
            (float(x), float(y))
            for x, y in zip(agg["eps_u"], agg["eps_p"], strict=True)
            if not (pd.isna(x) or pd.isna(y))
        ],
    )
    return fig


def tradeoff(summary: pd.DataFrame, attack: str, path: Path) -> Path:
    """Privacy leakage vs utility loss per defense, labelled by strength, with the no-defense
    point and the Pareto front (Kang Fig. 4; VMask Fig. 6). Means over seeds, std as bars."""
    return _save(tradeoff_figure(summary, attack), path)


def per_epoch(curves: pd.DataFrame, attack: str, path: Path) -> Path:
    """Attack value at every training epoch, one line per defense setting (VMask Fig. 5)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, group in curves[curves["attack"] == attack].groupby("label"):
        mean = np.mean(np.stack(group["values"].to_list()), axis=0)
        ax.plot(np.arange(1, len(mean) + 1), mean, marker=".", label=label)
    ax.set_xlabel("training epoch")
    ax.set_ylabel("attack value")
    ax.set_title(f"{attack} at every epoch")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def tsne_panels(panels: list[tuple[str, np.ndarray, np.ndarray]], path: Path) -> Path:
    """One t-SNE scatter of the attacker's embeddings per defense, coloured by class (VMask Fig. 7)."""
    n = len(panels)
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.8 * rows), squeeze=False)
    for ax, (label, xy, y) in zip(axes.flat, panels, strict=False):
        ax.scatter(xy[:, 0], xy[:, 1], c=y, cmap="tab10", s=6)
        ax.set_title(label, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return _save(fig, path)


def line(
    x: list[float], ys: dict[str, list[float]], xlabel: str, title: str, path: Path, *, diagonal: bool = False
) -> Path:
    """A simple multi-line plot (e.g. mask ratio and attack value against the privacy budget);
    ``diagonal`` adds the line y = x (an attack value on it equals the budget)."""
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for label, y in ys.items():
        ax.plot(x, y, marker="o", label=label)
    if diagonal:
        ax.plot(x, x, color="grey", linestyle=":", linewidth=1.2, label="y = budget")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def tune_trace(trace: pd.DataFrame, *, budget: float, chosen: float | None, title: str, path: Path) -> Path:
    """``vflbench tune``'s trials by strength (log axis): the worst attack's leakage against the
    budget line, the utility loss, and the chosen strength marked."""
    data = trace.sort_values("strength")
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    ax.plot(data["strength"], data["worst_leakage"], marker="o", label="worst attack's ε_p")
    ax.plot(data["strength"], data["utility_loss"], marker="s", label="utility loss ε_u")
    ax.axhline(budget, color="crimson", linestyle="--", linewidth=1.2, label=f"budget ε_p ≤ {budget:g}")
    if chosen is not None:
        ax.axvline(chosen, color="green", linestyle=":", linewidth=1.5, label=f"chosen strength {chosen:g}")
    ax.set_xscale("log")
    ax.set_xlabel("defense strength (log scale)")
    ax.set_ylabel("points (higher = worse)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)
