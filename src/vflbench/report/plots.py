"""Plots of privacy-utility results (matplotlib, Agg backend, PNG files)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

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


def tradeoff(summary: pd.DataFrame, attack: str, path: Path) -> Path:
    """Privacy leakage vs utility loss per defense, labelled by strength, with the no-defense
    point and the Pareto front (Kang Fig. 4; VMask Fig. 6). Means over seeds, std as bars."""
    data = summary[summary["attack"] == attack]
    agg = data.groupby(["defense", "strength"], dropna=False).agg(
        eps_u=("utility_loss", "mean"), eps_u_std=("utility_loss", "std"),
        eps_p=("leakage", "mean"), eps_p_std=("leakage", "std")).reset_index()
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    markers = iter("osD^v<>phX*")
    for defense, group in agg.groupby("defense"):
        if defense == NO_DEFENSE:
            continue
        group = group.sort_values("strength")
        ax.errorbar(group["eps_u"], group["eps_p"],
                    xerr=group["eps_u_std"].fillna(0), yerr=group["eps_p_std"].fillna(0),
                    marker=next(markers, "o"), linestyle="-", capsize=3, label=defense)
        for i, ((x, y), text) in enumerate(sorted(_point_labels(group).items())):
            # alternate above / below so that the labels of neighbouring points do not overlap
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 5 if i % 2 == 0 else -11), fontsize=7)
    base = agg[agg["defense"] == NO_DEFENSE]
    if not base.empty:
        ax.scatter(base["eps_u"], base["eps_p"], marker="*", s=160, color="black", zorder=5, label="no defense")
    defended = agg[agg["defense"] != NO_DEFENSE].dropna(subset=["eps_u", "eps_p"])
    if len(defended) > 1:
        pts = list(zip(defended["eps_u"], defended["eps_p"], strict=True))
        front = [pts[i] for i in pareto_front(pts)]
        # hollow rings mark the front's points, so that a front of one point is visible too
        ax.plot(*zip(*front, strict=True), color="grey", linestyle=":", linewidth=1.5, marker="o",
                markersize=13, markerfacecolor="none", label="Pareto front")
    ax.set_xlabel("utility loss ε_u (points)")
    ax.set_ylabel("privacy leakage ε_p (points)")
    ax.set_title(f"privacy-utility trade-off: {attack}")
    ax.axhline(0, color="lightgrey", linewidth=0.8)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


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


def line(x: list[float], ys: dict[str, list[float]], xlabel: str, title: str, path: Path, *,
         diagonal: bool = False) -> Path:
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
