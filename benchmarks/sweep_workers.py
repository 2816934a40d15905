"""Wall time of one sweep run with 1 worker and with 2 workers, in one invocation.

The same sweep of N small runs (by default 8: breast_cancer in VHNN, plain SGD, the
no-defense baseline plus max_norm, gradient_compression and discrete_sgd, two seeds each, with
norm scoring) is executed once per worker count, each time into a fresh directory (no cache, no
``--resume``), in two modes:

- ``cli``: ``vflbench sweep CONFIG --out DIR --workers N`` as a fresh subprocess, timed from
  outside: what a user of the command line waits for, Python start-up and imports included
  (one process with 1 worker; the main process plus N spawned workers otherwise);
- ``api``: ``vflbench.experiment.sweep.run_sweep(cfg, DIR, workers=N)`` in this process, after an
  untimed warm-up run that has paid this process's imports. One worker runs the points here;
  N workers run them in a ``ProcessPoolExecutor`` of spawned processes, whose start-up and
  imports are part of the measured time (that is the cost of the pool).

``--repeat`` repeats the whole comparison; the order of the worker counts alternates between
repeats so that a drift of the machine's load does not always favour the same one. The load
average before and after every measurement is recorded: on a shared machine it moves the
numbers more than anything else.

Run:  .venv/bin/python benchmarks/sweep_workers.py [--runs 8] [--epochs 40] [--repeat 2]
          [--workers 1 2] [--modes cli api] [--json /tmp/kang/sweep_workers.json]

Prints one line per measurement and a summary table (wall seconds, ratio to 1 worker,
speed-up, and the sum of the runs' own train + attack seconds from their result.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from vflbench.experiment.config import build_config
from vflbench.experiment.run import run_experiment
from vflbench.experiment.sweep import RUNS, expand, run_sweep

VFLBENCH = Path(sys.executable).with_name("vflbench")

#: Defenses without random noise, so that no run diverges and stops early (with noise, e.g.
#: isotropic_noise 5 at momentum 0.9, some runs hit NaN and end after a few epochs, which
#: makes the runs' lengths unequal and the comparison meaningless).
DEFENSES = [
    [{"name": "max_norm"}],
    [{"name": "gradient_compression", "strength": 0.5}],
    [{"name": "discrete_sgd", "strength": 12}],
]


def sweep_config(runs: int, epochs: int, batch_size: int) -> dict[str, Any]:
    """A sweep of ``runs`` points: baseline + defenses, times seeds (``runs`` must be a multiple of 4)."""
    if runs % 4:
        raise SystemExit("--runs must be a multiple of 4 (baseline + 3 defenses, times seeds)")
    return {
        "data": {"name": "breast_cancer", "parties": 2},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {
            "algorithm": "vhnn",
            "epochs": epochs,
            "batch_size": batch_size,
            "lr": 0.05,
            "momentum": 0.0,
            "metric": "auc",
            "threads": 1,
            "checkpoint": "none",
        },
        "attacks": [{"name": "norm_scoring"}],
        "seed": 0,
        "sweep": {"seeds": list(range(runs // 4)), "defenses": DEFENSES, "baseline": True},
    }


def loadavg() -> list[float]:
    """1-, 5- and 15-minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def _own_seconds(out: Path) -> tuple[int, float]:
    """Number of finished runs and the sum of their train + attack seconds."""
    total, n = 0.0, 0
    for run_dir in (out / RUNS).iterdir():
        timing = json.loads((run_dir / "result.json").read_text())["timing"]
        total += timing["train_seconds"] + sum(timing["attack_seconds"].values())
        n += 1
    return n, total


