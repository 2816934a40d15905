"""Reproduce published numbers: run configs/repro/*.yaml and compare with the papers.

Runs each config through ``run_experiment`` one after another, writing ``OUT/<hash>/`` as the
CLI does. A run whose ``result.json`` already exists in ``OUT`` is not run again, so an
interrupted reproduction resumes where it stopped. Prints (and with ``--table`` writes) a
markdown table of our numbers against the paper's.

Run:  .venv/bin/python benchmarks/reproduce.py --data-root ../shared/datasets \\
          --out runs/repro --table runs/repro/table.md [--extra] [CONFIG ...]

``--extra`` also runs the documented alternative attack settings in ``EXTRA`` (see
docs/notes/reproduction.md); they are reported as extra rows, never in place of the main rows. An
extra setting that changes only post-training attacks (or only the seed, to repeat the attack
with other known labels and head initialisation) is not trained again: the attacks run on
the main run's saved final checkpoint (``OUT/<main hash>/checkpoints``), and the result is
written to ``OUT/<extra hash>/result.json`` (utility copied from the main run). Any other
extra setting is a full run of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import swap
import torch

from vflbench.experiment.config import ExperimentConfig, load_config
from vflbench.experiment.plan import validate_attacks
from vflbench.experiment.results import write_json
from vflbench.experiment.run import TrainedRun, run_experiment
from vflbench.experiment.scenario import build_federation, load_vertical_data
from vflbench.experiment.scoring import run_attacks
from vflbench.protocol import History

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "configs" / "repro"
DEFAULT_CONFIGS = ("kang_credit_vlr", "vmask_table2_tabmnist_mlp3", "vmask_table2_mnist_lenet5")

PAPER: dict[str, dict[str, Any]] = {
    "vmask_table2_mnist_lenet5": {
        "source": "VMask (NDSS 2025) Table II, LeNet5 / M",
        "utility": 98.72,
        "attacks": {"model_completion": {"value": 79.44, "prior": 37.67, "leakage": 79.44 - 37.67}},
    },
    "vmask_table2_tabmnist_mlp3": {
        "source": "VMask (NDSS 2025) Table II, MLP3 / TM",
        "utility": 99.02,
        "attacks": {"model_completion": {"value": 80.72, "prior": 41.35, "leakage": 80.72 - 41.35}},
    },
    "kang_credit_vlr": {
        "source": "Kang et al. Tables 10-12, Credit, No Protect",
        "utility": 73.2,
        "attacks": {
            "norm_scoring": {"value": 96.9, "prior": 50.0, "leakage": 46.9},
            "direction_scoring": {"value": 100.0, "prior": 50.0, "leakage": 50.0},
            "direct_label_inference": {"value": 100.0, "prior": 50.0, "leakage": 50.0},
            "residue_reconstruction": {"value": 66.0, "prior": 50.0, "leakage": 16.0},
            "gradient_inversion": {"value": 68.1, "prior": 50.0, "leakage": 18.1},
            "model_completion": {"value": None, "prior": None, "leakage": 21.8},
        },
    },
}

EXTRA: list[tuple[str, str, list[str]]] = [
    (
        "kang_credit_vlr",
        "MC: J_loc trained with Adam lr 1e-2",
        ["attacks=[{name: model_completion, known_per_class: 20, prior: local, lr: 0.01}]"],
    ),
]
for _name in ("vmask_table2_tabmnist_mlp3", "vmask_table2_mnist_lenet5"):
    EXTRA += [
        (
            _name,
            "MC as Alg. 3 reads: full-batch SGD lr 0.1 (momentum 0.9)",
            ["attacks.0.optimizer=sgd", "attacks.0.lr=0.1", "attacks.0.batch_size=null"],
        ),
        (_name, "MC: SGD lr 1e-2 (momentum 0.9), batch 16", ["attacks.0.optimizer=sgd", "attacks.0.lr=0.01"]),
        (_name, "MC: full-batch Adam lr 1e-3", ["attacks.0.batch_size=null"]),
        (_name, "MC: Adam lr 1e-2, batch 16", ["attacks.0.lr=0.01"]),
        (_name, "MC: bottom frozen (head only), Adam lr 1e-3, batch 16", ["attacks.0.finetune_bottom=false"]),
    ]
    EXTRA += [
        (_name, f"MC repeated on the same trained model, seed {k} (known labels, head init)", [f"seed={k}"])
        for k in range(1, 5)
    ]
EXTRA.append(
    (
        "vmask_table2_tabmnist_mlp3",
        "trained again with data.standardise false (pixels in [0, 1])",
        ["data.standardise=false"],
    )
)


def config_path(name: str) -> Path:
    """A config name (stem under configs/repro) or a path."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return p
    return REPRO / f"{name}.yaml"


