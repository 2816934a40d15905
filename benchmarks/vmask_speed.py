"""VMask vs vanilla VFL: per-step and per-epoch cost, measured as ratios in one process.

For each (model, dataset) pair, three federations are built on the same data and trained on
the same batches, interleaved in repeated blocks (so machine load affects all alike):
vanilla, VMask in its steady state with the first layer masked (what VMask masks before the
first epoch and whenever the budget is met with one layer), and VMask-ALLS (every linear layer
masked). Beaver-triple generation by the dealer is timed separately: in a deployment it is an
offline phase, so the "online" ratio excludes it. The end-of-epoch work of VMask (shadow model
update and layer selection with simulated model completion) is timed once and added per epoch.

    python benchmarks/vmask_speed.py --data-root ../shared/datasets --out vmask_speed.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from vflbench.experiment.config import build_config
from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.mpc import dealer as dealer_module

CASES = [("tabmnist", "mlp3"), ("mnist", "lenet5")]
VARIANTS = {
    "vanilla": [],
    "vmask (layer 1 masked)": [{"name": "vmask"}],
    "vmask_alls (all masked)": [{"name": "vmask_alls"}],
}
POOL = 640  # rows held out of every variant's training: VMask's auxiliary set (its paper's 640)


class DealerClock:
    """Accumulates the time spent inside the dealer's triple generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._originals = {}

    def install(self) -> None:
        for name in ("issue_mul", "issue_matmul", "issue_conv2d", "issue_conv2d_input_grad", "issue_masked"):
            original = getattr(dealer_module.Dealer, name)
            self._originals[name] = original

            def timed(*args, _original=original, **kwargs):
                tic = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - tic

            setattr(dealer_module.Dealer, name, timed)


def build(dataset: str, bottom: str, defenses: list, data_root: str, rows: int):
    cfg = build_config(
        {
            "data": {"name": dataset, "root": data_root, "train_size": rows, "aux_pool": POOL},
            "model": {"bottom": bottom, "top": "mlp2"},
            "train": {"epochs": 2, "batch_size": 128, "lr": 0.1, "momentum": 0.0},
            "defenses": defenses,
        }
    )
    vd = load_vertical_data(cfg)
    return build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1"]))


def measure(dataset: str, bottom: str, data_root: str, blocks: int, steps: int, clock: DealerClock) -> dict:
    rows = 128 * steps
    feds = {name: build(dataset, bottom, d, data_root, rows) for name, d in VARIANTS.items()}
    ids = torch.randperm(rows, generator=torch.Generator().manual_seed(0))
    times = {name: [] for name in feds}
    dealer = dict.fromkeys(feds, 0.0)
    for f in feds.values():  # warm-up
        for s in range(3):
            f.train_step(ids[s * 128 : (s + 1) * 128], epoch=0, step=s)
    for _ in range(blocks):
        for name, f in feds.items():
            before = clock.seconds
            tic = time.perf_counter()
            for s in range(steps):
                f.train_step(ids[s * 128 : (s + 1) * 128], epoch=0, step=s)
            times[name].append((time.perf_counter() - tic) / steps)
            dealer[name] += clock.seconds - before
    per_step = {n: statistics.median(t) for n, t in times.items()}
    dealer_step = {n: dealer[n] / (blocks * steps) for n in feds}
    vmask = feds["vmask (layer 1 masked)"]
    defense = vmask.active.defenses[0]
    tic = time.perf_counter()
    defense.on_epoch_end(0)  # shadow update + layer selection (+ re-masking) once
    epoch_end = time.perf_counter() - tic
    steps_per_epoch = 60000 // 128 + 1
    out = {
        "dataset": dataset,
        "bottom": bottom,
        "per_step_ms": {n: 1000 * v for n, v in per_step.items()},
        "dealer_ms_per_step": {n: 1000 * v for n, v in dealer_step.items()},
        "epoch_end_seconds": epoch_end,
    }
    base = per_step["vanilla"] * steps_per_epoch
    out["per_epoch_ratio"] = {
        n: (per_step[n] * steps_per_epoch + (epoch_end if n != "vanilla" else 0)) / base for n in per_step
    }
    out["online_per_epoch_ratio"] = {
        n: ((per_step[n] - dealer_step[n]) * steps_per_epoch + (epoch_end if n != "vanilla" else 0)) / base
        for n in per_step
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("vmask_speed.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = DealerClock()
    clock.install()
    results = [measure(d, b, args.data_root, args.blocks, args.steps, clock) for d, b in CASES]
    args.out.write_text(json.dumps({"threads": args.threads, "torch": torch.__version__, "results": results}, indent=2))
    print("| model, data | variant | ms/step | dealer ms/step | per-epoch ratio | online ratio |")
    print("|---|---|---|---|---|---|")
    for r in results:
        for n in VARIANTS:
            print(
                f"| {r['bottom']}, {r['dataset']} | {n} | {r['per_step_ms'][n]:.1f} "
                f"| {r['dealer_ms_per_step'][n]:.1f} "
                f"| {r['per_epoch_ratio'][n]:.2f} | {r['online_per_epoch_ratio'][n]:.2f} |"
            )
        print(f"| {r['bottom']}, {r['dataset']} | VMask end-of-epoch work | {r['epoch_end_seconds']:.1f} s | | | |")


if __name__ == "__main__":
    main()
