"""VMask's noise σ against the attackers that keep their own weights (issue 25): run the σ sweeps, summarise them.

Runs (or resumes) ``configs/repro/vmask_sigma_<pair>.yaml`` for each pair (``tabmnist_mlp3``, ``mnist_lenet5``):
VMask-ALLS at every σ of the grid and the undefended run, seeds 0-2, each attack repeated ``evaluation.repeats``
times on every trained model. Every point is cached in ``OUT/<pair>/runs/<config hash>/`` by ``vflbench sweep``, so
a rerun (after an interruption, or with more σ values: ``--sigmas``) runs only the points it lacks. Then it writes,
per pair, ``DATA/vmask_sigma_<pair>.csv`` (one row per σ and attack) and ``DATA/vmask_sigma.json`` (all pairs),
and prints the tables of docs/notes/reproduction.md:

* main accuracy (%): mean and 95% interval over seeds; its loss against the undefended run of the same seed,
  paired by seed (``utility_loss``, points; positive = VMask costs accuracy);
* per attack (``model_completion``: the paper's reinit attacker; ``vmask_own_record``: P_k's own record, no solve;
  ``vmask_weight_recovery``: the solve): the attack accuracy, the leakage over the scratch prior (points) with its
  interval over seeds × repeats, and ε_p − ε_p(undefended) with its paired interval (summary.csv's columns).

A σ *protects* against an attack when the interval of ε_p − ε_p(undefended) lies below 0; it does so *at a cost
under 2 points* when the upper end of the utility loss's interval is below 2 (and, as a point estimate, when its
mean is).

Run:  .venv/bin/python benchmarks/vmask_sigma.py --out runs/vmask_sigma \\
          --data-root ../shared/datasets [--pairs tabmnist_mlp3 mnist_lenet5] [--sigmas 0.01 0.1 1.0] \\
          [--set data.test_size=2000] [--summarise-only]

``--set KEY=VALUE`` overrides every config (``vflbench run --set``; e.g. a reduced scale); such a sweep is stored in
``OUT/<pair>@<hash of the overrides>`` and its files in DATA carry the same suffix, so reduced and full-scale
results never mix.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path
from typing import Any

import pandas as pd
import swap

from vflbench.errors import VFLBenchError
from vflbench.experiment.config import ExperimentConfig, build_config
from vflbench.experiment.results import write_atomic
from vflbench.experiment.sweep import RUNS, _run_point, run_sweep
from vflbench.metrics.stats import difference_interval, mean_interval

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {
    "tabmnist_mlp3": "configs/repro/vmask_sigma_tabmnist_mlp3.yaml",
    "mnist_lenet5": "configs/repro/vmask_sigma_mnist_lenet5.yaml",
}
ATTACKS = ("model_completion", "vmask_own_record", "vmask_weight_recovery")
SHORT = {"model_completion": "reinit (paper)", "vmask_own_record": "own record", "vmask_weight_recovery": "solve"}
GRID_KEY = "defenses.0.sigma"
COST = 2.0
"""The accuracy cost (points) the issue asks about."""

log = logging.getLogger("vmask_sigma")


def config(pair: str, overrides: list[str], sigmas: list[float] | None) -> ExperimentConfig:
    """The pair's sweep config with ``overrides`` applied and, given ``sigmas``, that σ grid."""
    cfg = swap.check(ROOT / PAIRS[pair], overrides)
    if sigmas:
        raw = cfg.model_dump(mode="json")
        raw["sweep"]["grid"] = {GRID_KEY: [float(s) for s in sigmas]}
        cfg = build_config(raw)
    return cfg


FAILED = "failed.json"
"""Written into a point's run directory when its training fails (VMask's secret-shared layers overflow the
fixed-point ring when training diverges); the point is then not run again unless ``--retry-failed``."""


