"""The sweep executor's own cost: sweeps whose runs only sleep, at 1, 2, 4 and 8 workers.

A run that sleeps needs no core, so the executor's overhead (start-up, checks, workers, scheduling, collection) is
measurable on a 2-core machine at any number of workers. Each measurement is a fresh process (``python
sweep_overhead.py --child ...``, timed from outside: Python's start-up and imports included) that starts a sweep
as `vflbench sweep` does (``read_config``, ``start_sweep_workers``, ``check_components``, then ``run_sweep(cfg,
out, workers=n, runner=sleep_point)``) on ``sweep_demo.yaml`` with ``--seeds`` seeds (7 points a seed: 1 undefended, 6
defended, two label attacks each), into a fresh directory. ``sleep_point`` sleeps ``--sleep`` seconds (its points,
defended or not, are independent: it does not wait for an undefended reference) and writes a ``result.json``
shaped like a real one, so that the summary and scores are collected as in a real sweep. It records when each
point started and ended (wall clock, pid).

From each timeline (seconds from the moment the child process was started), with N runs on n workers in ``rounds
= ceil(N / n)`` rounds:

- ``first``: when the first point started (start-up: Python, imports, the checks, the first worker);
- ``busy`` (S): when every worker has started a run (the n-th start);
- ``per_run_busy`` (c): what the executor adds to each run of a worker's sequence after that, ``(last end - S -
  rounds * sleep) / rounds`` (``per_run``: the same from the first start);
- ``tail`` (t): from the last point's end to the process's exit (collection, ending the workers).

The model: ``wall = S + rounds * (sleep + c) + t``.

With two ``--seeds`` values (two sizes of sweep), ``wall = serial + rounds * (sleep + per_run)`` is fitted through
the two walls at each worker count: ``per_run`` is what the executor adds to each run of a worker's sequence,
``serial`` what it adds once (start-up and collection).

Run:  .venv/bin/python benchmarks/sweep_overhead.py [--workers 1 2 4 8] [--sleep 1] [--seeds 4 8] [--repeat 1]
          [--sources ../main/src src] [--json F]

``--first-run-imports`` makes each run import, before it sleeps, what the first real run of a process imports on
its own (``torch._dynamo``, scikit-learn's datasets), so that a version whose workers do not preload them pays for
it as with real runs. ``--sources`` compares versions side by side (measured alternately; the code before issue 26
is started as its command line started a sweep: ``load_config``, then ``run_sweep``).
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the imports: the child's timeline starts here

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

SLEEP_ENV = "VFLBENCH_BENCH_SLEEP"
IMPORTS_ENV = "VFLBENCH_BENCH_FIRST_RUN_IMPORTS"
EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "vflbench" / "examples" / "sweep_demo.yaml"


def sleep_point(config: dict[str, Any], runs_dir: str, data_root: str | None) -> str:
    """A sweep runner that sleeps instead of training and writes a result.json shaped like a real one."""
    from vflbench.experiment.config import ExperimentConfig
    from vflbench.experiment.results import write_atomic

    start = time.time()
    if os.environ.get(IMPORTS_ENV):  # what a process's first real run imports on its own (torch's optimizers: dynamo)
        import sklearn.datasets  # noqa: F401
        import torch._dynamo  # noqa: F401
    time.sleep(float(os.environ[SLEEP_ENV]))
    cfg = ExperimentConfig.model_validate(config)
    digest = cfg.hash()
    attacks = [
        {
            "name": a.name,
            "target": "labels",
            "metric": "auc",
            "direction": "higher",
            "value": 0.8,
            "prior": 0.5,
            "prior_name": "random guess",
            "leakage": 30.0,
            "undefended_leakage": 30.0,
            "leaks_without_defense": True,
        }
        for a in cfg.attacks
    ]
    result = {
        "config_hash": digest,
        "seed": cfg.seed,
        "data": {"n_train": 455, "n_test": 114, "dataset": cfg.data.name, "parties": 2},
        "utility": {"metric": "auc", "value": 0.95},
        "defense": [{"name": d.name, "params": d.params()} for d in cfg.defenses],
        "attacks": attacks,
        "timing": {"train_seconds": 1.0, "epoch_seconds": [1.0], "attack_seconds": {}},
        "comm": {"messages": 0, "bytes_up": 0, "bytes_down": 0},
    }
    run_dir = Path(runs_dir) / digest
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / "result.json", json.dumps(result))
    timeline = Path(runs_dir).parent / "timeline"
    timeline.mkdir(exist_ok=True)
    (timeline / f"{digest}.json").write_text(json.dumps({"start": start, "end": time.time(), "pid": os.getpid()}))
    return digest


def child(out: Path, workers: int, seeds: int) -> None:
    """One sweep of sleeping runs in this process, started as `vflbench sweep` starts one (the workers' fork
    server first, then the checks); writes the process's own times to ``out/child.json``."""
    import atexit
    import gc
    import importlib.util

    overrides = [f"sweep.seeds={json.dumps(list(range(seeds)))}"]
    if importlib.util.find_spec("vflbench.experiment.workers") is not None:
        from vflbench.cli import collector_paused
        from vflbench.experiment.config import check_components, read_config
        from vflbench.experiment.workers import start_sweep_workers

        atexit.register(gc.freeze)  # as vflbench.cli.main does
        imported = time.time()
        cfg = read_config(EXAMPLE, overrides)
        start_sweep_workers(cfg.sweep, workers)
        with collector_paused():
            from vflbench.experiment import sweep

            check_components(cfg)
    else:  # the code before issue 26, started as its command line started a sweep
        from vflbench.experiment import sweep
        from vflbench.experiment.config import load_config

        imported = time.time()
        cfg = load_config(EXAMPLE, overrides)
    announced: list[float] = []
    done: list[float] = []
    table = sweep.run_sweep(
        cfg,
        out,
        workers=workers,
        runner=sleep_point,
        on_start=lambda to_run, total: announced.append(time.time()),
        on_done=lambda point: done.append(time.time()),
    )
    (out / "child.json").write_text(
        json.dumps(
            {
                "started": STARTED,
                "imported": imported,
                "announced": announced[0],
                "reported": done,
                "returned": time.time(),
                "rows": len(table),
            }
        )
    )


