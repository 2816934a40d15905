"""VMask (Tan et al., NDSS 2025) Table II over seeds: every row as mean [95% interval] beside the paper's numbers.

Reads the sweeps of ``configs/repro/vmask_table2_seeds_<pair>.yaml`` (Vanilla, VMask, VMask-AS, VMask-RS,
VMask-ALLS; seeds 0-2; the paper's attacker ``model_completion`` with the masked layers re-initialised, and the
adaptive attacker ``vmask_weight_recovery``), written by ``vflbench sweep`` (run them first; they resume):

    vflbench sweep configs/repro/vmask_table2_seeds_tabmnist_mlp3.yaml --out runs/vmask_seeds_tabmnist_mlp3 \\
        --data-root ../shared/datasets --workers 1 --resume

Every run's ``result.json`` is read with :meth:`vflbench.experiment.results.RunResult.from_dict`. Per row: main
accuracy, the paper's attacker's accuracy, the scratch prior (the same model completion on a randomly initialised
bottom model), the leakage (attack − prior, points, larger = more leakage) of both attackers, and each attacker's
leakage change against Vanilla (paired by seed), each as the mean over seeds with its 95% Student-t interval over
the per-seed values (:mod:`vflbench.metrics.stats`; each seed's value is the mean over its attack repeats). The
selection rule each attack used (``details.selection``) is read from the results and printed. With ``--data`` it
writes ``tables.md`` and copies each sweep's ``summary.csv`` to ``<pair>_summary.csv``.

Run:  .venv/bin/python benchmarks/vmask_table2.py --sweeps runs [--data docs/data/vmask_table2]
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections import defaultdict
from pathlib import Path

import pandas as pd
from intervals import show, show_mean

from vflbench.experiment.results import RunResult, write_atomic
from vflbench.experiment.sweep import RUNS
from vflbench.metrics.stats import difference_interval, mean_interval

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {
    "tabmnist_mlp3": ("TabMNIST, MLP3", "configs/repro/vmask_table2_seeds_tabmnist_mlp3.yaml"),
    "mnist_lenet5": ("MNIST, LeNet5", "configs/repro/vmask_table2_seeds_mnist_lenet5.yaml"),
}
ROWS = {"none": "Vanilla", "vmask": "VMask", "vmask_as": "VMask-AS", "vmask_rs": "VMask-RS", "vmask_alls": "VMask-ALLS"}
REINIT, ADAPTIVE = "model_completion", "vmask_weight_recovery"

#: The paper's Table II (%, each the average of 3 trainings x 5 attack runs, on the best model of the training
#: history): pair -> (scratch attack accuracy, {row: (main accuracy, MC attack accuracy)}). MLP3: the TM column;
#: LeNet5: the M column.
PAPER: dict[str, tuple[float, dict[str, tuple[float, float]]]] = {
    "tabmnist_mlp3": (
        41.35,
        {
            "none": (99.02, 80.72),
            "vmask": (99.00, 42.85),
            "vmask_as": (99.01, 43.44),
            "vmask_rs": (98.95, 43.81),
            "vmask_alls": (99.02, 42.60),
        },
    ),
    "mnist_lenet5": (
        37.67,
        {
            "none": (98.72, 79.44),
            "vmask": (98.66, 38.64),
            "vmask_as": (98.72, 37.95),
            "vmask_rs": (98.70, 41.84),
            "vmask_alls": (98.69, 38.27),
        },
    ),
}


def load(directory: Path) -> dict[str, list[RunResult]]:
    """The sweep's results by row (defense name, ``none`` for Vanilla), one per seed."""
    summary = pd.read_csv(directory / "summary.csv")
    rows: dict[str, list[RunResult]] = defaultdict(list)
    for run_hash in summary["config_hash"].unique():
        result = RunResult.from_dict(json.loads((directory / RUNS / run_hash / "result.json").read_text()))
        rows[result.defense[0]["name"] if result.defense else "none"].append(result)
    return rows


def per_seed(results: list[RunResult], attack: str, field: str) -> dict[int, list[float]]:
    """seed -> the attack's per-repeat ``values``/``priors`` (as %) or ``leakages`` (points)."""
    out = {}
    for r in results:
        a = next(a for a in r.attacks if a.name == attack)
        scale = 1.0 if field == "leakages" else 100.0
        out[r.seed] = [scale * v for v in getattr(a, field)]
    return out


def selections(rows: dict[str, list[RunResult]]) -> dict[str, set[str]]:
    """attack -> the selection rules its runs recorded (``details.selection``)."""
    rules: dict[str, set[str]] = defaultdict(set)
    for results in rows.values():
        for r in results:
            for a in r.attacks:
                rules[a.name].add(str(a.details.get("selection", "?")))
    return rules


