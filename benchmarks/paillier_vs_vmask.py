"""Training cost of the Paillier-HE baseline (``paillier_he``) and VMask against plaintext VFL (VMask Table III style).

Every method trains the same federation (2 parties, VHNN, concat, bottom MLP2 with a
``--hidden``-wide hidden layer and a ``--embed-dim`` embedding, top MLP2, SGD lr 0.1 without
momentum, batch ``--batch``) on the same shuffled batches of a TabMNIST subsample, one torch
thread. Only the defense list differs. Each method runs ``--warmup`` untimed steps, then its timed
steps (``Federation.train_step``: forward, top, backward, the passive party's update -- for
``paillier_he`` all of its encryption, homomorphic products, decryption and re-randomisation; for
VMask the secret-shared forward and backward of the masked layers, including the dealer's Beaver
triple generation, which is also timed on its own). The plaintext-speed methods (vanilla, VMask,
VMask-ALLS) step round-robin, one step of each in turn, so machine load affects them alike; the HE
methods run one after another.

VMask rows: ``vmask`` in its initial state (the bottom model's first linear layer masked, Algorithm
4 line 3) and ``vmask_alls`` (every linear layer masked). ``train_step`` never runs VMask's
end-of-epoch work (shadow model update, layer selection with simulated model completion,
re-masking: ``on_epoch_end``), so the per-step times exclude it; it is timed once after the timed
steps, reported on its own and added once per epoch in the per-epoch columns.

Reported per method: the median seconds per training step (MEASURED), with and without the time
spent in the dealer's triple generation (an offline phase in a deployment; the step minus its
dealer time is the "online" step), and per-epoch times EXTRAPOLATED as median step time x steps per
epoch (+ VMask's end-of-epoch work), for the subsample and for the full 60,000-row TabMNIST
training set (the HE runs are far too slow to time whole epochs; evaluation is excluded, as in an
epoch time of the training loop), and bytes per step (the loop's channel plus the HE side
exchanges or VMask's secret-sharing traffic between the parties; the dealer's triple traffic is in
the JSON). Key generation is timed separately.

To add a method, append an entry to ``METHODS`` and pass ``--methods ... <key>``.

Run: .venv/bin/python benchmarks/paillier_vs_vmask.py --data-root ../shared/datasets \\
         --steps 500 --slow-steps 5 --out /tmp/he/paillier_vs_vmask.json   (docs/notes/performance_he.md)
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

from vflbench.experiment.config import build_config
from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.mpc.comm import BYTES_PER_ELEMENT, DIRECTIONS
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
    Method("vmask", "VMask (layer 1 masked)", [{"name": "vmask"}]),
    Method("vmask_alls", "VMask-ALLS (all layers masked)", [{"name": "vmask_alls"}]),
    Method("he1024", "paillier_he, 1024-bit key", [{"name": "paillier_he", "key_bits": 1024}], "slow"),
    Method("he2048", "paillier_he, 2048-bit key", [{"name": "paillier_he", "key_bits": 2048}], "slow"),
]


def make_federation(args: argparse.Namespace, method: Method) -> tuple[Federation, int, float]:
    """The federation for ``method``, the number of training rows, and the key generation seconds."""
    cfg = build_config(
        {
            "data": {"name": args.dataset, "parties": 2, "train_size": args.rows, "test_size": 64, "aux_pool": 640},
            "model": {
                "bottom": "mlp2",
                "top": "mlp2",
                "embed_dim": args.embed_dim,
                "bottom_options": {"hidden": args.hidden},
            },
            "train": {
                "algorithm": "vhnn",
                "aggregation": "concat",
                "batch_size": args.batch,
                "lr": 0.1,
                "momentum": 0.0,
                "optimizer": "sgd",
            },
            "defenses": method.defenses,
            "seed": args.seed,
        }
    )
    vd = load_vertical_data(cfg, args.data_root)
    fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1"]))
    holder = getattr(fed.active.defenses[0], "holder_", None) if fed.active.defenses else None
    return fed, len(vd.y_train), holder.keygen_seconds if holder is not None else 0.0


def he_holder(fed: Federation) -> Any:
    return getattr(fed.active.defenses[0], "holder_", None) if fed.active.defenses else None


def vmask_defense(fed: Federation) -> Any:
    """The active party's VMask defense object, or None."""
    return next((d for d in fed.active.defenses if hasattr(d, "dealer_") and hasattr(d, "parties_")), None)


