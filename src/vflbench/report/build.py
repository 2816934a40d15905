"""Build ``report.md`` and ``report.html`` (with PNG plots) from a sweep or tune directory."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vflbench.errors import VFLBenchError
from vflbench.experiment import detection
from vflbench.experiment.results import read_result, write_atomic
from vflbench.experiment.sweep import NO_DEFENSE, RUNS, with_searched
from vflbench.report import plots

SUMMARY_COLUMNS = [
    "defense",
    "strength",
    "seed",
    "attack",
    "attack_direction",
    "utility",
    "attack_value",
    "prior",
    "leakage",
    "undefended_leakage",
    "leaks_without_defense",
    "utility_loss",
    "pu_score",
    "pu_note",
]


def markdown_table(df: pd.DataFrame, floatfmt: str = "{:.4g}") -> str:
    """A GitHub-flavoured markdown table of ``df`` (missing values as empty cells)."""

    def cell(v: object) -> str:
        if v is None or v is pd.NA:
            return ""
        if isinstance(v, float):
            return "" if np.isnan(v) else floatfmt.format(0.0 if abs(v) < 1e-9 else v)
        return str(v)

    header = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def _curves(directory: Path, summary: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for run_hash, group in summary.groupby("config_hash"):
        path = directory / RUNS / str(run_hash) / "result.json"
        if not path.is_file():
            continue
        result = read_result(path)
        first = group.iloc[0]
        label = first["defense"] if pd.isna(first["strength"]) else f"{first['defense']} {first['strength']:g}"
        for a in result.attacks:
            if a.per_epoch:
                rows.append({"attack": a.name, "label": label, "values": np.asarray(a.per_epoch)})
    return pd.DataFrame(rows)


def _tsne(directory: Path, summary: pd.DataFrame, limit: int = 6) -> list[tuple[str, np.ndarray, np.ndarray]]:
    from sklearn.manifold import TSNE

    panels: list[tuple[str, np.ndarray, np.ndarray]] = []
    seen: set[str] = set()
    for _, row in summary.drop_duplicates("config_hash").sort_values(["defense", "strength"]).iterrows():
        path = directory / RUNS / str(row["config_hash"]) / "embeddings.npz"
        label = row["defense"] if pd.isna(row["strength"]) else f"{row['defense']} {row['strength']:g}"
        if not path.is_file() or label in seen or len(panels) >= limit:
            continue
        seen.add(label)
        data = np.load(path)
        xy = TSNE(n_components=2, init="pca", random_state=0, perplexity=min(30, len(data["y"]) - 1)).fit_transform(
            data["embedding"]
        )
        panels.append((label, xy, data["y"]))
    return panels


def _mask_ratio_figures(summary: pd.DataFrame, d: Path) -> list[tuple[str, Path]]:
    """VMask Fig. 8: main accuracy, attack value and mask ratio against the privacy budget, one
    plot per masking defense swept over more than one budget (means over seeds)."""
    if "mask_ratio" not in summary:
        return []
    figures = []
    masked = summary.dropna(subset=["mask_ratio", "strength"])
    for defense, group in masked.groupby("defense"):
        if group["strength"].nunique() < 2:
            continue
        per_run = (
            group.groupby(["strength", "seed"])
            .agg(utility=("utility", "first"), mask_ratio=("mask_ratio", "first"))
            .groupby("strength")
            .mean()
        )
        ys = {"main utility": per_run["utility"].tolist(), "mask ratio": per_run["mask_ratio"].tolist()}
        for attack, rows in group.dropna(subset=["attack"]).groupby("attack"):
            ys[f"{attack} value"] = rows.groupby("strength")["attack_value"].mean().reindex(per_run.index).tolist()
        budgets = per_run.index.tolist()
        figures.append(
            (
                f"{defense}: utility, attack value and mask ratio against the budget",
                plots.line(
                    budgets,
                    ys,
                    "privacy budget (strength)",
                    f"{defense}: effect of the budget",
                    d / "plots" / f"budget_{defense}.png",
                    diagonal=True,
                ),
            )
        )
    return figures


def _number(value: Any, digits: int = 2) -> str:
    """A table cell: empty for a missing value, 0 for a rounding residue (|v| < 1e-9), else ``digits`` decimals."""
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return f"{0.0 if abs(value) < 1e-9 else float(value):.{digits}f}"
    return str(value)


def _with_interval(mean: Any, low: Any, high: Any) -> str:
    """``mean [low, high]``, or the mean alone without an interval."""
    text = _number(mean)
    if text and _number(low) and _number(high):
        return f"{text} [{_number(low)}, {_number(high)}]"
    return text


def _mean_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per defense × strength × attack: the statistics of summary.csv over seeds × repeats, as text
    (ε_p and ε_p − ε_p(undefended) with their intervals; utility in percent, like ε_u in points)."""
    attacked = summary.dropna(subset=["attack"])
    if attacked.empty:
        return pd.DataFrame()
    has = set(summary.columns)
    rows = []
    for (defense, strength, attack), group in attacked.groupby(["defense", "strength", "attack"], dropna=False):
        first = group.iloc[0]
        seeds = int(group["seed"].nunique())
        repeats = int(group["repeats"].min()) if "repeats" in has else 1
        row = {
            "defense": defense,
            "strength": _number(strength, 4).rstrip("0").rstrip(".") if not pd.isna(strength) else "",
            "attack": attack,
            "metric": f"{first.get('attack_metric', '')} ({first.get('attack_direction', '')} leaks more)",
            "selection": first.get("selection", ""),
            "seeds × repeats": f"{seeds} × {repeats}",
            "utility (%)": _number(100.0 * group["utility"].mean()),
            "ε_u (points)": _number(group["utility_loss"].mean()),
        }
        if "leakage_ci_low" in has:
            row["ε_p (points) [95% CI]"] = _with_interval(
                first["leakage_mean"], first["leakage_ci_low"], first["leakage_ci_high"]
            )
            row["ε_p − undefended [95% CI]"] = (
                ""
                if defense == NO_DEFENSE
                else _with_interval(first["delta_leakage"], first["delta_ci_low"], first["delta_ci_high"])
            )
            row["change"] = "" if defense == NO_DEFENSE else first["change"]
        else:  # a summary written before intervals: the mean over seeds only
            row["ε_p (points)"] = _number(group["leakage"].mean())
        if "search" in has and group["search"].map(_text).any():
            row.update(_searched_cells(group, defense == NO_DEFENSE))
        scores = group["pu_score"].dropna() if "pu_score" in has else pd.Series(dtype=float)
        row["PU score"] = _number(int(scores.min())) if len(scores) else ""
        rows.append(row)
    return pd.DataFrame(rows)


