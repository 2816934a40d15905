"""Per-step cost of the VFL training loop against an equivalent centralized model.

For each (bottom model, dataset) pair, a 2-party VHNN federation is built with
``build_federation`` (top model MLP2, concat aggregation, SGD lr 0.1 momentum 0.9, batch 128),
and a centralized ``nn.Module`` is made of deep copies of the same bottom models and top model,
trained with one SGD(momentum 0.9) optimizer on the same batches. Both are warmed up, then
timed in interleaved blocks in one process (A B, B A, A B, ...), so that slow phases of a busy
machine hit both sides alike. Reported: median milliseconds per step and the ratio of medians
(and the median of per-block ratios). A second experiment interleaves the VFL loop with
``torch.set_num_threads(1)`` and ``(2)``.

Run: .venv/bin/python benchmarks/vfl_vs_centralized.py --data-root ../shared/datasets \\
         --out /tmp/bench/vfl_vs_centralized.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.experiment.config import build_config
from vflbench.experiment.scenario import build_federation, load_vertical_data
from vflbench.protocol import Federation

CASES = (("mlp3", "tabmnist"), ("lenet5", "mnist"))


class Centralized(nn.Module):
    """The federation's models in one module: bottoms -> concat (active first) -> top."""

    def __init__(self, fed: Federation) -> None:
        super().__init__()
        assert fed.active.bottom is not None and fed.active.data is not None
        self.active_bottom = copy.deepcopy(fed.active.bottom)
        self.passive_bottoms = nn.ModuleList(copy.deepcopy(p.bottom) for p in fed.passives)
        self.top = copy.deepcopy(fed.active.top)
        self.x_active = fed.active.data.x_train
        self.x_passive = [p.data.x_train for p in fed.passives]
        self.targets = fed.active.objective.targets

    def forward(self, ids: Tensor) -> Tensor:
        parts = [self.active_bottom(self.x_active[ids])]
        parts += [b(x[ids]) for b, x in zip(self.passive_bottoms, self.x_passive, strict=True)]
        return self.top(torch.cat(parts, 1))


def make_case(
    bottom: str, dataset: str, data_root: str | None, batch: int, lr: float, momentum: float, seed: int
) -> tuple[Federation, Centralized, torch.optim.Optimizer, int]:
    """The federation, its centralized twin with its optimizer, and the number of training rows."""
    cfg = build_config(
        {
            "data": {"name": dataset, "parties": 2},
            "model": {"bottom": bottom, "top": "mlp2"},
            "train": {
                "algorithm": "vhnn",
                "aggregation": "concat",
                "batch_size": batch,
                "lr": lr,
                "momentum": momentum,
                "optimizer": "sgd",
            },
            "seed": seed,
        }
    )
    vd = load_vertical_data(cfg, data_root)
    fed = build_federation(cfg, vd)
    central = Centralized(fed)
    opt = torch.optim.SGD(central.parameters(), lr=lr, momentum=momentum)
    return fed, central, opt, len(vd.y_train)


def batches(n: int, batch: int, count: int, seed: int) -> list[Tensor]:
    """``count`` id batches from successive shuffled epochs (the same list for both sides)."""
    g = torch.Generator().manual_seed(seed)
    out: list[Tensor] = []
    while len(out) < count:
        order = torch.randperm(n, generator=g)
        out += [order[i : i + batch] for i in range(0, n - batch + 1, batch)]
    return out[:count]


def vfl_stepper(fed: Federation) -> Callable[[int, Tensor], None]:
    """One ``Federation.train_step`` per call."""

    def step(i: int, ids: Tensor) -> None:
        fed.train_step(ids, epoch=0, step=i)

    return step


def central_stepper(model: Centralized, opt: torch.optim.Optimizer) -> Callable[[int, Tensor], None]:
    """One SGD step of the centralized model per call."""

    def step(i: int, ids: Tensor) -> None:
        model.train()
        loss = F.cross_entropy(model(ids), model.targets[ids])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def timed_block(step: Callable[[int, Tensor], None], ids: list[Tensor], threads: int | None = None) -> float:
    """Seconds per step over ``ids`` (with ``threads`` intra-op threads if given)."""
    if threads is not None:
        torch.set_num_threads(threads)
    tic = time.perf_counter()
    for i, b in enumerate(ids):
        step(i, b)
    return (time.perf_counter() - tic) / len(ids)