def side_bytes(fed: Federation) -> int:
    """Bytes exchanged besides the loop's messages: the HE side exchange or VMask's secret-sharing traffic."""
    if he_holder(fed) is not None:
        return sum(fed.active.defenses[0].traffic("train").values())  # the channel's paillier.* counts
    vm = vmask_defense(fed)
    if vm is not None:
        return sum(s.comm.bytes(d) for s in vm.parties_.values() for d in DIRECTIONS)
    return 0


def loop_bytes(fed: Federation) -> int:
    """Bytes of the loop's own messages (embeddings and cut gradients) in training; protocol messages that
    the channel also counts (``paillier.*``) are in :func:`side_bytes`."""
    return sum(s.bytes for kind in ("embedding", "cut_gradient") for s in fed.traffic().by_kind.get(kind, {}).values())


def dealer_bytes(fed: Federation) -> int:
    """Bytes of Beaver triples sent by VMask's dealer to the two parties (both halves)."""
    vm = vmask_defense(fed)
    return 2 * BYTES_PER_ELEMENT * vm.dealer_.issued_elements if vm is not None else 0


class DealerClock:
    """Accumulates the seconds one dealer spends generating triples (wraps the instance's ``_issue``)."""

    def __init__(self, dealer: Any = None) -> None:
        self.seconds = 0.0
        if dealer is None:
            return
        original = dealer._issue

        def timed(*a: Any, **kw: Any) -> Any:
            tic = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - tic

        dealer._issue = timed


def breakdown(fed: Federation) -> dict[str, float]:
    """Seconds spent in each HE phase so far (passive layer and active key holder)."""
    out: dict[str, float] = {}
    for m in fed.passives[0].bottom.modules():
        for k, v in getattr(m, "seconds", {}).items():
            out[f"passive_{k}"] = out.get(f"passive_{k}", 0.0) + v
    holder = he_holder(fed)
    if holder is not None:
        out.update({f"active_{k}": v for k, v in holder.seconds.items()})
    return out