def run_one(
    path: Path, overrides: list[str], out: Path, data_root: str | None
) -> tuple[ExperimentConfig, dict[str, Any], dict[str, Any]]:
    """Run (or load) one config; return it, its result.json and its wall-clock record."""
    cfg = load_config(path, overrides)
    run_dir = out / cfg.hash()
    result_file, wall_file = run_dir / "result.json", run_dir / "wall.json"
    if result_file.is_file():
        print(f"[skip] {path.stem} {' '.join(overrides)}: {result_file} exists", flush=True)
    else:
        print(f"[run ] {path.stem} {' '.join(overrides)} -> {run_dir}", flush=True)
        tic = time.perf_counter()
        run_experiment(cfg, out_dir=out, data_root=data_root)
        wall = {
            "wall_seconds": time.perf_counter() - tic,
            "overrides": overrides,
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
            "loadavg": os.getloadavg(),
        }
        wall_file.write_text(json.dumps(wall, indent=2) + "\n")
    result = json.loads(result_file.read_text())
    wall = json.loads(wall_file.read_text()) if wall_file.is_file() else {}
    return cfg, result, wall


def attack_only(overrides: list[str]) -> bool:
    """Whether ``overrides`` change only the attacks (or the seed, which then changes only the
    attacks' random draws: known labels, inference head, batch order)."""
    return bool(overrides) and all(o.startswith(("attacks", "seed=")) for o in overrides)