def measure(
    workers: int, seeds: int, sleep: float, source: str | None = None, first_run_imports: bool = False
) -> dict[str, Any]:
    """Run one child sweep (with ``source`` first on its PYTHONPATH: another version's ``src``); its wall time and
    the timeline's decomposition."""
    out = Path(tempfile.mkdtemp(prefix=f"sweep_overhead_{workers}_"))
    try:
        load = os.getloadavg()[0]
        tic = time.time()
        subprocess.run(
            [sys.executable, __file__, "--child", str(out), "--workers", str(workers), "--seeds", str(seeds)],
            check=True,
            env={
                **os.environ,
                SLEEP_ENV: str(sleep),
                IMPORTS_ENV: "1" if first_run_imports else "",
                **({"PYTHONPATH": source} if source else {}),
            },
        )
        wall = time.time() - tic
        own = json.loads((out / "child.json").read_text())
        points = [json.loads(p.read_text()) for p in (out / "timeline").glob("*.json")]
        n = len(points)
        first = min(p["start"] for p in points) - tic
        last = max(p["end"] for p in points) - tic
        rounds = math.ceil(n / workers)
        phase = last - first
        starts = sorted(p["start"] - tic for p in points)
        busy = starts[min(workers, n) - 1]  # every worker has started a run
        return {
            "source": source or "",
            "workers": workers,
            "runs": n,
            "rounds": rounds,
            "sleep": sleep,
            "wall": wall,
            "imports": own["imported"] - tic,
            "announced": own["announced"] - tic,
            "first": first,
            "phase": phase,
            "tail": wall - last,
            "returned": own["returned"] - tic,
            "ideal": rounds * sleep,
            "per_run": (phase - rounds * sleep) / rounds,
            "busy": busy,
            "per_run_busy": (last - busy - rounds * sleep) / rounds,
            "pids": len({p["pid"] for p in points}),
            "starts": [round(t, 3) for t in starts],
            "ends": sorted(round(p["end"] - tic, 3) for p in points),
            "reported": [round(t - tic, 3) for t in own["reported"]],
            "load_before": load,
            "load_after": os.getloadavg()[0],
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)


