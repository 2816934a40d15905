"""The prepared GPU check of issue 26: one script, under 5 minutes on one H100, its results in one folder.

Parts, each in its own process with its own time budget (a part that runs out is stopped and reported with
what it had done):

* ``device``: the machine (torch, CUDA, GPU), and the exactness of VMask's ring products on it: the 16-bit-limb
  float64 products (CUDA has no int64 matmul) against the CPU's int64 products, bit for bit, for a matmul with
  extreme values and a convolution and its input gradient; ring draws and initial weights identical to the CPU's;
  the limb product's time beside a float32 product of the same shape.
* ``vmask``: VMask's Table III per-epoch time ratios VMask / vanilla on this device, for MLP3/TabMNIST and
  LeNet5/MNIST (the method of ``vmask_speed.py``: the three federations trained on the same batches in interleaved
  blocks, VMask's end-of-epoch work added once per epoch), beside the paper's 3.3x and 5.6x.
* ``dmavfl``: the DMAVFL paper-scale MNIST row ``paper_mnist_conv_map_dmavfl`` (``reproduce_dmavfl.py``), seed 0:
  value, prior, leakage and seconds, beside the paper's 0.0152 and our CPU's 0.0071 ([-1, 1] units).
* ``tests``: the fast test suite with ``train.device: auto`` resolving to cuda (``VFLBENCH_DEVICE=cuda``), its
  pass/fail counts and the failures' short tracebacks.

Two more parts measure the machine's cores rather than its GPU, and run only when ``--parts`` names them:

* ``sweep``: issue 26's sweep, ``sweep_demo.yaml`` with 40 epochs and seeds 0-3 (28 runs of about 2 s), by
  ``vflbench sweep --device cpu`` in a fresh process each time, with 8, 1 and 14 workers: wall seconds, the speed-up
  over 1 worker and the sum of the runs' own seconds;
* ``lan``: ``network_vmask.py --shape lan --launch-only`` (VMask and vanilla MLP3/TabMNIST, every party its own
  process on the shaped 836 Mbit/s link), 5 rounds on the CPU and, with CUDA, 3 rounds with every party on the GPU:
  VMask / vanilla per epoch (epoch 1: the first layer masked; epoch 2: all three) with the 95% interval over rounds.

``device``, ``vmask``, ``sweep`` and ``lan`` run first, one at a time (they are timings); ``dmavfl`` and ``tests``
then run side by side (``--serial``: one after the other), each with what is left of ``--total`` seconds. Without
CUDA, ``vmask``, ``dmavfl`` and ``tests`` are skipped, saying so, unless ``--smoke`` runs every part on the CPU with
tiny settings (the plumbing).

Writes ``gpu_check.json`` (everything), ``gpu_check.txt`` (a short summary), ``tests.log`` (the suite's output)
and ``dmavfl.npz`` (the first test rows and their reconstructions) into ``--out`` (default ``$OUT``). The parts'
own files go to ``--work`` (default a temporary folder).

On the lent GPU machine (``.data``: a copy of the datasets folder; ``.whl``: ``benchmarks/gpu_wheels.sh``)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
        .whl/*.whl && export PYTHONPATH=$PWD/src:/tmp/site || exit; \\
        PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --data-root .data --out $OUT

Here, the plumbing: ``python benchmarks/gpu_check.py --smoke --data-root ../shared/datasets --out /tmp/gpu``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("device", "vmask", "sweep", "lan", "dmavfl", "tests")
DEFAULT_PARTS = ("device", "vmask", "dmavfl", "tests")
ALONE = ("device", "vmask", "sweep", "lan")
"""The parts that are timings: each runs alone, in this order."""
BUDGETS = {"device": 25.0, "vmask": 50.0, "sweep": 170.0, "lan": 170.0}
"""Seconds for the parts that run alone; ``dmavfl`` and ``tests`` share what is left of ``--total``."""
NEEDS_CUDA = ("vmask", "dmavfl", "tests")
SWEEP_EXAMPLE = ROOT / "src" / "vflbench" / "examples" / "sweep_demo.yaml"
PAPER_VMASK = {"mlp3, tabmnist": 3.3, "lenet5, mnist": 5.6}
"""VMask Table III: per-epoch time of VMask over vanilla (GPU, one process)."""
DMAVFL_ROW = "paper_mnist_conv_map_dmavfl"
DMAVFL_PAPER, DMAVFL_CPU = 0.0152, 0.0071
"""The paper's MNIST reconstruction MSE and ours on the CPU (seed 0), both in [-1, 1] pixel units."""