def reattack(
    path: Path, overrides: list[str], out: Path, data_root: str | None, base_overrides: Sequence[str] = ()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the attacks of ``path`` + ``base_overrides`` + ``overrides`` on the final checkpoint of the main run
    (``path`` + ``base_overrides``, e.g. a ``--dataset`` swap)."""
    if not attack_only(overrides):
        raise SystemExit(f"extra settings may change only attacks or the seed, got {overrides}")
    _, base, _ = run_one(path, list(base_overrides), out, data_root)
    base_dir = out / base["config_hash"]
    cfg = load_config(path, [*base_overrides, *overrides]).resolved()
    run_dir = out / cfg.hash()
    result_file, wall_file = run_dir / "result.json", run_dir / "wall.json"
    if result_file.is_file():
        print(f"[skip] {path.stem} {' '.join(overrides)}: {result_file} exists", flush=True)
        return json.loads(result_file.read_text()), json.loads(wall_file.read_text())
    print(f"[atk ] {path.stem} {' '.join(overrides)} on {base_dir}/checkpoints -> {run_dir}", flush=True)
    tic = time.perf_counter()
    previous = torch.get_num_threads()
    torch.set_num_threads(cfg.train.threads)
    try:
        vd = load_vertical_data(cfg, data_root)
        plan = validate_attacks(cfg, vd)
        for planned in plan.attacks:
            if planned.attack.phase != "post_training" or planned.attack.every_epoch:
                raise SystemExit(f"{planned.attack.name}: only post-training attacks can run on a checkpoint")
        fed = build_federation(cfg, vd, keep=plan.keep)
        for party in fed.parties():
            for role, model in party.models().items():
                state = torch.load(base_dir / "checkpoints" / f"{party.name}.{role}.final.pt", weights_only=True)
                model.load_state_dict(state)
        attacks, seconds = run_attacks(plan, TrainedRun(cfg, vd, fed, History(), 0.0))
    finally:
        torch.set_num_threads(previous)
    result = dict(
        base,
        config_hash=cfg.hash(),
        attacks=[a.__dict__ for a in attacks],
        timing=dict(base["timing"], attack_seconds=seconds),
        reattacked_from=base["config_hash"],
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(result_file, result)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    wall = {
        "wall_seconds": time.perf_counter() - tic,
        "overrides": overrides,
        "mode": "re-attack of checkpoint",
        "reattacked_from": base["config_hash"],
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "loadavg": os.getloadavg(),
    }
    wall_file.write_text(json.dumps(wall, indent=2) + "\n")
    return result, wall


def fmt(x: float | None, digits: int = 2) -> str:
    """A number, or a dash."""
    return "–" if x is None else f"{x:.{digits}f}"


def rows_for(name: str, label: str, result: dict[str, Any], wall: dict[str, Any]) -> list[str]:
    """Markdown rows: one per attack, utility repeated (final and best epoch)."""
    paper = PAPER.get(name, {"utility": None, "attacks": {}})
    util = result["utility"]
    final = 100 * util["value"]
    best = 100 * max(util["per_epoch"]) if util["per_epoch"] else final
    seconds = wall.get("wall_seconds")
    timing = result["timing"]
    out = []
    for a in result["attacks"]:
        pa = paper["attacks"].get(a["name"], {})
        ours_v, ours_p, ours_l = 100 * a["value"], 100 * a["prior"], a["leakage"]
        gap = None if pa.get("leakage") is None else ours_l - pa["leakage"]
        out.append(
            f"| {name} | {label} | {util['metric']} | {fmt(paper['utility'])} | {final:.2f} / {best:.2f} "
            f"| {a['name']} ({a['prior_name']}) | {fmt(pa.get('value'))} | {ours_v:.2f} | {fmt(pa.get('prior'))} "
            f"| {ours_p:.2f} | {fmt(pa.get('leakage'))} | {ours_l:.2f} | {fmt(gap)} "
            f"| {timing['train_seconds']:.0f} + {timing['attack_seconds'].get(a['name'], 0):.0f} "
            f"| {fmt(seconds, 0)} |"
        )
    if not result["attacks"]:
        out.append(
            f"| {name} | {label} | {util['metric']} | {fmt(paper['utility'])} | {final:.2f} / {best:.2f} "
            f"| – | | | | | | | | {timing['train_seconds']:.0f} | {fmt(seconds, 0)} |"
        )
    return out


HEADER = (
    "| config | setting | metric | paper utility | ours final / best epoch | attack (prior) | paper value "
    "| ours value | paper prior | ours prior | paper leakage | ours leakage | leakage gap "
    "| train + attack s | run wall s |\n"
    "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def main(argv: list[str] | None = None) -> int:
    """Run the reproductions and print the comparison table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "configs",
        nargs="*",
        default=list(DEFAULT_CONFIGS),
        help="config names under configs/repro (or YAML paths); default: all three, fastest first",
    )
    p.add_argument("--out", type=Path, default=Path("runs/repro"), help="run directory root")
    p.add_argument("--data-root", default=os.environ.get("VFLBENCH_DATA"))
    p.add_argument("--table", type=Path, help="also write the markdown table here")
    p.add_argument("--extra", action="store_true", help="also run the alternative settings in EXTRA")
    p.add_argument("--no-run", action="store_true", help="only tabulate results that already exist")
    swap.add_arguments(p)
    args = p.parse_args(argv)
    swapped = swap.overrides(args)
    if swapped:
        swap.check(config_path(args.configs[0]), swapped)

    jobs: list[tuple[str, str, list[str]]] = [(Path(c).stem, "as configured", []) for c in args.configs]
    if args.extra:
        jobs += [(n, label, o) for n, label, o in EXTRA if n in {j[0] for j in jobs}]
    rows = []
    for name, label, extra in jobs:
        path = config_path(name)
        overrides = [*swapped, *extra]
        label += swap.label(swapped)
        if args.no_run:
            cfg = load_config(path, overrides).resolved()
            result_file = args.out / cfg.hash() / "result.json"
            if not result_file.is_file():
                print(f"[miss] {name} {label}: no {result_file}", file=sys.stderr)
                continue
            wall_file = result_file.with_name("wall.json")
            result = json.loads(result_file.read_text())
            wall = json.loads(wall_file.read_text()) if wall_file.is_file() else {}
        elif attack_only(extra):
            result, wall = reattack(path, extra, args.out, args.data_root, swapped)
        else:
            _, result, wall = run_one(path, overrides, args.out, args.data_root)
        rows += rows_for(name, label, result, wall)
    table = HEADER + "\n" + "\n".join(rows)
    print(table)
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
