"""VMask vs vanilla VFL with every party in its own process (``vflbench launch``: loopback, mutual TLS), per epoch,
and projected onto the VMask paper's LAN (836 Mbit/s) and a 100 Mbit/s, 50 ms WAN.

MLP3 bottoms on TabMNIST (784 pixels split between 2 parties), MLP2 top, batch 128, lr 0.1, plain SGD, as the
paper's Table III column MLP3/TM; VMask with budget 0.25, 640 auxiliary rows, 20 simulated model-completion
epochs. Reduced rows (``--train-size``, default 6,400 rows: 45 training steps once VMask's 640 auxiliary rows are
held out; vanilla trains on all 50 steps' rows, so the comparison is per step) and ``--epochs`` epochs (default 2).
Each variant is run both ways:
as one process (``vflbench run``) and as separate processes (``vflbench launch``: active party, passive party and,
for VMask, the dealer). Per step: the training time (``timing.epoch_seconds`` / steps, the training steps only) and
the frames and bytes that crossed the links per epoch (evaluation and end-of-epoch messages included) divided by the
steps. The projection of a full 60,000-row epoch (469 steps) on a network: 469 x (measured ms per step + frames per
step x one-way latency + 8 x bytes per step / bandwidth); VMask's end-of-epoch work and the evaluation are left out.

``--shape lan`` (or ``wan``) launches the parties on a shaped link instead (``vflbench launch --shape``: every
process delays what it sends as a link of the profile's bandwidth and one-way latency would), so the per-step times
are measured on that link, not projected. ``--variants`` picks the runs: ``vanilla``, ``vmask`` (its default
protocol), ``vmask_whole`` (VMask with ``row_blocks: 1``: each product's operand in one message, as before the row
blocks) and ``vmask_beaver`` (VMask with ``protocol: beaver``, the per-product Beaver protocol before issue 26); the
three VMask variants give the same numbers with different traffic. The ratios are each VMask variant's per step over
vanilla's. ``--device cuda`` runs every party's models and VMask's ring products on the GPU (``train.device``;
default ``cpu``). ``--launch-only`` skips the one-process runs; ``--repeats N`` runs every variant N times, the
variants side by side in each round, and adds each round's ratios (VMask over the same round's vanilla, per epoch),
their medians and their mean with its 95% Student t interval over the rounds (``variants`` holds the first round).

    VFLBENCH_DATA=../shared/datasets OMP_NUM_THREADS=1 python benchmarks/network_vmask.py --out network_vmask.json
    VFLBENCH_DATA=../shared/datasets OMP_NUM_THREADS=1 python benchmarks/network_vmask.py --shape lan \
        --variants vanilla,vmask,vmask_beaver --launch-only --out network_vmask_lan.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from vflbench.experiment.config import build_config
from vflbench.experiment.launch import launch
from vflbench.experiment.run import run_experiment
from vflbench.metrics.stats import mean_interval
from vflbench.net.linkmodel import LINK_PROFILES, SHAPES, LinkProfile, shape_profile

#: VMask (NDSS 2025) Table III, MLP3 / TM, seconds per epoch (GPU servers on 836 Mbit/s Ethernet).
PAPER = {"vanilla": 1.9, "vmask": 6.2}
FULL_EPOCH_STEPS = math.ceil(60_000 / 128)


VARIANTS = ("vanilla", "vmask", "vmask_whole", "vmask_beaver")


def config(variant: str, *, train_size: int, epochs: int, device: str = "cpu") -> dict:
    vmask = {"name": "vmask", "budget": 0.25, "sigma": 0.01, "mc_epochs": 20}
    defenses = {
        "vanilla": [],
        "vmask": [vmask],
        "vmask_whole": [{**vmask, "row_blocks": 1}],
        "vmask_beaver": [{**vmask, "protocol": "beaver"}],
    }[variant]
    return {
        "data": {"name": "tabmnist", "parties": 2, "train_size": train_size, "test_size": 1000, "aux_pool": 640},
        "model": {"bottom": "mlp3", "top": "mlp2"},
        "train": {
            "algorithm": "vhnn",
            "aggregation": "concat",
            "epochs": epochs,
            "batch_size": 128,
            "lr": 0.1,
            "optimizer": "sgd",
            "momentum": 0.0,
            "threads": 1,
            "device": device,
        },
        "defenses": defenses,
        "seed": 0,
    }


def _untimed(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "timing"}


def _measure(variant: str, args: argparse.Namespace, shape: LinkProfile | None, link: str, out_dir: Path) -> dict:
    """One launch of ``variant`` (and its one-process run unless ``--launch-only``): per step, traffic, accuracy."""
    cfg = build_config(config(variant, train_size=args.train_size, epochs=args.epochs, device=args.device))
    one = None if args.launch_only else run_experiment(cfg).to_dict()
    tic = time.perf_counter()
    many = launch(cfg, out_dir=out_dir, receive_timeout=300, shape=shape)
    rows = many.result["data"]["n_train"] - 640  # the pool is held out of both variants' training
    steps = math.ceil(rows / 128)
    net = many.net
    per_step = {
        "processes_ms": [1e3 * s / steps for s in many.result["timing"]["epoch_seconds"]],
        "frames": [f / steps for f in net["wire_per_epoch"]["frames"]],
        "bytes": [b / steps for b in net["wire_per_epoch"]["bytes"]],
    }
    if one is not None:
        per_step["one_process_ms"] = [1e3 * s / steps for s in one["timing"]["epoch_seconds"]]
    last = -1  # the last epoch: no warm-up, and VMask's mask is the selected one
    full = {link: FULL_EPOCH_STEPS * per_step["processes_ms"][last] / 1e3}
    if one is not None:
        full["one_process"] = FULL_EPOCH_STEPS * per_step["one_process_ms"][last] / 1e3
    if shape is None:  # a shaped run is measured on its link: projecting it would count the link twice
        full.update(
            {
                f"projected_{name}": FULL_EPOCH_STEPS
                * (
                    per_step["processes_ms"][last] / 1e3
                    + per_step["frames"][last] * p.latency_ms / 1e3
                    + 8 * per_step["bytes"][last] / (p.bandwidth_mbit_s * 1e6)
                )
                for name, p in LINK_PROFILES.items()
            }
        )
    return {
        "steps_per_epoch": steps,
        "launch_seconds": time.perf_counter() - tic,
        "per_step": per_step,
        "epoch_wall_seconds_processes": net["epoch_seconds"],
        "full_epoch_seconds": full,
        "accuracy": many.result["utility"]["value"],
        "comm": many.result["comm"],
        "identical_to_one_process": None if one is None else _untimed(many.result) == _untimed(one),
    }


def _interval(ratios: list[float]) -> dict[str, float | int | None]:
    """The mean of one epoch's ratios over the rounds and its 95% Student t interval (none from one round)."""
    iv = mean_interval(dict(enumerate([r] for r in ratios)))
    return {
        "mean": iv.mean,
        "low": iv.low if iv.defined else None,
        "high": iv.high if iv.defined else None,
        "rounds": iv.seeds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-size", type=int, default=6400)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default=None,
        help="launch on a shaped link (lan: 836 Mbit/s, 0.1 ms; wan: 100 Mbit/s, 50 ms)",
    )
    parser.add_argument("--variants", default="vanilla,vmask", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--launch-only", action="store_true", help="skip the one-process runs")
    parser.add_argument("--device", default="cpu", help="train.device of every party: cpu (default), cuda, auto")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of every variant, side by side in each round")
    parser.add_argument("--out", type=Path, default=Path("network_vmask.json"))
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if "vanilla" not in variants or any(v not in VARIANTS for v in variants):
        parser.error(f"--variants takes vanilla and any of {', '.join(VARIANTS[1:])}, got {args.variants!r}")
    shape = shape_profile(args.shape)
    link = "processes_loopback" if shape is None else f"processes_{SHAPES[args.shape]}"
    torch.set_num_threads(1)
    report: dict = {
        "load_before": os.getloadavg(),
        "cpus": os.cpu_count(),
        "device": args.device,
        "train_size": args.train_size,
        "epochs": args.epochs,
        "full_epoch_steps": FULL_EPOCH_STEPS,
        "paper_table3_mlp3_tm": PAPER,
        "shape": None if shape is None else shape.as_dict(),
        "profiles": {k: v.as_dict() for k, v in LINK_PROFILES.items()},
        "variants": {},
    }
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="network-vmask-") as tmp:
        for r in range(args.repeats):  # the variants side by side in each round
            rounds.append({v: _measure(v, args, shape, link, Path(tmp) / f"{v}-{r}") for v in variants})
    report["variants"] = rounds[0]
    report["load_after"] = os.getloadavg()
    full = {v: r["full_epoch_seconds"] for v, r in report["variants"].items()}
    report["ratio_over_vanilla"] = {
        v: {k: full[v][k] / full["vanilla"][k] for k in full["vanilla"]} for v in variants if v != "vanilla"
    }
    # per step in every epoch (the first epoch masks VMask's initial layer, later ones what it selected)
    base = report["variants"]["vanilla"]["per_step"]["processes_ms"]
    report["ratio_over_vanilla_per_epoch"] = {
        v: [ms / b for ms, b in zip(r["per_step"]["processes_ms"], base, strict=True)]
        for v, r in report["variants"].items()
        if v != "vanilla"
    }
    report["rounds_ms_per_step"] = [{v: m["per_step"]["processes_ms"] for v, m in rnd.items()} for rnd in rounds]
    paired = {  # each round's VMask variant over the same round's vanilla, per epoch
        v: [[ms / b for ms, b in zip(rnd[v], rnd["vanilla"], strict=True)] for rnd in report["rounds_ms_per_step"]]
        for v in variants
        if v != "vanilla"
    }
    report["ratio_per_epoch_rounds"] = paired
    report["ratio_per_epoch_median"] = {
        v: [statistics.median(epoch) for epoch in zip(*per_round, strict=True)] for v, per_round in paired.items()
    }
    report["ratio_per_epoch_interval"] = {  # the mean over rounds and its 95% Student t interval (rounds as samples)
        v: [_interval(list(epoch)) for epoch in zip(*per_round, strict=True)] for v, per_round in paired.items()
    }
    report["ratio_paper"] = PAPER["vmask"] / PAPER["vanilla"]
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        json.dumps(
            {
                "full_epoch_seconds": full,
                "ratio": report["ratio_over_vanilla"],
                "ratio_per_epoch": report["ratio_over_vanilla_per_epoch"],
                "ratio_per_epoch_median_of_rounds": report["ratio_per_epoch_median"],
                "ratio_per_epoch_mean_and_interval_over_rounds": report["ratio_per_epoch_interval"],
                "per_step": {
                    v: {k: r["per_step"][k] for k in ("frames", "bytes", "processes_ms")}
                    for v, r in report["variants"].items()
                },
                "load": [report["load_before"], report["load_after"]],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