def write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as JSON atomically (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    tmp.replace(path)


# -- the parts (each runs in its own process: ``--part NAME``) ---------------------------------------------


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Any, device: Any, repeats: int) -> float:
    """Median seconds of ``fn()`` on ``device`` (after a warm-up; the device synchronised around each call)."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        tic = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - tic)
    return sorted(times)[len(times) // 2]


def part_device(args: argparse.Namespace) -> dict[str, Any]:
    """The machine, and VMask's ring arithmetic on it against the CPU's, bit for bit."""
    import torch

    from vflbench.devices import device_name, resolve_device
    from vflbench.models import build_top
    from vflbench.mpc.ring import ring_conv2d, ring_conv2d_input_grad, ring_matmul, uniform
    from vflbench.rng import generator

    device = resolve_device("auto")
    method = "auto" if device.type == "cuda" else "limbs"  # on the CPU: the limb path forced, for the plumbing
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "cuda_available": torch.cuda.is_available(),
        "device": device_name(device),
        "ring_method": "limbs (float64)" if method != "int64" else "int64",
    }
    g = torch.Generator().manual_seed(0)
    extremes = torch.tensor([-(2**63), 2**63 - 1, -1, 0, 1, 2**16 - 1, 2**48 + 7, -(2**32)], dtype=torch.int64)

    def ring(*shape: int) -> Any:
        mixed = uniform(shape, g)
        pick = torch.randint(0, 4, shape, generator=g) == 0
        return torch.where(pick, extremes[torch.randint(0, len(extremes), shape, generator=g)], mixed)

    exact: dict[str, bool] = {}
    shapes = [(128, 784, 256), (128, 256, 128)] if not args.smoke else [(16, 64, 8)]
    for m, k, n in shapes:
        a, b = ring(m, k), ring(k, n)
        exact[f"matmul {m}x{k}x{n}"] = torch.equal(ring_matmul(a.to(device), b.to(device), method=method).cpu(), a @ b)
    x, w = ring(16, 1, 28, 28), ring(6, 1, 5, 5)
    y = ring_conv2d(x, w, stride=1, padding=2)
    exact["conv2d lenet5 layer 1"] = torch.equal(
        ring_conv2d(x.to(device), w.to(device), stride=1, padding=2, method=method).cpu(), y
    )
    gy = ring(*y.shape)
    exact["conv2d input gradient"] = torch.equal(
        ring_conv2d_input_grad(gy.to(device), w.to(device), (28, 28), stride=1, padding=2, method=method).cpu(),
        ring_conv2d_input_grad(gy, w, (28, 28), stride=1, padding=2),
    )
    exact["ring draws"] = torch.equal(
        uniform((64, 64), torch.Generator().manual_seed(1), device=device).cpu(),
        uniform((64, 64), torch.Generator().manual_seed(1)),
    )
    top_dev = build_top("mlp2", 32, 10, generator(0, "top"), device=device)
    top_cpu = build_top("mlp2", 32, 10, generator(0, "top"))
    exact["initial weights"] = all(
        torch.equal(p.cpu(), q) for p, q in zip(top_dev.parameters(), top_cpu.parameters(), strict=True)
    )
    out["bit_identical_to_cpu"] = exact
    timings: dict[str, dict[str, float]] = {}
    for m, k, n in shapes:
        a, b = ring(m, k).to(device), ring(k, n).to(device)
        af, bf = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        limb = _timed(lambda a=a, b=b: ring_matmul(a, b, method=method), device, 20)
        f32 = _timed(lambda af=af, bf=bf: af @ bf, device, 20)
        timings[f"{m}x{k}x{n}"] = {"ring_ms": 1000 * limb, "float32_ms": 1000 * f32, "ratio": limb / f32}
    out["ring_matmul_timings"] = timings
    return out


def _vmask_federations(dataset: str, bottom: str, data_root: str, rows: int, device: str) -> dict[str, Any]:
    from vflbench.experiment.config import build_config
    from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses

    variants = {"vanilla": [], "vmask (layer 1 masked)": [{"name": "vmask"}]}
    feds = {}
    for name, defenses in variants.items():
        cfg = build_config(
            {
                "data": {"name": dataset, "root": data_root, "train_size": rows, "aux_pool": min(640, rows // 4)},
                "model": {"bottom": bottom, "top": "mlp2"},
                "train": {"epochs": 2, "batch_size": 128, "lr": 0.1, "momentum": 0.0, "device": device},
                "defenses": defenses,
            }
        )
        feds[name] = build_federation(cfg, load_vertical_data(cfg), defenses=plan_defenses(cfg, ["passive_1"]))
    return feds


def part_vmask(args: argparse.Namespace) -> dict[str, Any]:
    """VMask / vanilla per epoch on this device (``vmask_speed.py``'s method), beside Table III."""
    import statistics

    import torch

    from vflbench.devices import device_name, resolve_device

    device = resolve_device("auto")
    blocks, steps = (1, 2) if args.smoke else (3, 20)
    results: dict[str, Any] = {"device": device_name(device), "blocks": blocks, "steps": steps, "cases": {}}
    for dataset, bottom in (("tabmnist", "mlp3"), ("mnist", "lenet5")):
        tic = time.perf_counter()
        rows = 128 * max(steps, 6)
        feds = _vmask_federations(dataset, bottom, args.data_root, rows, str(device))
        ids = torch.randperm(rows, generator=torch.Generator().manual_seed(0))
        batch = [ids[s * 128 : (s + 1) * 128] for s in range(steps)]
        for f in feds.values():  # warm-up: the kernels, the allocator, cuBLAS handles
            for s in range(3):
                f.train_step(batch[s % steps], epoch=0, step=s)
        times: dict[str, list[float]] = {n: [] for n in feds}
        for _ in range(blocks):
            for name, f in feds.items():
                _sync(device)
                start = time.perf_counter()
                for s in range(steps):
                    f.train_step(batch[s], epoch=0, step=s)
                _sync(device)
                times[name].append((time.perf_counter() - start) / steps)
        per_step = {n: statistics.median(t) for n, t in times.items()}
        defense = feds["vmask (layer 1 masked)"].active.defenses[0]
        start = time.perf_counter()
        defense.on_epoch_end(0)  # the shadow update and the layer selection, once per epoch
        _sync(device)
        epoch_end = time.perf_counter() - start
        steps_per_epoch = 60000 // 128 + 1
        vanilla = per_step["vanilla"] * steps_per_epoch
        vmask = per_step["vmask (layer 1 masked)"] * steps_per_epoch + epoch_end
        key = f"{bottom}, {dataset}"
        results["cases"][key] = {
            "per_step_ms": {n: 1000 * v for n, v in per_step.items()},
            "epoch_end_seconds": epoch_end,
            "epoch_seconds": {"vanilla": vanilla, "vmask": vmask},
            "per_epoch_ratio": vmask / vanilla,
            "paper_ratio": PAPER_VMASK[key],
            "seconds": time.perf_counter() - tic,
        }
    return results


def part_dmavfl(args: argparse.Namespace) -> dict[str, Any]:
    """The DMAVFL paper-scale MNIST row, seed 0, on this device (partial progress in ``--work`` every epoch)."""
    import dataclasses

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce_dmavfl as rd

    from vflbench.devices import device_name, resolve_device

    exp = rd.EXPERIMENTS[DMAVFL_ROW]
    if args.smoke:  # the plumbing only: a few rows, one epoch of each phase
        exp = dataclasses.replace(
            exp,
            data={"train_size": 700, "test_size": 100, "aux_pool": 100},
            train={"epochs": 1},
            attack_params={"pretrain_epochs": 1},
        )
    record = rd.run_one(DMAVFL_ROW, exp, args.data_root, Path(args.work))
    value, prior = record.get("value"), record.get("prior")
    record.pop("details", None)
    record.update(
        device=device_name(resolve_device("auto")),
        value_pm1=None if value is None else 4 * value,
        prior_pm1=None if prior is None else 4 * prior,
        paper_pm1=DMAVFL_PAPER,
        cpu_seed0_pm1=DMAVFL_CPU,
        smoke=args.smoke,
    )
    return record


def _sweep_timeline(runs: Path, began: float, workers: int) -> dict[str, float]:
    """When the runs of a finished sweep started and ended (seconds from ``began``, the sweep's launch), from their
    files: a run writes ``config.yaml`` first and ``result.json`` last."""
    spans = []
    for run in runs.iterdir():
        if (run / "result.json").is_file():
            spans.append((min(f.stat().st_mtime for f in run.iterdir()), (run / "result.json").stat().st_mtime))
    starts = sorted(s for s, _ in spans)
    return {
        "first_start_s": starts[0] - began,
        "all_busy_s": starts[min(workers, len(starts)) - 1] - began,
        "last_end_s": max(e for _, e in spans) - began,
        "sum_run_wall_s": sum(e - s for s, e in spans),
    }


def _wall(cmd: list[str]) -> float:
    tic = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - tic


def part_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Issue 26's sweep on this machine's cores: wall seconds with 8, 1 and 14 workers (a fresh ``vflbench sweep``
    each, timed from outside), the speed-up over 1 worker, the sum of the runs' own seconds and the timeline (when
    the first run started, when every worker had one, when the last ended); beside them what a fresh process pays to
    import torch and to start the CLI, and ``sweep_overhead.py``'s sleeping runs at 8 workers (the executor and each
    worker's first-run imports). Every finished measurement is written to ``--work`` at once, so a part stopped at
    its budget keeps what it measured."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import sweep_workers

    from vflbench.experiment.sweep import RUNS

    epochs, seeds, counts = (2, "[0]", (2, 1)) if args.smoke else (40, "[0, 1, 2, 3]", (8, 1, 14))
    work = Path(args.work)
    out: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "config": f"{SWEEP_EXAMPLE.name}, train.epochs={epochs}, sweep.seeds={seeds}, --device cpu",
        "start_up_s": {
            "python -c 'import torch' (first, second)": [_wall([sys.executable, "-c", "import torch"]) for _ in "12"],
            "vflbench --version": _wall([sys.executable, "-m", "vflbench.cli", "--version"]),
            "python -c 'import vflbench.experiment.run'": _wall(
                [sys.executable, "-c", "import vflbench.experiment.run"]
            ),
        },
        "workers": {},
    }
    overhead = work / "sweep_overhead.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "sweep_overhead.py"), "--workers", "8", "--first-run-imports"]
    cmd += ["--json", str(overhead), "--seeds", "1" if args.smoke else "4", "--sleep", "0.2" if args.smoke else "1"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    out["sleeping_runs_8_workers"] = json.loads(overhead.read_text())
    write_json(work / "sweep.json", out)
    for n in counts:
        with tempfile.TemporaryDirectory(prefix="gpu_check_sweep_") as tmp:
            cmd = [sys.executable, "-m", "vflbench.cli", "sweep", str(SWEEP_EXAMPLE), "--out", tmp]
            cmd += ["--workers", str(n), "--device", "cpu"]
            cmd += ["--set", f"train.epochs={epochs}", "--set", f"sweep.seeds={seeds}"]
            load = os.getloadavg()[0]
            began, tic = time.time(), time.perf_counter()
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            wall = time.perf_counter() - tic
            if done.returncode:
                raise RuntimeError(f"vflbench sweep --workers {n} failed ({done.returncode}):\n{done.stderr[-2000:]}")
            runs, own = sweep_workers._own_seconds(Path(tmp))
            timeline = _sweep_timeline(Path(tmp) / RUNS, began, n)
        out["workers"][str(n)] = {
            "wall_s": wall,
            "runs": runs,
            "sum_run_s": own,
            **timeline,
            "load_before": load,
        }
        base = out["workers"].get("1")
        if base:
            for row in out["workers"].values():
                row["speedup"] = base["wall_s"] / row["wall_s"]
        write_json(work / "sweep.json", out)
    return out


def part_lan(args: argparse.Namespace) -> dict[str, Any]:
    """VMask / vanilla on the shaped LAN with every party in its own process (``network_vmask.py``), on the CPU and,
    with CUDA, on the GPU; each finished measurement written to ``--work`` at once."""
    import torch

    runs = [("cpu", 1 if args.smoke else 5)] + ([("cuda", 3)] if torch.cuda.is_available() and not args.smoke else [])
    out: dict[str, Any] = {"cpus": os.cpu_count(), "devices": {}}
    for device, rounds in runs:
        path = Path(args.work) / f"network_vmask_lan_{device}.json"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "network_vmask.py"), "--shape", "lan", "--launch-only"]
        cmd += ["--device", device, "--repeats", str(rounds), "--out", str(path)]
        cmd += ["--train-size", "1280", "--epochs", "2"] if args.smoke else []
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode:
            raise RuntimeError(f"network_vmask.py --device {device} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        report = json.loads(path.read_text())
        out["devices"][device] = {
            "rounds": rounds,
            "ms_per_step_rounds": report["rounds_ms_per_step"],
            "ratio_per_epoch_rounds": report["ratio_per_epoch_rounds"]["vmask"],
            "ratio_per_epoch_interval": report["ratio_per_epoch_interval"]["vmask"],
            "bytes_per_step": {v: r["per_step"]["bytes"] for v, r in report["variants"].items()},
            "load": [report["load_before"], report["load_after"]],
        }
        write_json(Path(args.work) / "lan.json", out)
    return out


PART_FUNCTIONS = {
    "device": part_device,
    "vmask": part_vmask,
    "sweep": part_sweep,
    "lan": part_lan,
    "dmavfl": part_dmavfl,
}


# -- the orchestrator ---------------------------------------------------------------------------------------


def _start(cmd: list[str], env: dict[str, str], log: Any = None) -> subprocess.Popen:
    """``cmd`` in its own process group (so that a late part is stopped with all it started), its output to ``log``
    (an open file) or a pipe."""
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        start_new_session=True,
        text=True,
        stdout=log if log is not None else subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _stop(proc: subprocess.Popen) -> None:
    """Stop ``proc`` and everything it started (its own process group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _wait(procs: dict[str, tuple[subprocess.Popen, float, float]]) -> dict[str, tuple[int | None, float]]:
    """Wait for every process until its deadline; stop the late ones. ``name -> (returncode or None, seconds)``."""
    done: dict[str, tuple[int | None, float]] = {}
    while len(done) < len(procs):
        for name, (proc, started, deadline) in procs.items():
            if name in done:
                continue
            if proc.poll() is not None:
                done[name] = (proc.returncode, time.monotonic() - started)
            elif time.monotonic() > deadline:
                _stop(proc)
                done[name] = (None, time.monotonic() - started)
        time.sleep(0.2)
    return done


def _part_cmd(args: argparse.Namespace, name: str) -> list[str]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--part",
        name,
        "--work",
        args.work,
        "--data-root",
        args.data_root,
    ]
    return cmd + (["--smoke"] if args.smoke else [])


def _tests_cmd(args: argparse.Namespace) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-o",
        "addopts=",
        "-m",
        "not slow",
        "-p",
        "no:cacheprovider",
        "-v",
        "--tb=short",
        "-rfE",
        "--color=no",
    ]
    if args.workers > 1 and importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(args.workers)]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += ["--timeout", "120"]  # a test that hangs on the GPU fails alone instead of stopping the suite
    return cmd + (["tests/test_devices.py", "tests/mpc/test_mpc_ring.py"] if args.smoke else [])


OUTCOME = r"(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)"
TEST_LINE = re.compile(rf"\b{OUTCOME}\b\s+(tests/\S+)|(tests/\S+)\s+{OUTCOME}\b")
"""A test's line in ``pytest -v`` output: ``[gw3] [ 12%] PASSED tests/x.py::t`` (xdist) or ``tests/x.py::t PASSED``."""


def parse_tests(log: str) -> dict[str, Any]:
    """Counts by outcome and the failures (id and short traceback) from a ``pytest -v --tb=short`` log, finished or
    cut off (the per-test lines come as the tests end)."""
    outcomes: dict[str, str] = {}
    for m in TEST_LINE.finditer(log):
        outcome, test = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        outcomes[test] = outcome
    counts: dict[str, int] = {}
    for outcome in outcomes.values():
        counts[outcome.lower()] = counts.get(outcome.lower(), 0) + 1
    failed = sorted(t for t, o in outcomes.items() if o in ("FAILED", "ERROR"))
    tracebacks: dict[str, str] = {}
    section = log.split("= FAILURES =", 1)[1] if "= FAILURES =" in log else ""
    parts = re.split(r"\n_{3,} (.+?) _{3,}\n", section)
    for title, body in zip(parts[1::2], parts[2::2], strict=False):
        body = re.split(r"\n=+ ", body, maxsplit=1)[0]
        lines = [line for line in body.strip().splitlines() if line.strip()]
        tracebacks[title.strip()] = "\n".join(lines[-12:])
    summary = re.findall(r"=+ (.*(?:passed|failed|error).*) in [\d.]+s", log)
    return {"counts": counts, "failed": failed, "tracebacks": tracebacks, "summary": summary[-1] if summary else None}


def summary_text(report: dict[str, Any]) -> str:
    """The short text summary of ``gpu_check.json``."""
    lines = [f"gpu_check ({'smoke, ' if report['smoke'] else ''}{report['seconds']:.0f} s): {report['machine']}"]
    for name in [p for p in PARTS if p in report["parts"]]:
        part = report["parts"][name]
        status = part.get("status", "not run")
        timing = f" ({part['seconds']:.0f} s of {part['budget']:.0f})" if "seconds" in part else ""
        lines.append(f"\n[{name}] {status}{timing}")
        result = part.get("result") or {}
        if name == "device" and result:
            lines.append(f"  {result.get('device')}, torch {result.get('torch')}, CUDA {result.get('cuda')}")
            for what, ok in (result.get("bit_identical_to_cpu") or {}).items():
                lines.append(f"  {'exact' if ok else 'DIFFERS'}: {what}")
            for shape, t in (result.get("ring_matmul_timings") or {}).items():
                lines.append(
                    f"  ring matmul {shape}: {t['ring_ms']:.2f} ms, float32 {t['float32_ms']:.3f} ms "
                    f"({t['ratio']:.0f}x)"
                )
        if name == "vmask" and result:
            for case, r in result.get("cases", {}).items():
                lines.append(
                    f"  {case}: VMask/vanilla per epoch {r['per_epoch_ratio']:.2f}x "
                    f"(paper {r['paper_ratio']}x; ms/step {r['per_step_ms']['vanilla']:.2f} vs "
                    f"{r['per_step_ms']['vmask (layer 1 masked)']:.2f}, end of epoch "
                    f"{r['epoch_end_seconds']:.2f} s)"
                )
        if name == "sweep" and result:
            for n, r in result.get("workers", {}).items():
                speed = f", {r['speedup']:.2f}x over 1 worker" if "speedup" in r else ""
                lines.append(
                    f"  {n} workers: {r['wall_s']:.1f} s for {r['runs']} runs ({r['sum_run_s']:.1f} s of their "
                    f"own){speed}; first run at {r['first_start_s']:.1f} s, every worker busy at "
                    f"{r['all_busy_s']:.1f} s, last end {r['last_end_s']:.1f} s"
                )
            for what, seconds in result.get("start_up_s", {}).items():
                lines.append(f"  {what}: {seconds} s")
        if name == "lan" and result:
            for device, r in result.get("devices", {}).items():
                epochs = ", ".join(
                    f"{e['mean']:.2f}x" + (f" [{e['low']:.2f}, {e['high']:.2f}]" if e["low"] is not None else "")
                    for e in r["ratio_per_epoch_interval"]
                )
                lines.append(f"  {device}, {r['rounds']} rounds: VMask / vanilla per epoch {epochs}")
        if name == "dmavfl" and result:
            if result.get("value_pm1") is not None:
                lines.append(
                    f"  MSE {result['value_pm1']:.4f} in [-1, 1] units (paper {DMAVFL_PAPER}, our CPU "
                    f"{DMAVFL_CPU}); prior {result['prior_pm1']:.4f}; test accuracy "
                    f"{result.get('accuracy')}; {result.get('seconds', 0):.0f} s"
                )
            elif result.get("epochs_done") is not None:
                lines.append(
                    f"  cut off after {result['epochs_done']} epochs in {result.get('seconds', 0):.0f} s "
                    f"(per-epoch MSE on 1,000 test rows, [0, 1] units: {result.get('mse_curve')})"
                )
        if name == "tests" and result:
            lines.append(f"  {result.get('summary') or result.get('counts')}")
            for test in result.get("failed", [])[:25]:
                lines.append(f"  FAILED {test}")
        if part.get("error"):
            lines.append(f"  error: {part['error'][-600:]}")
    return "\n".join(lines) + "\n"


def orchestrate(args: argparse.Namespace) -> int:
    """Run the parts within their budgets; write gpu_check.json, gpu_check.txt, tests.log, dmavfl.npz."""
    import shutil

    import torch

    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    env = {
        **os.environ,
        "VFLBENCH_DEVICE": device,
        "VFLBENCH_DATA": str(Path(args.data_root).resolve()),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PYTHONUNBUFFERED": "1",
    }
    machine = torch.cuda.get_device_name(0) if cuda else "no CUDA device (CPU only)"
    report: dict[str, Any] = {"smoke": args.smoke, "machine": machine, "total_budget": args.total, "parts": {}}
    runnable = {p: cuda or args.smoke or p not in NEEDS_CUDA for p in PARTS}
    chosen = [p for p in PARTS if p in args.parts]
    for name in chosen:
        if not runnable[name]:
            report["parts"][name] = {"status": "skipped: needs CUDA (run with --smoke for the plumbing on the CPU)"}

    def record(name: str, rc: int | None, seconds: float, budget: float, log: str) -> None:
        path = work / f"{name}.json"
        result = json.loads(path.read_text()) if path.is_file() else None
        status = (
            "ok" if rc == 0 else f"stopped at its budget of {budget:.0f} s" if rc is None else f"failed (exit {rc})"
        )
        entry: dict[str, Any] = {"status": status, "seconds": seconds, "budget": budget, "result": result}
        if name == "dmavfl" and result is None and (work / f"{DMAVFL_ROW}.partial.json").is_file():
            entry["result"] = json.loads((work / f"{DMAVFL_ROW}.partial.json").read_text())
        if rc != 0 and log:
            entry["error"] = log[-3000:]
        report["parts"][name] = entry
        write_json(out / "gpu_check.json", {**report, "seconds": time.monotonic() - began})

    for name in [p for p in ALONE if p in chosen and runnable[p]]:
        budget = BUDGETS[name]
        proc = _start(_part_cmd(args, name), env)
        ((rc, seconds),) = _wait({name: (proc, time.monotonic(), time.monotonic() + budget)}).values()
        log = proc.stdout.read() if proc.stdout else ""
        record(name, rc, seconds, budget, log)
    left = max(30.0, args.total - (time.monotonic() - began))
    late = [p for p in ("dmavfl", "tests") if p in chosen and runnable[p]]
    procs: dict[str, tuple[subprocess.Popen, float, float]] = {}
    test_log = out / "tests.log"
    log_file = open(test_log, "w") if "tests" in late else None  # closed once the suite has ended
    for name in late:
        if args.serial and procs:
            done = _wait(procs)
            for n, (rc, seconds) in done.items():
                record(n, rc, seconds, left, procs[n][0].stdout.read() if procs[n][0].stdout else "")
            procs = {}
            left = max(30.0, args.total - (time.monotonic() - began))
        cmd = _tests_cmd(args) if name == "tests" else _part_cmd(args, name)
        proc = _start(cmd, env, log=log_file if name == "tests" else None)
        procs[name] = (proc, time.monotonic(), time.monotonic() + left)
    finished = _wait(procs)
    if log_file is not None:
        log_file.close()
    for name, (rc, seconds) in finished.items():
        proc = procs[name][0]
        if name == "tests":
            text = test_log.read_text(errors="replace")
            write_json(work / "tests.json", parse_tests(text))
            record(name, 0 if rc in (0, 1) else rc, seconds, left, "" if rc in (0, 1, None) else text)
            if rc == 1:
                report["parts"][name]["status"] = "ok (some tests failed)"
        else:
            record(name, rc, seconds, left, proc.stdout.read() if proc.stdout else "")
    npz = work / f"{DMAVFL_ROW}.npz"
    if npz.is_file():
        shutil.copy(npz, out / "dmavfl.npz")
    report["seconds"] = time.monotonic() - began
    write_json(out / "gpu_check.json", report)
    text = summary_text(report)
    (out / "gpu_check.txt").write_text(text)
    sys.stdout.write(text)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out", help="results folder ($OUT)")
    parser.add_argument(
        "--data-root",
        default=os.environ.get("VFLBENCH_DATA") or ".data",
        help="datasets root holding mnist/ (default $VFLBENCH_DATA or .data)",
    )
    parser.add_argument("--work", default=None, help="the parts' own files (default: a temporary folder)")
    parser.add_argument("--smoke", action="store_true", help="tiny settings; runs every part on the CPU if no CUDA")
    parser.add_argument("--total", type=float, default=285.0, help="seconds for the whole check")
    parser.add_argument("--workers", type=int, default=10, help="pytest-xdist workers for the test suite")
    parser.add_argument("--serial", action="store_true", help="run dmavfl and the tests one after the other")
    parser.add_argument(
        "--parts",
        nargs="*",
        default=list(DEFAULT_PARTS),
        choices=PARTS,
        help=f"which parts to run (default: {' '.join(DEFAULT_PARTS)})",
    )
    parser.add_argument("--part", choices=sorted(PART_FUNCTIONS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.work = args.work or tempfile.mkdtemp(prefix="gpu_check_")
    if args.part:
        sys.path.insert(0, str(ROOT / "src"))
        import torch

        torch.set_num_threads(1)
        result = PART_FUNCTIONS[args.part](args)
        write_json(Path(args.work) / f"{args.part}.json", result)
        return
    sys.exit(orchestrate(args))


if __name__ == "__main__":
    main()
