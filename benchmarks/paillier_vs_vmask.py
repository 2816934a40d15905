"""Training cost of the Paillier-HE baseline (``paillier_he``) against plaintext VFL (VMask Table III style).

Every method trains the same federation (2 parties, VHNN, concat, bottom MLP2 with a
``--hidden``-wide hidden layer and a ``--embed-dim`` embedding, top MLP2, SGD lr 0.1 without
momentum, batch ``--batch``) on the same shuffled batches of a TabMNIST subsample, one torch
thread. Only the defense list differs. Each method runs ``--warmup`` untimed steps, then its timed
steps (``Federation.train_step``: forward, top, backward, the passive party's update -- for
``paillier_he`` all of its encryption, homomorphic products, decryption and re-randomisation).

Reported per method: the median seconds per training step (MEASURED), and per-epoch times
EXTRAPOLATED as median step time x steps per epoch, for the subsample and for the full 60,000-row
TabMNIST training set (the HE runs are far too slow to time whole epochs; evaluation is excluded,
as in an epoch time of the training loop), and bytes per step (the loop's channel plus the HE
side exchanges). Key generation is timed separately.

To add a method (e.g. VMask once its defense is registered), append an entry to ``METHODS``:
``Method("vmask", "VMask", [{"name": "vmask", ...}])`` and pass ``--methods ... vmask``.

Run: .venv/bin/python benchmarks/paillier_vs_vmask.py --data-root /work/shared/datasets \\
         --out /tmp/he/paillier_vs_vmask.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import torch

from vflbench.config import build_config
from vflbench.eval.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.protocol import Federation

FULL_TRAIN_ROWS = {"tabmnist": 60000, "digits": 1437}


@dataclass(frozen=True)
class Method:
    """One row of the table: a key, a label and the defense specs of the run."""

    key: str
    label: str
    defenses: list[dict[str, Any]] = field(default_factory=list)
    steps: str = "plain"  # which step budget applies: "plain" (--steps) or "slow" (--slow-steps)


METHODS = [
    Method("vanilla", "Vanilla VFL (plaintext)"),
    Method("he1024", "paillier_he, 1024-bit key", [{"name": "paillier_he", "key_bits": 1024}], "slow"),
    Method("he2048", "paillier_he, 2048-bit key", [{"name": "paillier_he", "key_bits": 2048}], "slow"),
    # Method("vmask", "VMask", [{"name": "vmask"}]),  # added by the lead once the vmask defense lands
]


def make_federation(args: argparse.Namespace, method: Method) -> tuple[Federation, int, float]:
    """The federation for ``method``, the number of training rows, and the key generation seconds."""
    cfg = build_config({
        "data": {"name": args.dataset, "parties": 2, "train_size": args.rows, "test_size": 64},
        "model": {"bottom": "mlp2", "top": "mlp2", "embed_dim": args.embed_dim,
                  "bottom_options": {"hidden": args.hidden}},
        "train": {"algorithm": "vhnn", "aggregation": "concat", "batch_size": args.batch, "lr": 0.1,
                  "momentum": 0.0, "optimizer": "sgd"},
        "defenses": method.defenses,
        "seed": args.seed,
    })
    vd = load_vertical_data(cfg, args.data_root)
    fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1"]))
    holder = getattr(fed.active.defenses[0], "holder_", None) if fed.active.defenses else None
    return fed, len(vd.y_train), holder.keygen_seconds if holder is not None else 0.0


def side_bytes(fed: Federation) -> int:
    holder = getattr(fed.active.defenses[0], "holder_", None) if fed.active.defenses else None
    return holder.comm.bytes_up + holder.comm.bytes_down if holder is not None else 0


def breakdown(fed: Federation) -> dict[str, float]:
    """Seconds spent in each HE phase so far (passive layer and active key holder)."""
    out: dict[str, float] = {}
    for m in fed.passives[0].bottom.modules():
        for k, v in getattr(m, "seconds", {}).items():
            out[f"passive_{k}"] = out.get(f"passive_{k}", 0.0) + v
    holder = getattr(fed.active.defenses[0], "holder_", None) if fed.active.defenses else None
    if holder is not None:
        out.update({f"active_{k}": v for k, v in holder.seconds.items()})
    return out


def run_method(args: argparse.Namespace, method: Method) -> dict[str, Any]:
    fed, n, keygen = make_federation(args, method)
    steps = args.steps if method.steps == "plain" else args.slow_steps
    g = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(n, generator=g)
    per_epoch = -(-n // args.batch)
    times: list[float] = []
    bytes_before = side_before = 0
    for step in range(args.warmup + steps):
        k = step % per_epoch
        ids = order[k * args.batch : (k + 1) * args.batch]
        if step == args.warmup:
            bytes_before = fed.channel.train.bytes_up + fed.channel.train.bytes_down
            side_before = side_bytes(fed)
            phases_before = breakdown(fed)
        tic = time.perf_counter()
        fed.train_step(ids, epoch=0, step=k)
        if step >= args.warmup:
            times.append(time.perf_counter() - tic)
        if args.verbose and method.steps == "slow":
            print(f"  {method.key} step {step}: {time.perf_counter() - tic:.2f} s", flush=True)
    channel = fed.channel.train.bytes_up + fed.channel.train.bytes_down - bytes_before
    side = side_bytes(fed) - side_before
    phases = {k: (v - phases_before.get(k, 0.0)) / steps for k, v in breakdown(fed).items()}
    median = statistics.median(times)
    full = FULL_TRAIN_ROWS.get(args.dataset, n)
    return {
        "key": method.key, "label": method.label, "defenses": method.defenses, "steps_timed": steps,
        "step_seconds": times, "median_step_seconds": median,
        "epoch_seconds_subsample_extrapolated": median * per_epoch, "steps_per_epoch_subsample": per_epoch,
        "epoch_seconds_full_extrapolated": median * -(-full // args.batch), "full_train_rows": full,
        "bytes_per_step": (channel + side) / steps, "channel_bytes_per_step": channel / steps,
        "side_bytes_per_step": side / steps, "keygen_seconds": keygen, "phase_seconds_per_step": phases,
    }


def fmt(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def table(results: list[dict[str, Any]], rows: int) -> str:
    base = next((r for r in results if r["key"] == "vanilla"), None)
    lines = ["| method | steps timed | per step (measured, median) | x vanilla | per epoch, "
             f"{rows} rows (extrapolated) | per epoch, full train set (extrapolated) | bytes per step |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        ratio = f"{r['median_step_seconds'] / base['median_step_seconds']:,.0f}" if base else "-"
        lines.append(f"| {r['label']} | {r['steps_timed']} | {fmt(r['median_step_seconds'])} | {ratio} | "
                     f"{fmt(r['epoch_seconds_subsample_extrapolated'])} | {fmt(r['epoch_seconds_full_extrapolated'])} "
                     f"| {r['bytes_per_step'] / 1024:,.1f} KiB |")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    versions = {}
    for pkg in ("torch", "numpy", "phe", "gmpy2"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "processor": platform.processor(), "versions": versions, "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--dataset", default="tabmnist", choices=sorted(FULL_TRAIN_ROWS))
    parser.add_argument("--rows", type=int, default=1024, help="training rows of the subsample")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64, help="hidden width of the MLP2 bottom (the HE layer's input)")
    parser.add_argument("--embed-dim", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200, help="timed steps of plaintext methods")
    parser.add_argument("--slow-steps", type=int, default=3, help="timed steps of HE methods")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--methods", nargs="+", default=[m.key for m in METHODS],
                        choices=[m.key for m in METHODS])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON file for every step time and the settings")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    results = []
    for method in (m for m in METHODS if m.key in args.methods):
        print(f"running {method.key} ...", flush=True)
        results.append(run_method(args, method))
    report = table(results, args.rows)
    print(report)
    if args.out:
        payload = {"settings": vars(args), "environment": environment(), "load_average_start": load_start,
                   "load_average_end": os.getloadavg(), "results": results, "table": report}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(payload, fh, indent=2)


if __name__ == "__main__":
    main()
