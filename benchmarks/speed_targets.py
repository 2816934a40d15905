"""The four speed ratios users wait for, each pair measured side by side in one run.

Rows (targets in brackets):

- ``vmask_small``: VMask / vanilla training seconds (end-of-epoch work included), MLP3 bottoms on the
  embedded ``digits`` data, batch 64, 10 epochs; the two runs alternate ``--repeat`` times in this
  process and the ratio of the medians is reported [<= 3x];
- ``vmask_large``: VMask / vanilla per epoch for MLP3/TabMNIST and LeNet5/MNIST, batch 128, from
  ``vmask_speed.py`` (interleaved blocks of steps plus the end-of-epoch work) [<= 2x];
- ``kang_attacks``: the six label attacks of ``configs/repro/kang_credit_vlr.yaml``: attack seconds /
  training seconds of the same run [<= 2x];
- ``sweep_workers``: ``vflbench sweep --workers 1`` / ``--workers 2`` wall time for runs of 5-15 s,
  from ``sweep_workers.py`` (fresh subprocesses, alternating order) [>= 1.85x].

Run:  .venv/bin/python benchmarks/speed_targets.py --data-root ../shared/datasets [--rows ...] [--json F]

Every row records the machine's 1-minute load average before and after: on a shared machine the
load moves the numbers more than anything else.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from vflbench.experiment.config import build_config, load_config
from vflbench.experiment.run import run_experiment

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("vmask_small", "vmask_large", "kang_attacks", "sweep_workers")


def load() -> float:
    """The 1-minute load average."""
    return round(os.getloadavg()[0], 2)


def vmask_small(repeat: int) -> dict[str, Any]:
    """VMask vs vanilla on digits (MLP3, batch 64, 10 epochs), alternating runs in this process."""
    raw = {
        "data": {"name": "digits", "parties": 2, "aux_pool": 200},
        "model": {"bottom": "mlp3", "top": "mlp2"},
        "train": {"algorithm": "vhnn", "epochs": 10, "batch_size": 64, "lr": 0.1, "threads": 1, "checkpoint": "none"},
        "seed": 0,
    }
    seconds: dict[str, list[float]] = {"vanilla": [], "vmask": []}
    before = load()
    with tempfile.TemporaryDirectory() as out:
        run_experiment(build_config(raw), out_dir=out)  # warm-up: imports and first-call costs
        for _ in range(repeat):
            for name, defenses in (("vanilla", []), ("vmask", [{"name": "vmask"}])):
                result = run_experiment(build_config({**raw, "defenses": defenses}), out_dir=out)
                seconds[name].append(result.timing.train_seconds)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    return {
        "row": "vmask_small",
        "seconds": seconds,
        "ratio": med["vmask"] / med["vanilla"],
        "target": "<= 3",
        "load": [before, load()],
    }


def vmask_large(data_root: str) -> dict[str, Any]:
    """``vmask_speed.py``'s per-epoch ratios (first layer masked, VMask's steady state)."""
    import vmask_speed

    clock = vmask_speed.DealerClock()
    clock.install()
    before = load()
    results = [vmask_speed.measure(d, b, data_root, 5, 20, clock) for d, b in vmask_speed.CASES]
    ratio = {f"{r['bottom']}/{r['dataset']}": r["per_epoch_ratio"]["vmask (layer 1 masked)"] for r in results}
    return {"row": "vmask_large", "ratio": ratio, "details": results, "target": "<= 2", "load": [before, load()]}


def kang_attacks(data_root: str) -> dict[str, Any]:
    """Attack seconds / training seconds of Kang's credit VLR run with all six label attacks."""
    cfg = load_config(ROOT / "configs" / "repro" / "kang_credit_vlr.yaml", [f"data.root={data_root}"])
    before = load()
    with tempfile.TemporaryDirectory() as out:
        result = run_experiment(cfg, out_dir=out)
    attacks = result.timing.attack_seconds
    return {
        "row": "kang_attacks",
        "train_seconds": result.timing.train_seconds,
        "attack_seconds": attacks,
        "ratio": sum(attacks.values()) / result.timing.train_seconds,
        "target": "<= 2",
        "load": [before, load()],
    }


def sweep_workers(epochs: int, runs: int = 8) -> dict[str, Any]:
    """1-worker / 2-worker wall time of one sweep (``runs`` runs of breast_cancer; 400 epochs: runs of 5-15 s here), as
    fresh CLI processes, with the start-up of one fresh worker process (its imports) measured before.

    Compare ``one["sum_run_s"]`` with ``two["sum_run_s"]``: when they differ by much more than the start-up, the
    two workers did not get two cores (other load), and the ratio says nothing about the sweep."""
    import sweep_workers as sw

    raw = sw.sweep_config(runs, epochs, 32)
    before = load()
    startup = sw.startup_seconds()
    one = sw.measure(raw, 1, "cli")
    two = sw.measure(raw, 2, "cli")
    return {
        "row": "sweep_workers",
        "epochs": epochs,
        "runs": runs,
        "startup_s": startup,
        "one": one,
        "two": two,
        "ratio": one["wall_s"] / two["wall_s"],
        "target": ">= 1.85",
        "load": [before, load()],
    }


def main() -> None:
    """Measure the chosen rows, print a table and optionally save the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", default=os.environ.get("VFLBENCH_DATA"))
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    ap.add_argument("--repeat", type=int, default=3, help="alternating repeats of the vmask_small pair")
    ap.add_argument("--sweep-epochs", type=int, default=400, help="epochs of each sweep run (sets the run length)")
    ap.add_argument(
        "--sweep-runs",
        type=int,
        default=8,
        help="runs in the sweep (a multiple of 4: baseline + 3 defenses, times seeds)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if {"vmask_large", "kang_attacks"} & set(args.rows) and not args.data_root:
        raise SystemExit("--data-root (or $VFLBENCH_DATA) is needed for the vmask_large and kang_attacks rows")
    results = []
    for row in args.rows:
        if row == "vmask_small":
            results.append(vmask_small(args.repeat))
        elif row == "vmask_large":
            results.append(vmask_large(args.data_root))
        elif row == "kang_attacks":
            results.append(kang_attacks(args.data_root))
        else:
            results.append(sweep_workers(args.sweep_epochs, args.sweep_runs))
        print(
            f"{row}: ratio {results[-1]['ratio']} (target {results[-1]['target']}), load {results[-1]['load']}",
            flush=True,
        )
    if args.json:
        args.json.write_text(
            json.dumps({"cpus": os.cpu_count(), "torch": torch.__version__, "rows": results}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