class Run:
    """One method's federation, stepped one training step at a time and timed."""

    def __init__(self, args: argparse.Namespace, method: Method) -> None:
        self.args, self.method = args, method
        self.fed, self.n, self.keygen = make_federation(args, method)
        vm = vmask_defense(self.fed)
        self.clock = DealerClock(vm.dealer_ if vm is not None else None)
        self.steps = args.steps if method.steps == "plain" else args.slow_steps
        self.order = torch.randperm(self.n, generator=torch.Generator().manual_seed(args.seed))
        self.per_epoch = -(-self.n // args.batch)
        self.times: list[float] = []
        self.dealer_times: list[float] = []

    def step(self, step: int) -> None:
        args, fed = self.args, self.fed
        k = step % self.per_epoch
        ids = self.order[k * args.batch : (k + 1) * args.batch]
        if step == args.warmup:
            self.bytes_before = loop_bytes(fed)
            self.side_before = side_bytes(fed)
            self.dealer_bytes_before = dealer_bytes(fed)
            self.phases_before = breakdown(fed)
        dealer_before = self.clock.seconds
        tic = time.perf_counter()
        fed.train_step(ids, epoch=0, step=k)
        elapsed = time.perf_counter() - tic
        if step >= args.warmup:
            self.times.append(elapsed)
            self.dealer_times.append(self.clock.seconds - dealer_before)
        if args.verbose and self.method.steps == "slow":
            print(f"  {self.method.key} step {step}: {elapsed:.2f} s", flush=True)

    def result(self) -> dict[str, Any]:
        args, fed, steps, per_epoch = self.args, self.fed, self.steps, self.per_epoch
        channel = loop_bytes(fed) - self.bytes_before
        side = side_bytes(fed) - self.side_before
        triples = dealer_bytes(fed) - self.dealer_bytes_before
        phases = {k: (v - self.phases_before.get(k, 0.0)) / steps for k, v in breakdown(fed).items()}
        median = statistics.median(self.times)
        online = [t - d for t, d in zip(self.times, self.dealer_times, strict=True)]
        median_online = statistics.median(online)
        # VMask's end-of-epoch work (shadow update, layer selection, re-masking), after the timed steps,
        # timed once: train_step never runs it, so it is not in the step times.
        vm = vmask_defense(fed)
        epoch_end, epoch_end_report = 0.0, {}
        if vm is not None:
            tic = time.perf_counter()
            epoch_end_report = vm.on_epoch_end(0)
            epoch_end = time.perf_counter() - tic
        full = FULL_TRAIN_ROWS.get(args.dataset, self.n)
        full_steps = -(-full // args.batch)
        return {
            "key": self.method.key,
            "label": self.method.label,
            "defenses": self.method.defenses,
            "steps_timed": steps,
            "step_seconds": self.times,
            "dealer_seconds": self.dealer_times,
            "median_step_seconds": median,
            "median_online_step_seconds": median_online,
            "mean_dealer_seconds_per_step": statistics.fmean(self.dealer_times),
            "epoch_end_seconds": epoch_end,
            "epoch_end_report": {k: v for k, v in epoch_end_report.items() if isinstance(v, (int, float, list, str))},
            "epoch_seconds_subsample_extrapolated": median * per_epoch + epoch_end,
            "steps_per_epoch_subsample": per_epoch,
            "epoch_seconds_full_extrapolated": median * full_steps + epoch_end,
            "full_train_rows": full,
            "online_epoch_seconds_full_extrapolated": median_online * full_steps + epoch_end,
            "bytes_per_step": (channel + side) / steps,
            "channel_bytes_per_step": channel / steps,
            "side_bytes_per_step": side / steps,
            "dealer_bytes_per_step": triples / steps,
            "keygen_seconds": self.keygen,
            "phase_seconds_per_step": phases,
        }


def run_interleaved(args: argparse.Namespace, methods: list[Method]) -> list[dict[str, Any]]:
    """Build every method's federation, then step them round-robin (one step of each in turn)."""
    runs = [Run(args, m) for m in methods]
    for step in range(args.warmup + args.steps):
        for r in runs:
            r.step(step)
    return [r.result() for r in runs]


def run_method(args: argparse.Namespace, method: Method) -> dict[str, Any]:
    run = Run(args, method)
    for step in range(args.warmup + run.steps):
        run.step(step)
    return run.result()


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
    lines = [
        "| method | steps timed | per step (measured, median) | x vanilla | per step without dealer "
        "| x vanilla | end-of-epoch work (once) "
        f"| per epoch, {rows} rows (extrapolated) | per epoch, full train set (extrapolated) | bytes per step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = online = "-"
        if base:
            x = r["median_step_seconds"] / base["median_step_seconds"]
            y = r["median_online_step_seconds"] / base["median_step_seconds"]
            ratio, online = (f"{x:,.0f}", f"{y:,.0f}") if x >= 100 else (f"{x:.2f}", f"{y:.2f}")
        end = fmt(r["epoch_end_seconds"]) if r["epoch_end_seconds"] else "-"
        lines.append(
            f"| {r['label']} | {r['steps_timed']} | {fmt(r['median_step_seconds'])} | {ratio} "
            f"| {fmt(r['median_online_step_seconds'])} | {online} | {end} "
            f"| {fmt(r['epoch_seconds_subsample_extrapolated'])} "
            f"| {fmt(r['epoch_seconds_full_extrapolated'])} "
            f"| {r['bytes_per_step'] / 1024:,.1f} KiB |"
        )
    return "\n".join(lines)


def speedups(results: list[dict[str, Any]]) -> str:
    """How many times faster per step each VMask row is than each paillier_he row (with / without dealer)."""
    he = [r for r in results if r["key"].startswith("he")]
    vm = [r for r in results if r["key"].startswith("vmask")]
    lines = []
    for v in vm:
        for h in he:
            lines.append(
                f"{v['label']} vs {h['label']}: {h['median_step_seconds'] / v['median_step_seconds']:,.0f}x "
                f"faster per step ({h['median_step_seconds'] / v['median_online_step_seconds']:,.0f}x "
                "without the dealer)"
            )
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    versions = {}
    for pkg in ("torch", "numpy", "phe", "gmpy2"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor(),
        "versions": versions,
        "threads": torch.get_num_threads(),
    }


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
    parser.add_argument("--methods", nargs="+", default=[m.key for m in METHODS], choices=[m.key for m in METHODS])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON file for every step time and the settings")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    chosen = [m for m in METHODS if m.key in args.methods]
    plain = [m for m in chosen if m.steps == "plain"]
    print(f"running {' '.join(m.key for m in plain)} (round-robin) ...", flush=True)
    by_key = {r["key"]: r for r in run_interleaved(args, plain)} if plain else {}
    for method in (m for m in chosen if m.steps == "slow"):
        print(f"running {method.key} ...", flush=True)
        by_key[method.key] = run_method(args, method)
    results = [by_key[m.key] for m in chosen]
    report = table(results, args.rows)
    extra = speedups(results)
    if extra:
        report += "\n\n" + extra
    print(report)
    if args.out:
        payload = {
            "settings": vars(args),
            "environment": environment(),
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
            "results": results,
            "table": report,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(payload, fh, indent=2)


if __name__ == "__main__":
    main()