def interleave(
    a: Callable[[list[Tensor]], float], b: Callable[[list[Tensor]], float], ids: list[Tensor], blocks: int, steps: int
) -> tuple[list[float], list[float]]:
    """Alternate timed blocks of ``a`` and ``b`` (ABBA order), each on the same batches."""
    ta, tb = [], []
    for k in range(blocks):
        chunk = ids[k * steps : (k + 1) * steps]
        if k % 2 == 0:
            ta.append(a(chunk))
            tb.append(b(chunk))
        else:
            tb.append(b(chunk))
            ta.append(a(chunk))
    return ta, tb


def summary(name_a: str, ta: list[float], name_b: str, tb: list[float]) -> dict[str, Any]:
    """Medians in milliseconds, the ratio of medians, and the median of per-block ratios."""
    med_a, med_b = statistics.median(ta), statistics.median(tb)
    return {
        f"{name_a}_ms": 1e3 * med_a,
        f"{name_b}_ms": 1e3 * med_b,
        "ratio": med_a / med_b,
        "ratio_blockwise_median": statistics.median(x / y for x, y in zip(ta, tb, strict=True)),
        f"{name_a}_blocks_ms": [1e3 * t for t in ta],
        f"{name_b}_blocks_ms": [1e3 * t for t in tb],
    }


def run_case(bottom: str, dataset: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both experiments for one (bottom, dataset) pair."""
    torch.set_num_threads(1)
    fed, central, opt, n = make_case(
        bottom, dataset, args.data_root, args.batch_size, args.lr, args.momentum, args.seed
    )
    need = args.warmup + 2 * args.blocks * args.steps
    ids = batches(n, args.batch_size, need, args.seed)
    vfl, cen = vfl_stepper(fed), central_stepper(central, opt)
    timed_block(vfl, ids[: args.warmup])
    timed_block(cen, ids[: args.warmup])
    rest = ids[args.warmup :]
    ta, tb = interleave(
        lambda c: timed_block(vfl, c, 1), lambda c: timed_block(cen, c, 1), rest, args.blocks, args.steps
    )
    out = {"bottom": bottom, "dataset": dataset, "vs_centralized": summary("vfl", ta, "centralized", tb)}
    rest = rest[args.blocks * args.steps :]
    t1, t2 = interleave(
        lambda c: timed_block(vfl, c, 1), lambda c: timed_block(vfl, c, 2), rest, args.blocks, args.steps
    )
    out["vfl_threads"] = summary("threads1", t1, "threads2", t2)
    torch.set_num_threads(1)
    return out


def markdown(results: list[dict[str, Any]]) -> str:
    """The results as a markdown table."""
    lines = [
        "| bottom, dataset | VFL ms/step (1 thread) | centralized ms/step (1 thread) | ratio VFL/centralized "
        "| per-block ratio (median) | VFL ms/step, 2 threads | 1 vs 2 threads (t1/t2) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        c, t = r["vs_centralized"], r["vfl_threads"]
        lines.append(
            f"| {r['bottom']}, {r['dataset']} | {c['vfl_ms']:.2f} | {c['centralized_ms']:.2f} "
            f"| {c['ratio']:.2f}x | {c['ratio_blockwise_median']:.2f}x | {t['threads2_ms']:.2f} "
            f"| {t['ratio']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Parse arguments, run every case, print the table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", default=os.environ.get("VFLBENCH_DATA"))
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--steps", type=int, default=100, help="steps per timed block")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cases",
        nargs="*",
        default=[f"{b}:{d}" for b, d in CASES],
        help="bottom:dataset pairs (default: mlp3:tabmnist lenet5:mnist)",
    )
    args = p.parse_args()
    load_start = os.getloadavg()
    tic = time.perf_counter()
    results = []
    for case in args.cases:
        bottom, dataset = case.split(":")
        results.append(run_case(bottom, dataset, args))
        print(f"done {case}", flush=True)
    table = markdown(results)
    print(table)
    payload = {
        "results": results,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "processor": platform.processor(),
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
        },
        "seconds": time.perf_counter() - tic,
        "table": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