def measure(raw: dict[str, Any], workers: int, mode: str) -> dict[str, Any]:
    """Run the whole sweep with ``workers`` workers into a fresh directory; wall time and run times."""
    out = Path(tempfile.mkdtemp(prefix=f"sweep_workers_{mode}_{workers}_"))
    try:
        before = loadavg()
        if mode == "cli":
            config = out / "sweep.yaml.in"
            config.write_text(yaml.safe_dump(raw, sort_keys=False))
            tic = time.perf_counter()
            done = subprocess.run(
                [str(VFLBENCH), "sweep", str(config), "--out", str(out), "--workers", str(workers)],
                capture_output=True,
                text=True,
            )
            if done.returncode:
                raise SystemExit(f"vflbench sweep failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
            wall = time.perf_counter() - tic
        else:
            tic = time.perf_counter()
            run_sweep(build_config(raw), out, workers=workers)
            wall = time.perf_counter() - tic
        after = loadavg()
        n, own = _own_seconds(out)
        return {
            "mode": mode,
            "workers": workers,
            "wall_s": round(wall, 2),
            "runs": n,
            "sum_run_s": round(own, 2),
            "load_before": before,
            "load_after": after,
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)


STARTUP = (
    "import torch, vflbench.experiment.run, vflbench.attacks, vflbench.defenses; "
    "torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)"
)


def startup_seconds() -> float:
    """Wall time of a fresh Python that imports what a sweep worker needs (torch, vflbench, the
    scikit-learn and torch._dynamo imports the first run triggers): a worker's fixed cost."""
    tic = time.perf_counter()
    subprocess.run([sys.executable, "-c", STARTUP], check=True)
    return round(time.perf_counter() - tic, 2)


def warm_up(raw: dict[str, Any]) -> None:
    """One untimed short run in this process, so that ``api`` timings exclude its imports."""
    cfg = dict(raw, train=dict(raw["train"], epochs=1))
    cfg.pop("sweep")
    out = Path(tempfile.mkdtemp(prefix="sweep_workers_warmup_"))
    try:
        run_experiment(build_config(cfg), out_dir=out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    """Parse arguments, run the measurements, print and optionally save them."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8, help="points in the sweep (multiple of 4)")
    ap.add_argument("--epochs", type=int, default=40, help="training epochs per run (sets the run length)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--modes", nargs="+", choices=["cli", "api"], default=["cli", "api"])
    ap.add_argument("--repeat", type=int, default=1, help="repeat the whole comparison")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    args = ap.parse_args()

    raw = sweep_config(args.runs, args.epochs, args.batch_size)
    n_points = len(expand(build_config(raw)))
    info = {
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "runs": n_points,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
    }
    print(f"machine: {info['cpus']} CPUs ({info['affinity']} usable), {info['platform']}, torch {info['torch']}")
    print(f"sweep: {n_points} runs (breast_cancer VHNN, {args.epochs} epochs, batch {args.batch_size}, norm scoring)")
    if "api" in args.modes:
        warm_up(raw)
    results = []
    startups = []
    for rep in range(args.repeat):
        startups.append(startup_seconds())
        print(f"repeat {rep}: start-up of one fresh worker process {startups[-1]:.1f} s (load {loadavg()})", flush=True)
        for mode in args.modes:
            order = args.workers if rep % 2 == 0 else list(reversed(args.workers))
            for w in order:
                r = {"repeat": rep, **measure(raw, w, mode)}
                results.append(r)
                print(
                    f"repeat {rep} {mode} workers {w}: wall {r['wall_s']:.1f} s, sum of run times "
                    f"{r['sum_run_s']:.1f} s, load {r['load_before']} -> {r['load_after']}",
                    flush=True,
                )
    print()
    print(
        "| repeat | mode | workers | wall s | ratio to 1 worker | speed-up | sum of run times s "
        "| load 1-min before / after |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---|")
    for rep in range(args.repeat):
        for mode in args.modes:
            rows = [r for r in results if r["repeat"] == rep and r["mode"] == mode]
            base = next((r["wall_s"] for r in rows if r["workers"] == 1), None)
            for r in sorted(rows, key=lambda r: r["workers"]):
                ratio = f"{r['wall_s'] / base:.2f}" if base else "-"
                speed = f"{base / r['wall_s']:.2f}x" if base else "-"
                print(
                    f"| {rep} | {mode} | {r['workers']} | {r['wall_s']:.1f} | {ratio} | {speed} | "
                    f"{r['sum_run_s']:.1f} | {r['load_before'][0]} / {r['load_after'][0]} |"
                )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": info, "startup_s": startups, "results": results}, indent=2))


if __name__ == "__main__":
    main()