def _text(value: Any) -> bool:
    """Whether a table cell holds a non-empty string (not NaN, as an empty CSV column reads)."""
    return isinstance(value, str) and bool(value)


def _searched_cells(group: pd.DataFrame, baseline: bool) -> dict[str, str]:
    """The attacker search's cells of one defense × strength × attack group: the searched attacker's ε_p and its
    difference from the undefended run (with intervals), and the settings the search chose on the group's runs
    (the most frequent first); "default attacker only" for an attack whose settings cannot be searched."""
    first = group.iloc[0]
    if not (group["search"] == "searched").any():
        status = first["search"] if _text(first["search"]) else ""
        return {"searched ε_p [95% CI]": status, "searched ε_p − undefended [95% CI]": "", "attacker setting": ""}
    settings = group["attacker_setting"].dropna().astype(str)
    counts = settings[settings != ""].value_counts()
    shown = "; ".join(f"{setting} ({n}×)" if len(counts) > 1 else setting for setting, n in counts.head(2).items())
    if len(counts) > 2:
        shown += f"; {len(counts) - 2} more"
    return {
        "searched ε_p [95% CI]": _with_interval(
            first["leakage_worst_mean"], first["leakage_worst_ci_low"], first["leakage_worst_ci_high"]
        ),
        "searched ε_p − undefended [95% CI]": ""
        if baseline
        else _with_interval(first["delta_worst"], first["delta_worst_ci_low"], first["delta_worst_ci_high"]),
        "attacker setting": shown,
    }