def runner(retry: bool):
    """A sweep point runner that records a failed training (:data:`FAILED`) instead of stopping the sweep."""

    def run(config: dict[str, Any], runs_dir: str, data_root: str | None) -> str:
        cfg = ExperimentConfig.model_validate(config)
        failed = Path(runs_dir) / cfg.hash() / FAILED
        if failed.is_file() and not retry:
            log.info("point %s failed before (%s); not run again", cfg.hash(), failed)
            return cfg.hash()
        try:
            return _run_point(config, runs_dir, data_root)
        except VFLBenchError as exc:
            sigma = cfg.defenses[0].params().get("sigma") if cfg.defenses else None
            log.warning("point %s (sigma %s, seed %d) failed: %s", cfg.hash(), sigma, cfg.seed, exc)
            failed.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(
                failed,
                json.dumps({"sigma": sigma, "seed": cfg.seed, "error": type(exc).__name__, "message": str(exc)}) + "\n",
            )
            return cfg.hash()

    return run


def failures(directory: Path) -> list[dict[str, Any]]:
    """The failed points recorded under ``directory`` (their σ, seed and error)."""
    return sorted(
        (
            json.loads(f.read_text())
            for f in (directory / RUNS).glob(f"*/{FAILED}")
            if not (f.parent / "result.json").is_file()
        ),
        key=lambda r: (r["sigma"], r["seed"]),
    )


def _interval(mean: float, low: float, high: float) -> dict[str, float]:
    return {"mean": round(mean, 2), "ci_low": round(low, 2), "ci_high": round(high, 2)}


