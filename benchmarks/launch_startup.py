"""Wall time of `vflbench launch` against the training it runs: what starting the party processes costs.

Two launches, each ``--repeat`` times, alternating, over loopback without TLS (``--insecure-localhost``), each
into a fresh directory, as a fresh `vflbench launch` process timed from outside (Python's start-up and the
launcher's imports included, as a user waits for them):

- ``demo``: ``src/vflbench/examples/demo.yaml`` with 1 epoch (2 parties: an active and a passive process; the
  ``vanilla`` and ``alone`` baselines train in the active process);
- ``defended``: breast_cancer, 2 parties, MLP2, 2 epochs, ``max_norm`` and ``norm_scoring``: the launch also runs
  the config without its defense (the attack's undefended reference), as ``vflbench run`` does: 4 party processes.

Reported per launch: the wall time, the seconds of training its runs report (``net.json``'s ``epoch_seconds``,
the reference's included), and the rest (start-up: imports and connections; the baselines and attacks; the exits).

Run:  .venv/bin/python benchmarks/launch_startup.py [--repeat 3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFENDED = {
    "data": {"name": "breast_cancer", "parties": 2},
    "model": {"bottom": "mlp2", "top": "mlp2"},
    "train": {
        "algorithm": "vhnn",
        "epochs": 2,
        "batch_size": 32,
        "lr": 0.05,
        "optimizer": "sgd",
        "momentum": 0.0,
        "metric": "auc",
    },
    "defenses": [{"name": "max_norm"}],
    "attacks": [{"name": "norm_scoring"}],
    "seed": 0,
}
LAUNCHES = {
    "demo": (str(ROOT / "src" / "vflbench" / "examples" / "demo.yaml"), ["--set", "train.epochs=1"]),
    "defended": (None, []),
}


def measure(name: str) -> dict[str, float]:
    """One `vflbench launch` into a fresh directory: wall seconds and the training seconds of every run it made."""
    out = Path(tempfile.mkdtemp(prefix="launch_startup_"))
    try:
        config, extra = LAUNCHES[name]
        if config is None:
            config = str(out / "config.yaml.in")
            Path(config).write_text(yaml.safe_dump(DEFENDED))
        load = os.getloadavg()[0]
        tic = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "vflbench.cli",
                "launch",
                config,
                "--insecure-localhost",
                "--out",
                str(out / "runs"),
                *extra,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - tic
        nets = list((out / "runs").glob("*/net.json"))
        training = sum(sum(json.loads(p.read_text())["epoch_seconds"]) for p in nets)
        return {"wall": wall, "training": training, "rest": wall - training, "runs": len(nets), "load": load}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    """Measure, print a table and optionally save the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in LAUNCHES}
    for rep in range(args.repeat):
        for name in LAUNCHES if rep % 2 == 0 else reversed(list(LAUNCHES)):
            samples[name].append(measure(name))
            s = samples[name][-1]
            print(
                f"{name}: wall {s['wall']:.2f} s, training {s['training']:.2f} s ({s['runs']} runs), "
                f"rest {s['rest']:.2f} s, load {s['load']:.2f}",
                flush=True,
            )
    print("| launch | runs | wall s (median) | training s (median) | rest s (median) |")
    print("|---|---:|---:|---:|---:|")
    for name, rows in samples.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("wall", "training", "rest")}
        print(f"| {name} | {rows[0]['runs']} | {med['wall']:.2f} | {med['training']:.2f} | {med['rest']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(samples, indent=1))


if __name__ == "__main__":
    main()