def change(key: str, results: list[RunResult], vanilla: list[RunResult], attack: str) -> str:
    """The attack's leakage minus Vanilla's, paired by seed, with ``lower`` when its interval lies below 0."""
    if key == "none" or not vanilla:
        return "–"
    delta = difference_interval(per_seed(results, attack, "leakages"), per_seed(vanilla, attack, "leakages"))
    return show(delta, "+") + (" lower" if delta.below(0.0) else "")


def table(pair: str, directory: Path) -> str:
    """The markdown of one pair: notes, then one line per row."""
    title, config = PAIRS[pair]
    rows = load(directory)
    mask = pd.read_csv(directory / "summary.csv").drop_duplicates("config_hash").groupby("defense")["mask_ratio"]
    masks = {str(d).split(" ")[0]: float(v) for d, v in mask.mean().items()}
    scratch, paper = PAPER[pair]
    seeds = sorted({r.seed for results in rows.values() for r in results})
    repeats = sorted({len(a.values) for results in rows.values() for r in results for a in r.attacks})
    rules = selections(rows)
    vanilla = rows.get("none", [])
    lines = [
        f"### {title} (`{config}`)",
        "",
        f"Ours: seeds {seeds} × {'/'.join(map(str, repeats))} attack repeat(s) per trained model; every cell is "
        "the mean over seeds [95% Student-t interval over the per-seed means, "
        f"{len(seeds) - 1} degrees of freedom] (vflbench.metrics.stats), accuracies in %, leakages in points "
        "(attack − scratch prior, larger = more leakage). Change vs Vanilla: the leakage minus Vanilla's, paired "
        "by seed; 'lower' when its interval lies below 0. Selection rule (the attacks' `select`, read from "
        "result.json): "
        + "; ".join(f"{a}: {', '.join(sorted(s))}" for a, s in sorted(rules.items()))
        + " (the library's default; no epoch is selected on the test split). The paper: Table II, the average "
        "of 3 trainings × 5 attack runs on the best model of the training history, no interval.",
        "",
        "| row | main acc. | paper main | paper's attacker (reinit) acc. | paper attack | scratch prior | paper "
        "scratch | leakage, reinit | paper leakage | change vs Vanilla, reinit | leakage, adaptive (solve) | "
        "change vs Vanilla, adaptive | mask ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, name in ROWS.items():
        results = rows.get(key)
        if not results:
            continue
        main = mean_interval({r.seed: [100.0 * r.utility.value] for r in results})
        cells = [
            name,
            show(main),
            f"{paper[key][0]:.2f}",
            show_mean(per_seed(results, REINIT, "values")),
            f"{paper[key][1]:.2f}",
            show_mean(per_seed(results, REINIT, "priors")),
            f"{scratch:.2f}",
            show_mean(per_seed(results, REINIT, "leakages"), "+"),
            f"{paper[key][1] - scratch:+.2f}",
        ]
        cells += [
            change(key, results, vanilla, REINIT),
            show_mean(per_seed(results, ADAPTIVE, "leakages"), "+"),
            change(key, results, vanilla, ADAPTIVE),
        ]
        cells.append("–" if key == "none" else f"{masks.get(key, float('nan')):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    per = {
        name: ", ".join(
            f"{100.0 * next(a for a in r.attacks if a.name == REINIT).value:.2f}"
            for r in sorted(rows.get(key, []), key=lambda r: r.seed)
        )
        for key, name in ROWS.items()
        if rows.get(key)
    }
    lines += ["", "Per seed, paper's attacker (%): " + "; ".join(f"{n} {v}" for n, v in per.items()) + ".", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print (and with ``--data`` write) the tables of the pairs whose sweeps have a summary.csv."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=Path, default=ROOT / "runs", help="parent of the vmask_seeds_<pair> sweeps")
    parser.add_argument("--data", type=Path, default=None, help="write tables.md and <pair>_summary.csv here")
    parser.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=list(PAIRS))
    args = parser.parse_args(argv)
    parts = []
    for pair in args.pairs:
        directory = args.sweeps / f"vmask_seeds_{pair}"
        if not (directory / "summary.csv").is_file():
            parts.append(f"### {PAIRS[pair][0]}: no {directory / 'summary.csv'} (run the sweep first)\n")
            continue
        parts.append(table(pair, directory))
        if args.data:
            args.data.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(directory / "summary.csv", args.data / f"{pair}_summary.csv")
    text = "\n".join(parts)
    print(text)
    if args.data:
        write_atomic(args.data / "tables.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
