"""Kang et al. Tables 10-12 (VLR on Credit): our optimal PU scores next to the paper's.

Reads the sweep directories of evaluation settings 1-3 (``configs/kang/setting{1,2,3}_*.yaml``),
written by ``vflbench sweep``; with ``--run`` it first runs (or resumes) those sweeps. For each
table it prints, per protection, the utility loss ε_u and the leakage ε_p of every attack at
the strength that gives the optimal PU score S*_PU (Kang eq. 22, means over seeds, as in
``scores.csv``), ours beside the paper's, plus the "No Protect" row, and marks gaps of more
than 5 points. A second table per setting lists every strength (means over seeds) with its
worst-case leakage and PU score, so that the choice of the optimum can be checked.

Run:  .venv/bin/python benchmarks/reproduce_kang.py --sweeps runs/kang [--run --workers 2
          --data-root ../shared/datasets] [--table runs/kang/tables.md]

Another dataset, or other settings, for every sweep (benchmarks/swap.py): ``--dataset NAME`` and
``--set KEY=VALUE``, e.g. ``--run --dataset bank_marketing``; such sweeps go to their own
directories (``SWEEPS/<setting>@<hash of the overrides>``), and their tables say so.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd
import swap

from vflbench.experiment.sweep import RUNS, run_sweep, scores_table
from vflbench.metrics.scores import pu_score

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "setting1": (
        "configs/kang/setting1_vlr_credit_ns_ds_dl.yaml",
        "Table 10 (NS, DS, DL on d^B)",
        ["norm_scoring", "direction_scoring", "direct_label_inference"],
    ),
    "setting2": (
        "configs/kang/setting2_vlr_credit_rr_gi.yaml",
        "Table 11 (RR, GI on grad theta^B)",
        ["residue_reconstruction", "gradient_inversion"],
    ),
    "setting3": ("configs/kang/setting3_vlr_credit_mc.yaml", "Table 12 (MC on f^B)", ["model_completion"]),
}
SHORT = {
    "norm_scoring": "NS",
    "direction_scoring": "DS",
    "direct_label_inference": "DL",
    "residue_reconstruction": "RR",
    "gradient_inversion": "GI",
    "model_completion": "MC",
}
NAMES = {
    "none": "No Protect",
    "gradient_compression": "GC",
    "discrete_sgd": "D-SGD",
    "max_norm": "MN",
    "dp_laplace": "DP-L",
    "isotropic_noise": "ISO",
}
ORDER = ["none", "gradient_compression", "discrete_sgd", "max_norm", "dp_laplace", "isotropic_noise"]

#: Kang et al., Credit columns: protection -> (ε_u, {attack: ε_p}, S*_PU); utility 73.2 without protection.
PAPER: dict[str, dict[str, tuple[float, dict[str, float], int]]] = {
    "setting1": {
        "none": (0.0, {"norm_scoring": 46.9, "direction_scoring": 50.0, "direct_label_inference": 50.0}, 0),
        "gradient_compression": (
            11.2,
            {"norm_scoring": 10.1, "direction_scoring": 3.3, "direct_label_inference": 11.6},
            0,
        ),
        "discrete_sgd": (7.5, {"norm_scoring": 25.9, "direction_scoring": 24.6, "direct_label_inference": 33.1}, 0),
        "max_norm": (0.1, {"norm_scoring": 6.2, "direction_scoring": 18.1, "direct_label_inference": 19.8}, 2),
        "dp_laplace": (0.9, {"norm_scoring": 1.1, "direction_scoring": 2.6, "direct_label_inference": 3.7}, 4),
        "isotropic_noise": (0.8, {"norm_scoring": 0.8, "direction_scoring": 2.2, "direct_label_inference": 2.6}, 4),
    },
    "setting2": {
        "none": (0.0, {"residue_reconstruction": 16.0, "gradient_inversion": 18.1}, 0),
        "gradient_compression": (3.5, {"residue_reconstruction": 14.8, "gradient_inversion": 12.7}, 2),
        "discrete_sgd": (0.6, {"residue_reconstruction": 15.5, "gradient_inversion": 16.5}, 2),
        "max_norm": (0.1, {"residue_reconstruction": 7.8, "gradient_inversion": 15.8}, 2),
        "dp_laplace": (0.9, {"residue_reconstruction": 1.4, "gradient_inversion": 0.8}, 4),
        "isotropic_noise": (0.8, {"residue_reconstruction": 1.4, "gradient_inversion": 1.0}, 4),
    },
    "setting3": {
        "none": (0.0, {"model_completion": 21.8}, 0),
        "gradient_compression": (3.5, {"model_completion": 17.5}, 2),
        "discrete_sgd": (0.5, {"model_completion": 19.9}, 2),
        "max_norm": (0.1, {"model_completion": 21.7}, 1),
        "dp_laplace": (1.0, {"model_completion": 19.9}, 2),
        "isotropic_noise": (0.8, {"model_completion": 19.6}, 2),
    },
}
PAPER_UTILITY = 73.2


def _fmt(v: float | None, digits: int = 1) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _pair(ours: float | None, paper: float | None) -> str:
    """``ours / paper``, bold when they differ by more than 5 points."""
    text = f"{_fmt(ours)} / {_fmt(paper)}"
    if ours is not None and paper is not None and not math.isnan(ours) and abs(ours - paper) > 5:
        return f"**{text}**"
    return text


def _strength(v: object) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):g}"


def load(directory: Path, utility: str, seeds: list[int] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary, scores) of a sweep. ``utility="final"``: as ``vflbench sweep`` wrote them (the
    utility of the final epoch). ``utility="best"``: every run's utility replaced by its best
    per-epoch test value, utility losses, PU scores and optimal PU scores recomputed (Kang trains
    "until the utility of the joint model does not improve"). ``seeds``: keep only these seeds
    (scores recomputed with vflbench's own ``scores_table``)."""
    summary = pd.read_csv(directory / "summary.csv")
    if seeds is not None:
        summary = summary[summary["seed"].isin(seeds)].reset_index(drop=True)
    if utility == "final":
        return summary, (pd.read_csv(directory / "scores.csv") if seeds is None else scores_table(summary))
    best = {}
    for run_hash in summary["config_hash"].unique():
        result = json.loads((directory / RUNS / run_hash / "result.json").read_text())
        best[run_hash] = max(result["utility"]["per_epoch"])
    summary = summary.copy()
    summary["utility"] = summary["config_hash"].map(best)
    vanilla = summary[summary["defense"] == "none"].groupby("seed")["utility"].first()
    summary["utility_loss"] = [
        100.0 * (vanilla[s] - u) for s, u in zip(summary["seed"], summary["utility"], strict=True)
    ]
    summary["pu_score"] = [pu_score(p, u) for p, u in zip(summary["leakage"], summary["utility_loss"], strict=True)]
    return summary, scores_table(summary)


