"""CPU seconds of the command line's metadata commands against ``python -c "import torch"``, in one run.

Each command (``--help``, ``--version``, ``list models``, ``describe vmask``, ``init``, ``datasets verify``) and the
reference ``import torch`` is run ``--repeat`` times as a fresh process, interleaved (command after command, round
after round), so that a change of the machine's load hits all of them alike. The CPU time of a process is its user
+ system time (``resource.getrusage(RUSAGE_CHILDREN)`` around it); wall time is printed beside. Reported: the
median of each, and each command's median CPU as a ratio to ``import torch``'s (the issue's target for ``list
models``: at most 0.25).

Run:  .venv/bin/python benchmarks/cli_startup.py [--repeat 5] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {
    "--help": ["--help"],
    "--version": ["--version"],
    "list models": ["list", "models"],
    "describe vmask": ["describe", "vmask"],
    "init": ["init", "{tmp}", "--force"],
    "datasets verify": ["datasets", "verify"],
}
TORCH = "import torch"


def timed(command: list[str]) -> tuple[float, float]:
    """CPU seconds (user + system) and wall seconds of one fresh process running ``command`` (its exit status is
    not checked: an older version without ``--version`` is measured as it is)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    tic = time.perf_counter()
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - tic
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall


def main() -> None:
    """Measure, print a markdown table and optionally save the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in [TORCH, *COMMANDS]}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            samples[TORCH].append(timed([sys.executable, "-c", TORCH]))
            for name, argv in COMMANDS.items():
                samples[name].append(timed([sys.executable, "-m", "vflbench.cli", *(a.format(tmp=tmp) for a in argv)]))
    load.append(os.getloadavg()[0])
    cpu = {name: statistics.median(c for c, _ in s) for name, s in samples.items()}
    wall = {name: statistics.median(w for _, w in s) for name, s in samples.items()}
    print(f"{args.repeat} interleaved rounds, load average {load[0]:.2f} -> {load[1]:.2f}")
    print("| command | CPU s (median) | wall s (median) | CPU / import torch |")
    print("|---|---:|---:|---:|")
    for name in samples:
        print(f"| `{name}` | {cpu[name]:.3f} | {wall[name]:.3f} | {cpu[name] / cpu[TORCH]:.3f} |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "load": load,
                    "samples": samples,
                    "cpu_median": cpu,
                    "wall_median": wall,
                    "ratio": {n: cpu[n] / cpu[TORCH] for n in samples},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
