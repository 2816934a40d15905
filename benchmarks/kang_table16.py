"""Kang et al. Table 16 on MNIST from its two three-seed sweeps: model inversion against MixUp and PRECODE.

Reads the sweeps of ``configs/kang/table16_{vhnn,vsnn}_mnist_mi.yaml`` (run them first, see the configs) and
prints the table of docs/papers/kang.md: per algorithm and protection, the utility loss ε_u in accuracy points
(undefended minus defended, paired by seed), the SSIM of query-free (Kang's) and black-box model inversion, and
their MSE against the aux-mean guess, each as a mean with its 95% t interval over the seeds, beside the paper's
(FMNIST, one number each); the change in black-box SSIM from no protection is paired by seed (an interval that
excludes 0 is a measurable change).

    python benchmarks/kang_table16.py --vhnn runs/kang/table16_vhnn --vsnn runs/kang/table16_vsnn
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from intervals import show, show_mean

from vflbench.experiment.results import read_result
from vflbench.experiment.sweep import RUNS
from vflbench.metrics.stats import difference_interval

#: Kang Table 16 (FMNIST): protection -> {algorithm: (ε_u in accuracy points, ε_p = SSIM)}; "none" holds the
#: unprotected accuracy in place of ε_u.
PAPER: dict[str, dict[str, tuple[float, float]]] = {
    "none": {"vhnn": (90.67, 0.34), "vsnn": (86.58, 0.52)},
    "mixup 2": {"vhnn": (0.16, 0.22), "vsnn": (0.10, 0.30)},
    "mixup 3": {"vhnn": (2.32, 0.12), "vsnn": (1.67, 0.19)},
    "mixup 4": {"vhnn": (3.08, 0.07), "vsnn": (1.98, 0.17)},
    "precode": {"vhnn": (0.07, 0.02), "vsnn": (0.68, 0.02)},
}

PerSeed = dict[int, list[float]]


def protection(defense: list[dict]) -> str:
    """The row a run belongs to: ``none``, ``mixup <n>`` or ``precode``."""
    if not defense:
        return "none"
    d = defense[0]
    return f"mixup {d['params'].get('n_mix', 2)}" if d["name"] == "mixup" else d["name"]


def load(sweep: Path) -> dict[str, dict[str, PerSeed]]:
    """Per protection, per measure (``acc``, ``ssim_query_free``, ``mse_black_box``, ...): the value of each seed."""
    rows: dict[str, dict[str, PerSeed]] = defaultdict(lambda: defaultdict(dict))
    for path in sorted((sweep / RUNS).glob("*/result.json")):
        result = read_result(path)
        row = rows[protection(result.defense)]
        row["acc"][result.seed] = [100.0 * result.utility.value]
        for attack in result.attacks:
            mode = attack.details["mode"]
            row[f"ssim_{mode}"][result.seed] = [float(attack.details["ssim"])]
            row[f"mse_{mode}"][result.seed] = [float(attack.value)]
            row["mse_prior"][result.seed] = [float(attack.prior)]
    return rows


def table(sweeps: dict[str, Path]) -> str:
    """The markdown table for the algorithms' sweeps."""
    lines = [
        "| algorithm | protection | ε_u ours (points) / paper | SSIM query-free ours / paper | SSIM black-box ours "
        "| Δ SSIM black-box vs none | MSE query-free | MSE black-box | aux-mean guess MSE | seeds |",
        "|---|---|---|---|---|---|---|---|---|---:|",
    ]
    for algorithm, sweep in sweeps.items():
        rows = load(sweep)
        none = rows.get("none", {})
        base = none.get("acc", {})
        for name, by_algorithm in PAPER.items():
            paper_u, paper_p = by_algorithm[algorithm]
            row = rows.get(name)
            if row is None:
                lines.append(
                    f"| {algorithm.upper()} | {name} | not run / {paper_u:.2f} | not run / {paper_p:.2f} ||||||0|"
                )
                continue
            if name == "none":
                utility = f"0 (accuracy {show_mean(row['acc'])}) / 0 (accuracy {paper_u:.2f})"
            else:
                utility = f"{show(difference_interval(base, row['acc']), '+')} / {paper_u:.2f}"
            drop = difference_interval(row["ssim_black_box"], none.get("ssim_black_box", {}))
            change = "–" if name == "none" else show(drop, "+", 3)
            lines.append(
                f"| {algorithm.upper()} | {name} | {utility} "
                f"| {show_mean(row['ssim_query_free'], digits=3)} / {paper_p:.2f} "
                f"| {show_mean(row['ssim_black_box'], digits=3)} "
                f"| {change} "
                f"| {show_mean(row['mse_query_free'], digits=4)} "
                f"| {show_mean(row['mse_black_box'], digits=4)} "
                f"| {show_mean(row['mse_prior'], digits=4)} | {len(row['acc'])} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table (and write it with ``--out``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vhnn", type=Path, default=Path("runs/kang/table16_vhnn"), help="the VHNN sweep's directory")
    p.add_argument("--vsnn", type=Path, default=Path("runs/kang/table16_vsnn"), help="the VSNN sweep's directory")
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    text = table({"vhnn": args.vhnn, "vsnn": args.vsnn})
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