def _interval(group: pd.DataFrame) -> str:
    """``mean [low, high]`` of a summary group's ε_p (its first row carries the group's statistics)."""
    if group.empty:
        return "–"
    r = group.iloc[0]
    if pd.isna(r.get("leakage_ci_low")):
        return _fmt(float(r["leakage_mean"]))
    return f"{r['leakage_mean']:.1f} [{r['leakage_ci_low']:.1f}, {r['leakage_ci_high']:.1f}]"


def _at(frame: pd.DataFrame, defense: str, strength: object) -> pd.DataFrame:
    rows = frame[frame["defense"] == defense]
    if strength is None or (isinstance(strength, float) and math.isnan(strength)):
        return rows[rows["strength"].isna()] if rows["strength"].isna().any() else rows
    return rows[rows["strength"] == float(strength)]


def _shown_strength(r: pd.Series, summary: pd.DataFrame, defense: str) -> object:
    """The strength a scores row describes: its best strength, or for a defense without one, the strength at
    which its row's leakages were reported (its strongest: the lowest worst-attack leakage)."""
    if not pd.isna(r["best_strength"]):
        return r["best_strength"]
    rows = summary[(summary["defense"] == defense)].dropna(subset=["attack"])
    if rows["strength"].isna().all():
        return None
    worst = rows.groupby("strength")["leakage_mean"].max()
    return float(worst.idxmin())