def _detectors_view(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per defense × strength × detector: both rates (percent of decisions, 95% interval over seeds) and
    the verdict (:mod:`vflbench.experiment.detection`); empty without detectors."""
    rows = detection.frame(summary)
    if rows.empty:
        return rows

    def percent(r: pd.Series, what: str) -> str:
        return _with_interval(*(100.0 * r[f"{what}_{k}"] for k in ("mean", "ci_low", "ci_high")))

    view = pd.DataFrame(
        [
            {
                "defense": r["defense"],
                "strength": "" if pd.isna(r["strength"]) else f"{r['strength']:g}",
                "setting": "" if pd.isna(r["setting"]) else r["setting"],
                "detector": r["detector"],
                "attack": r["attack"],
                "seeds": r["seeds"],
                "detection rate (%) [95% CI]": percent(r, "detection_rate"),
                "false alarms on honest training (%) [95% CI]": percent(r, "false_alarm_rate"),
                "verdict": r["detector_verdict"],
            }
            for _, r in rows.iterrows()
        ]
    )
    return view if view["setting"].astype(bool).any() else view.drop(columns="setting")


DETECTORS_TEXT = (
    "A detector decides at each of its scoring rounds whether the training is hijacked. The detection "
    "rate is the share of its decisions that flag the run with the attack; the false-alarm rate the "
    "share that flag honest training of the same scenario (the same config without its malicious "
    "attacks: same data, pool and seed). Both are means over seeds with 95% intervals; a detector "
    "detects the attack only when the interval of the difference (paired by seed) lies above 0. One "
    "that flags honest training as often as the attack detects nothing."
)


#: How scores.csv's columns read in the report.
SCORE_LABELS = {
    "defense": "defense",
    "verdict": "verdict",
    "best_strength": "best strength",
    "s_pu": "S*_PU",
    "utility_loss": "ε_u (points)",
    "worst_attack": "worst attack",
    "c_dcs": "C-DCS",
}


def _scores_view(scores: pd.DataFrame) -> pd.DataFrame:
    """scores.csv as the report shows it: readable column names, intervals beside their means, empty cells for
    what is not defined ("no measurable protection" carries no PU score)."""
    has = set(scores.columns)
    rows = []
    for _, r in scores.iterrows():
        row = {label: _number(r.get(key)) for key, label in SCORE_LABELS.items() if key in has}
        if "best_strength" in has and not pd.isna(r["best_strength"]):
            row["best strength"] = f"{float(r['best_strength']):g}"
        if "s_pu" in has and not pd.isna(r["s_pu"]):
            row["S*_PU"] = str(int(r["s_pu"]))
        if "worst_leakage" in has:
            row["worst ε_p (points) [95% CI]"] = _with_interval(
                r["worst_leakage"], r.get("worst_ci_low"), r.get("worst_ci_high")
            )
        if "delta_leakage" in has:
            row["ε_p − undefended [95% CI]"] = _with_interval(
                r["delta_leakage"], r.get("delta_ci_low"), r.get("delta_ci_high")
            )
        rows.append(row)
    return pd.DataFrame(rows)


def _tune_vs_scores(tune: dict[str, Any], scores: pd.DataFrame | None) -> str:
    """Why tune's chosen strength may differ from the optimal-PU table's best strength."""
    text = (
        "tune chooses, among the strengths it tried whose worst leakage meets the budget, the one with the "
        "smallest utility loss; the optimal PU table's `best_strength` maximises Kang's PU score (eq. 22), "
        "which bins both losses into Table 8's scores and takes the first strength with the best score."
    )
    if scores is None or scores.empty or not tune.get("chosen") or "best_strength" not in scores:
        return text
    best = scores[scores["defense"] == tune["defense"]]["best_strength"].dropna()
    if best.empty or any(abs(float(b) - float(tune["chosen"]["strength"])) < 1e-12 for b in best):
        return text
    return text + (
        f" Here they differ: tune chose {tune['chosen']['strength']:g}, the PU table's best strength is "
        f"{', '.join(f'{float(b):g}' for b in best)}."
    )


def _verdicts(summary: pd.DataFrame) -> list[str]:
    """A section naming the attacks that do not leak measurably without a defense (the interval of their
    undefended leakage over seeds × repeats does not lie above 0, or there is none): no defense is credited
    for stopping them."""
    if "leaks_without_defense" not in summary:
        return []
    attacked = summary.dropna(subset=["attack"])
    per = attacked.groupby(["dataset", "algorithm", "attack"]).agg(
        leaks=("leaks_without_defense", "first"),
        value=("undefended_leakage", "mean"),
        low=("undefended_ci_low", "first") if "undefended_ci_low" in summary else ("undefended_leakage", "min"),
        high=("undefended_ci_high", "first") if "undefended_ci_high" in summary else ("undefended_leakage", "max"),
    )
    idle = per[~per["leaks"].map(lambda v: bool(pd.notna(v) and v))]
    if idle.empty:
        return []
    lines = [
        "## Attacks that do not leak measurably without a defense",
        "",
        "These attacks do not beat their prior measurably on the runs without defenses (the 95% interval of "
        "their undefended leakage over seeds × repeats does not lie above 0 points, or there is no interval), "
        "so the defenses get no PU score or C-DCS for them:",
        "",
    ]
    lines += [
        f"- {attack} on {dataset} ({algorithm}): undefended leakage "
        f"{_with_interval(r['value'], r['low'], r['high'])} points"
        for (dataset, algorithm, attack), r in idle.iterrows()
    ]
    return [*lines, ""]


def build_report(directory: str | Path) -> Path:
    """Write report.md, report.html and plots/*.png for a sweep directory; return report.md."""
    d = Path(directory)
    if not (d / "summary.csv").is_file():
        raise VFLBenchError(f"{d} has no summary.csv; run `vflbench sweep CONFIG --out {d}` first")
    summary = pd.read_csv(d / "summary.csv")
    scores_csv = d / "scores.csv"
    scores = pd.read_csv(scores_csv) if scores_csv.is_file() and scores_csv.stat().st_size else None
    figures: list[tuple[str, Path]] = []
    attacks = list(summary["attack"].dropna().unique())
    for attack in attacks:
        figures.append(
            (
                f"Privacy-utility trade-off against {attack}",
                plots.tradeoff(summary, attack, d / "plots" / f"tradeoff_{attack}.png"),
            )
        )
    curves = _curves(d, summary)
    for attack in curves["attack"].unique() if not curves.empty else []:
        figures.append(
            (f"{attack} at every training epoch", plots.per_epoch(curves, attack, d / "plots" / f"epochs_{attack}.png"))
        )
    panels = _tsne(d, summary)
    if panels:
        figures.append(
            ("t-SNE of the attacker's embeddings per defense", plots.tsne_panels(panels, d / "plots" / "tsne.png"))
        )
    figures += _mask_ratio_figures(summary, d)
    tune = json.loads((d / "tune.json").read_text()) if (d / "tune.json").is_file() else None
    if tune:
        chosen = tune["chosen"]["strength"] if tune.get("chosen") else None
        figures.append(
            (
                "tune: worst-case leakage and utility loss per tried strength",
                plots.tune_trace(
                    pd.DataFrame(tune["trace"]),
                    budget=tune["budget"],
                    chosen=chosen,
                    title=f"tune {tune['defense']} (seeds {tune.get('seeds', '?')})",
                    path=d / "plots" / "tune.png",
                ),
            )
        )
    mean_table = _mean_table(summary)
    coverage_csv = d / "coverage.csv"
    coverage = pd.read_csv(coverage_csv) if coverage_csv.is_file() and coverage_csv.stat().st_size > 1 else None
    md = [
        f"# vflbench report: {d.name}",
        "",
        f"{summary['config_hash'].nunique()} runs, datasets: {', '.join(map(str, summary['dataset'].unique()))}, "
        f"defenses: {', '.join(map(str, summary['defense'].unique()))}.",
        "",
        "Leakage ε_p is in points on one scale where higher always means more leakage: label attacks "
        "100·(value − prior) (AUC or accuracy above the prior), feature attacks 100·(1 − MSE / MSE_prior) (the "
        "share of the prior guess's error the attack removes). Utility loss ε_u = utility without defense − with "
        "it, in points. PU score = min of the two scores of Kang et al.'s Table 8; S*_PU = the best PU score over "
        "strengths against the worst attack (Kang eq. 22); C-DCS uses the prior as the ideal attack value. "
        "PU scores and C-DCS are computed for label attacks that leak measurably without a defense only. "
        "Every ε_p is the mean over seeds × repeats with its 95% confidence interval [low, high] (over the "
        "per-seed means; over the repeats when there is one seed); ε_p − undefended is paired by seed. A "
        "defense protects at a strength only where the interval of the worst attack's ε_p − undefended lies "
        "below 0; one that protects at no strength is reported as 'no measurable protection', without a PU "
        "score, below No Protect. The `selection` column says how trained attacks picked their epoch "
        "(`last`, `validation` on their own known labels, or `test_oracle`: an oracle, flagged).",
        "",
    ]
    searched = "search" in summary and bool(summary["search"].map(_text).any())
    if searched:
        md += [
            "Attacker search (`evaluation.attacker_search`): every attack with a search grid was also run at the "
            "setting that scored best on the attacker's own validation rows (held-out known labels, or held-out "
            "auxiliary rows for a feature attack; never the test rows), beside the default attacker: the "
            "'searched' columns. The verdicts count that attacker as an attack of its own (`<attack> [searched]`), "
            "so a defense is judged against the stronger of the default and the searched attacker. Attacks whose "
            "settings act during training are run with their default settings only ('default attacker only').",
            "",
        ]
    if any(summary.get("selection", pd.Series(dtype=str)) == "test_oracle"):
        md += [
            "**Warning:** some attacks picked their epoch by its test score (`select: test_oracle`), an oracle "
            "no attacker has; their leakages are optimistic for the attacker.",
            "",
        ]
    if scores is not None and not scores.empty:
        md += ["## Verdicts and optimal PU scores", "", markdown_table(_scores_view(scores)), ""]
        md += [
            f"- {r['defense']}: {r['note']}"
            for _, r in scores.iterrows()
            if isinstance(r.get("note"), str) and r["note"]
        ] + [""]
    md += _verdicts(with_searched(summary))
    detectors = _detectors_view(summary)
    if not detectors.empty:
        md += ["## Detectors: detection and false-alarm rates", "", DETECTORS_TEXT, "", markdown_table(detectors), ""]
    if coverage is not None and not coverage.empty:
        md += [
            "## Adaptive attacks",
            "",
            "Whether each defense was evaluated against the adaptive attacks (and "
            "adaptive settings) that exist for it.",
            "",
            markdown_table(coverage),
            "",
        ]
        md += [f"- note: {n}" for n in coverage["note"].dropna() if str(n)] + [""]
    md += ["## Per defense, strength and attack", "", markdown_table(mean_table), ""]
    if tune:
        md += [
            "## Tune trace",
            "",
            f"Defense `{tune['defense']}`, budget ε_p ≤ {tune['budget']} points, seeds "
            f"{tune.get('seeds', '?')} (values are means over them): "
            + (
                f"chosen strength {tune['chosen']['strength']:g} (ε_u {tune['chosen']['utility_loss']:.2f})."
                if tune.get("chosen")
                else "no tried strength met the budget."
            ),
            "",
            _tune_vs_scores(tune, scores),
            "",
            markdown_table(pd.DataFrame(tune["trace"]).sort_values("strength")),
            "",
        ]
    md += ["## Plots", ""]
    for title, path in figures:
        md += [f"### {title}", "", f"![{title}]({path.relative_to(d).as_posix()})", ""]
    write_atomic(d / "report.md", "\n".join(md))
    body = [
        f"<h1>vflbench report: {html.escape(d.name)}</h1>",
        f"<p>{html.escape(md[2])}</p>",
        f"<p>{html.escape(md[4])}</p>",
    ]
    if searched:
        body.append(f"<p>{html.escape(md[6])}</p>")
    if scores is not None and not scores.empty:
        body += ["<h2>Verdicts and optimal PU scores</h2>", _scores_view(scores).to_html(index=False, na_rep="")]
    verdicts = _verdicts(with_searched(summary))
    if verdicts:
        body += [
            "<h2>Attacks that do not leak without a defense</h2>",
            f"<p>{html.escape(verdicts[2])}</p>",
            "<ul>" + "".join(f"<li>{html.escape(v[2:])}</li>" for v in verdicts[4:] if v) + "</ul>",
        ]
    if not detectors.empty:
        body += [
            "<h2>Detectors: detection and false-alarm rates</h2>",
            f"<p>{html.escape(DETECTORS_TEXT)}</p>",
            detectors.to_html(index=False, na_rep=""),
        ]
    if coverage is not None and not coverage.empty:
        body += ["<h2>Adaptive attacks</h2>", coverage.to_html(index=False, na_rep="")]
    body += ["<h2>Per defense, strength and attack</h2>", mean_table.to_html(index=False, na_rep="")]
    if tune:
        body += ["<h2>Tune trace</h2>", pd.DataFrame(tune["trace"]).to_html(index=False, na_rep="")]
    body += ["<h2>Plots</h2>"] + [
        f"<h3>{html.escape(t)}</h3><img src='{p.relative_to(d).as_posix()}' width='640'>" for t, p in figures
    ]
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>vflbench report</title><style>"
        "body{font-family:sans-serif;max-width:1000px;margin:2em auto}"
        "table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:3px 6px}</style></head><body>" + "\n".join(body) + "</body></html>"
    )
    write_atomic(d / "report.html", page)
    return d / "report.md"


__all__ = ["NO_DEFENSE", "SUMMARY_COLUMNS", "build_report", "markdown_table"]