def fit(small: dict[str, Any], large: dict[str, Any]) -> dict[str, float]:
    """``wall = serial + rounds * (sleep + per_run)`` through two sweeps of different sizes at one worker count:
    ``per_run`` is what the executor adds to each run in a worker's sequence, ``serial`` what it adds once."""
    step = (large["wall"] - small["wall"]) / (large["rounds"] - small["rounds"])
    per_run = step - small["sleep"]
    return {"per_run": per_run, "serial": small["wall"] - small["rounds"] * step}


def main() -> None:
    """Parse arguments; in the parent, run the measurements and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--sleep", type=float, default=1.0, help="seconds each run sleeps")
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[4, 8],
        help="seeds of sweep_demo.yaml (7 points each): one sweep per value; two values give a fit",
    )
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--sources",
        nargs="+",
        default=[None],
        help="source trees to compare (each one's src is put first on the child's PYTHONPATH), "
        "measured alternately; default: this environment's vflbench",
    )
    ap.add_argument(
        "--first-run-imports",
        action="store_true",
        help="each run first imports what a process's first real run imports on its own (torch._dynamo, "
        "scikit-learn's datasets: ~0.8 s of CPU once per process unless its fork server preloaded "
        "them), then sleeps",
    )
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.workers[0], args.seeds[0])
        return
    results = []
    for rep in range(args.repeat):
        for w in args.workers if rep % 2 == 0 else list(reversed(args.workers)):
            for seeds in args.seeds:
                for source in args.sources if rep % 2 == 0 else list(reversed(args.sources)):
                    r = {"repeat": rep, **measure(w, seeds, args.sleep, source, args.first_run_imports)}
                    results.append(r)
                    print(
                        f"{r['source']} workers {w}, {r['runs']} runs: wall {r['wall']:.2f} s (ideal "
                        f"{r['ideal']:.0f} s), imports {r['imports']:.2f} s, announced {r['announced']:.2f} s, "
                        f"first run {r['first']:.2f} s, every worker busy {r['busy']:.2f} s, tail {r['tail']:.2f} s "
                        f"(run_sweep returned {r['returned'] - r['first'] - r['phase']:.2f} s after the last run), "
                        f"{r['pids']} processes ran points, load {r['load_before']:.2f}",
                        flush=True,
                    )
    print()
    print(
        "| source | workers | runs | rounds | wall s | rounds x sleep s | first run starts s | every worker busy (S) "
        "s | executor per run (c) s | tail (t) s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['source']} | {r['workers']} | {r['runs']} | {r['rounds']} | {r['wall']:.2f} | {r['ideal']:.0f} | "
            f"{r['first']:.2f} | {r['busy']:.2f} | {r['per_run_busy']:.3f} | {r['tail']:.2f} |"
        )
    fits = []
    sizes = sorted({r["runs"] for r in results})
    if len(sizes) == 2:
        print()
        print("| source | repeat | workers | serial s | executor per run s (fit of the two sizes) |")
        print("|---|---:|---:|---:|---:|")
        for rep in range(args.repeat):
            for source in args.sources:
                for w in args.workers:
                    small, large = (
                        next(
                            r
                            for r in results
                            if (r["repeat"], r["source"], r["workers"], r["runs"]) == (rep, source or "", w, n)
                        )
                        for n in sizes
                    )
                    fits.append({"repeat": rep, "source": source or "", "workers": w, **fit(small, large)})
                    print(f"| {source or ''} | {rep} | {w} | {fits[-1]['serial']:.2f} | {fits[-1]['per_run']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"cpus": os.cpu_count(), "results": results, "fits": fits}, indent=1))


if __name__ == "__main__":
    main()