def table(name: str, directory: Path, utility: str = "final", seeds: list[int] | None = None) -> list[str]:
    """The ours-vs-paper markdown for one setting: verdicts and leakages as means with 95% intervals over
    seeds × repeats, S*_PU over the strengths that measurably protect (vflbench's scores.csv)."""
    _, title, attacks = SETTINGS[name]
    summary, scores = load(directory, utility, seeds)
    n_seeds = summary["seed"].nunique()
    repeats = int(summary["repeats"].max()) if "repeats" in summary else 1
    base = summary[summary["defense"] == "none"]
    util = 100 * base.groupby("seed")["utility"].first().mean()
    util_std = 100 * base.groupby("seed")["utility"].first().std()
    which = {
        "final": "utility of the final epoch (as `vflbench sweep` reports it)",
        "best": "utility of the best epoch (test AUC, max over epochs: a test-set oracle)",
    }[utility]
    lines = [
        f"### {title}, {which}" + (f", seed {', '.join(map(str, seeds))} only" if seeds else ""),
        "",
        f"Ours: {n_seeds} seed(s) × up to {repeats} attack repeat(s); utility without protection {util:.1f}"
        + (f" ± {util_std:.1f} (sd over seeds)" if n_seeds > 1 else "")
        + f" AUC (paper {PAPER_UTILITY}). ε_p: ours as mean [95% interval over seeds × repeats] / the paper's; "
        "bold = the paper's value lies outside our interval and more than 5 points from our mean. A protection "
        "gets S*_PU only over the strengths where it lowers the worst attack measurably; one that never does "
        "is shown at its strongest strength with verdict 'none measurable'.",
        "",
        "| protection | verdict | strength (ours) | ε_u | "
        + " | ".join(f"ε_p {SHORT[a]}" for a in attacks)
        + " | S*_PU (ours / paper) |",
        "|---|---|---:|---:|" + "---|" * len(attacks) + "---:|",
    ]
    attacked = summary.dropna(subset=["attack"])
    for defense in ORDER:
        row = scores[scores["defense"] == defense]
        if row.empty:
            continue
        r = row.iloc[0]
        p_u, p_leak, p_s = PAPER[name][defense]
        strength = _shown_strength(r, summary, defense)
        at = _at(attacked, defense, strength)
        loss = float(at["utility_loss"].mean()) if not at.empty else math.nan
        verdict = {
            "protects": "protects",
            "no measurable protection": "none measurable",
            "no protection (baseline)": "–",
            "not scored": "not scored",
        }.get(str(r.get("verdict")), "")
        cells = [NAMES[defense], verdict, _strength(strength), _pair(loss, p_u)]
        for a in attacks:
            group = at[at["attack"] == a]
            paper = p_leak.get(a)
            text = f"{_interval(group)} / {_fmt(paper)}"
            if not group.empty and paper is not None:
                g = group.iloc[0]
                low, high = g.get("leakage_ci_low"), g.get("leakage_ci_high")
                outside = pd.isna(low) or not (low <= paper <= high)
                if outside and abs(float(g["leakage_mean"]) - paper) > 5:
                    text = f"**{text}**"
            cells.append(text)
        s_pu = "–" if pd.isna(r.get("s_pu")) else str(int(r["s_pu"]))
        cells.append(f"{s_pu} / {p_s}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Every strength (ε_p: mean [95% interval]; change: the interval of ε_p − ε_p(undefended) of the "
        "worst attack lies below 0 = lower):",
        "",
        "| protection | strength | ε_u | "
        + " | ".join(f"ε_p {SHORT[a]}" for a in attacks)
        + " | worst attack's change | PU |",
        "|---|---:|---:|" + "---|" * len(attacks) + "---|---:|",
    ]
    for defense in ORDER:
        d = attacked[attacked["defense"] == defense]
        for strength, group in d.groupby("strength", dropna=False):
            loss = float(group["utility_loss"].mean())
            per = {a: group[group["attack"] == a] for a in attacks}
            worst = max((g for g in per.values() if not g.empty), key=lambda g: float(g.iloc[0]["leakage_mean"]))
            w = worst.iloc[0]
            change = "" if defense == "none" else str(w["change"])
            pu = "–" if change != "lower" else str(pu_score(float(w["leakage_mean"]), loss))
            cells = [NAMES[defense], _strength(strength), _fmt(loss)] + [_interval(per[a]) for a in attacks]
            cells += [change, pu if defense != "none" else "0"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def mc_logit_check(directory: Path, out: Path, data_root: str | None) -> list[str]:
    """Re-run every setting-3 point whose MC AUC is exactly 0.5 with a final checkpoint, and score
    the attacker's trained 1-FC bottom model by its logits instead of their float32 sigmoid.

    vflbench's VLR model completion scores ``sigmoid(u^B)``; when the passive bias drifts far
    (e.g. +48 under GC, whose top-|d| selection keeps mostly positives' residues) every sigmoid
    rounds to 1.0, the AUC is 0.5 and the leakage looks like zero, while the logits, which the
    attacker holds, rank the test rows exactly as before. AUC is rank-based, so scoring the logits
    is what the attack would do.
    """
    import torch
    import yaml
    from sklearn.metrics import roc_auc_score

    from vflbench.experiment.config import ExperimentConfig
    from vflbench.experiment.run import run_experiment
    from vflbench.experiment.scenario import load_vertical_data

    summary = pd.read_csv(directory / "summary.csv")
    flat = summary[(summary["attack"] == "model_completion") & (summary["attack_value"] == 0.5)]
    lines = [
        "### Setting 3: MC points with AUC exactly 0.5, scored by the attacker's logits",
        "",
        "| protection | strength | seed | MC AUC (sigmoid, vflbench) | MC AUC (logits) | prior (J_loc) "
        "| ε_p (logits) | passive bias |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for _, row in flat.sort_values(["defense", "strength", "seed"]).iterrows():
        raw = json.loads((directory / RUNS / row["config_hash"] / "result.json").read_text())
        config = yaml.safe_load((directory / RUNS / row["config_hash"] / "config.yaml").read_text())
        config["train"]["checkpoint"] = "final"
        cfg = ExperimentConfig.model_validate(config)
        run_dir = out / cfg.hash()
        if not (run_dir / "result.json").is_file():
            run_experiment(cfg, out_dir=out, data_root=data_root)
        state = torch.load(run_dir / "checkpoints" / "passive_1.bottom.final.pt")
        weight = next(v for k, v in state.items() if k.endswith("weight"))
        bias = next(v for k, v in state.items() if k.endswith("bias"))
        vd = load_vertical_data(cfg.resolved(), data_root)
        logits = (vd.passive[0].x_test.flatten(1) @ weight.T + bias).squeeze(1)
        auc = roc_auc_score(vd.y_test.cpu().numpy(), logits.double().cpu().numpy())
        prior = raw["attacks"][0]["prior"]
        lines.append(
            f"| {NAMES[row['defense']]} | {_strength(row['strength'])} | {row['seed']} | "
            f"{100 * row['attack_value']:.1f} | {100 * auc:.1f} | {100 * prior:.1f} | "
            f"{100 * (auc - prior):.1f} | {float(bias[0]):+.1f} |"
        )
    return lines + [""]


def main() -> None:
    """Optionally run the sweeps, then print (and write) the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=Path, default=ROOT / "runs" / "kang", help="parent of setting1..3 sweep dirs")
    ap.add_argument("--run", action="store_true", help="run (resume) the sweeps first")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--table", type=Path, help="write the markdown here")
    ap.add_argument(
        "--utility",
        nargs="+",
        choices=["final", "best"],
        default=["final"],
        help="utility of the final epoch (vflbench's; the default) and/or of the best epoch (the "
        "test-set maximum: an oracle, only to compare with a paper that reports it)",
    )
    ap.add_argument("--seeds", type=int, nargs="+", help="keep only these seeds (default: all)")
    ap.add_argument(
        "--mc-logits",
        type=Path,
        metavar="DIR",
        help="re-run setting-3 points whose MC AUC is 0.5 into DIR and score them by logits",
    )
    ap.add_argument("--only", nargs="+", choices=sorted(SETTINGS), default=sorted(SETTINGS))
    swap.add_arguments(ap)
    args = ap.parse_args()
    swapped = swap.overrides(args)
    out: list[str] = []
    for name in args.only:
        directory = args.sweeps / f"{name}{swap.tag(swapped)}"
        if swapped:
            out.append(f"{name} with{swap.label(swapped)} (the paper's columns are for its Credit data)")
        if args.run:
            run_sweep(
                swap.check(ROOT / SETTINGS[name][0], swapped),
                directory,
                resume=True,
                workers=args.workers,
                data_root=args.data_root,
            )
        if not (directory / "scores.csv").is_file():
            print(f"{directory}: no scores.csv (run the sweep first, or pass --run)")
            continue
        for utility in args.utility:
            out += table(name, directory, utility, args.seeds)
    setting3 = args.sweeps / f"setting3{swap.tag(swapped)}"
    if args.mc_logits and (setting3 / "summary.csv").is_file():
        out += mc_logit_check(setting3, args.mc_logits, args.data_root)
    text = "\n".join(out)
    print(text)
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(text + "\n")


if __name__ == "__main__":
    main()