def summarise(summary: pd.DataFrame, failed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per σ (and the undefended run, σ ``None``): utility with intervals, and per attack its value,
    leakage and ε_p − ε_p(undefended) with intervals (from the sweep's summary.csv), over the seeds whose training
    finished; ``failed_seeds``: those whose training failed (``failed``, :func:`failures`)."""
    runs = summary.drop_duplicates("config_hash")
    vanilla = {int(r.seed): 100.0 * float(r.utility) for r in runs[runs["defense"] == "none"].itertuples()}
    records = []
    for defense, group in summary.groupby("defense", sort=False):
        sigma = None if defense == "none" else float(str(defense).split("sigma=")[1].rstrip("]"))
        own = {int(r.seed): [100.0 * float(r.utility)] for r in group.drop_duplicates("config_hash").itertuples()}
        utility = mean_interval(own)
        loss = difference_interval(
            {s: [vanilla[s]] for s in own if s in vanilla}, {s: v for s, v in own.items() if s in vanilla}
        )
        record: dict[str, Any] = {
            "sigma": sigma,
            "seeds": sorted(own),
            "utility": _interval(utility.mean, utility.low, utility.high),
            "utility_loss": _interval(loss.mean, loss.low, loss.high),
        }
        record["cost_under_2_points"] = {"mean": bool(loss.mean < COST), "ci": bool(loss.high < COST)}
        for attack, rows in group.groupby("attack"):
            first = rows.iloc[0]
            entry: dict[str, Any] = {
                "attack_accuracy": round(100.0 * float(rows["attack_value"].mean()), 2),
                "prior": round(100.0 * float(rows["prior"].mean()), 2),
                "repeats": int(first["repeats"]),
                "leakage": _interval(first["leakage_mean"], first["leakage_ci_low"], first["leakage_ci_high"]),
            }
            if sigma is not None:
                entry["delta"] = _interval(first["delta_leakage"], first["delta_ci_low"], first["delta_ci_high"])
                entry["protects"] = bool(first["delta_ci_high"] < 0)
            record[str(attack)] = entry
        records.append(record)
    for f in failed:
        match = [r for r in records if r["sigma"] == f["sigma"]]
        if not match:
            match = [{"sigma": f["sigma"], "seeds": []}]
            records.append(match[0])
        match[0].setdefault("failed_seeds", []).append(f["seed"])
    return sorted(records, key=lambda r: -1.0 if r["sigma"] is None else r["sigma"])


def _cell(entry: dict[str, float], sign: bool = False) -> str:
    fmt = "{:+.2f}" if sign else "{:.2f}"
    if any(math.isnan(entry[k]) for k in ("ci_low", "ci_high")):
        return fmt.format(entry["mean"])
    return f"{fmt.format(entry['mean'])} [{entry['ci_low']:.2f}, {entry['ci_high']:.2f}]"


def table(records: list[dict[str, Any]]) -> str:
    """The markdown table of docs/notes/reproduction.md for one pair."""
    head = (
        ["σ", "main acc. (%)", "acc. loss (points)"]
        + [f"{SHORT[a]}: leakage" for a in ATTACKS]
        + [f"{SHORT[a]}: vs undefended" for a in ATTACKS]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in records:
        sigma = "none" if r["sigma"] is None else f"{r['sigma']:g}"
        if r.get("failed_seeds"):
            sigma += f" (training diverged: seed {', '.join(map(str, r['failed_seeds']))})"
        if not r["seeds"]:
            lines.append("| " + " | ".join([sigma] + ["–"] * (len(head) - 1)) + " |")
            continue
        cells = [sigma, _cell(r["utility"]), "–" if r["sigma"] is None else _cell(r["utility_loss"], sign=True)]
        cells += [_cell(r[a]["leakage"], sign=True) if a in r else "–" for a in ATTACKS]
        cells += ["–" if r["sigma"] is None or a not in r else _cell(r[a]["delta"], sign=True) for a in ATTACKS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    """Run (or resume) the sweeps, then write and print the summaries."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "vmask_sigma", help="sweep directories")
    parser.add_argument("--data", type=Path, default=ROOT / "docs" / "data", help="where the summaries go")
    parser.add_argument("--data-root", default=None, help="datasets root (else $VFLBENCH_DATA)")
    parser.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=list(PAIRS))
    parser.add_argument(
        "--sigmas",
        nargs="+",
        type=float,
        default=None,
        help="the σ grid (default: the config's); a sweep started with another grid is continued",
    )
    parser.add_argument("--summarise-only", action="store_true", help="run nothing; summarise the finished points")
    parser.add_argument("--retry-failed", action="store_true", help="run points whose training failed before again")
    swap.add_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    overrides = swap.overrides(args)
    suffix = swap.tag(overrides)
    everything = {}
    for pair in args.pairs:
        cfg = config(pair, overrides, args.sigmas)
        directory = args.out / f"{pair}{suffix}"
        if args.summarise_only:
            summary = pd.read_csv(directory / "summary.csv")
        else:
            summary = run_sweep(
                cfg,
                directory,
                resume=(directory / "sweep.yaml").is_file(),
                force=True,
                data_root=args.data_root,
                workers=1,
                runner=runner(args.retry_failed),
                on_done=lambda point: log.info("done: %s", point.coords),
            )
        failed = failures(directory)
        records = summarise(summary, failed)
        everything[pair + suffix] = {
            "config": PAIRS[pair],
            "overrides": overrides,
            "records": records,
            "failed": failed,
        }
        rows = []
        for r in records:
            for attack in ATTACKS:
                if attack not in r:
                    continue
                e = r[attack]
                rows.append(
                    {
                        "sigma": r["sigma"],
                        "attack": attack,
                        "seeds": len(r["seeds"]),
                        "repeats": e["repeats"],
                        **{f"utility_{k}": v for k, v in r["utility"].items()},
                        **{f"utility_loss_{k}": v for k, v in r["utility_loss"].items()},
                        "attack_accuracy": e["attack_accuracy"],
                        "prior": e["prior"],
                        **{f"leakage_{k}": v for k, v in e["leakage"].items()},
                        **{f"delta_{k}": v for k, v in e.get("delta", {}).items()},
                        "protects": e.get("protects"),
                        "failed_seeds": " ".join(map(str, r.get("failed_seeds", []))),
                    }
                )
        args.data.mkdir(parents=True, exist_ok=True)
        write_atomic(args.data / f"vmask_sigma_{pair}{suffix}.csv", pd.DataFrame(rows).to_csv(index=False))
        print(f"\n{pair}{swap.label(overrides)}\n\n{table(records)}")
        for f in failed:
            print(f"training failed at sigma {f['sigma']}, seed {f['seed']}: {f['error']}: {f['message']}")
    path = args.data / f"vmask_sigma{suffix}.json"
    previous = json.loads(path.read_text()) if path.is_file() else {}
    write_atomic(path, json.dumps({**previous, **everything}, indent=1, allow_nan=True) + "\n")


if __name__ == "__main__":
    main()
