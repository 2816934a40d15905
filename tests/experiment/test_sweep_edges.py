"""Sweep edges of issue 27: two sweeps into one directory, a resume with a changed definition, and
Ctrl-C while the workers are still starting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import minimal

from vflbench.errors import ConfigError, VFLBenchError
from vflbench.experiment import sweep as sweep_mod
from vflbench.experiment import workers as workers_mod
from vflbench.experiment.config import build_config
from vflbench.experiment.sweep import SWEEP_LOCK, run_sweep


def _cfg(**sweep):
    return build_config(minimal(data={"name": "breast_cancer"}, train={"epochs": 1}, sweep={"seeds": [0, 1], **sweep}))


class _Recorder:
    """A sweep runner that trains nothing and records the points it was handed."""

    def __init__(self) -> None:
        self.points: list[str] = []

    def __call__(self, config, runs_dir, data_root):
        self.points.append(config["seed"])
        return ""


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="the holder uses flock")
def test_a_second_sweep_into_the_same_directory_is_refused(tmp_path):
    """Before: both sweeps trained every point."""
    tmp_path.mkdir(exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / SWEEP_LOCK)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        runner = _Recorder()
        with pytest.raises(VFLBenchError) as info:
            run_sweep(_cfg(), tmp_path, runner=runner)
        assert str(info.value) == (
            f"another sweep (pid {holder.pid}) is writing into {tmp_path}; wait for it to end, "
            "or give this one another --out"
        )
        assert runner.points == [] and not (tmp_path / "sweep.yaml").exists()
    finally:
        holder.stdin.close()
        holder.wait(10)
    # the holder is gone (the kernel released its lock, its file stays behind): the next sweep takes over
    runner = _Recorder()
    run_sweep(_cfg(), tmp_path, runner=runner)
    assert sorted(runner.points) == [0, 1] and not (tmp_path / SWEEP_LOCK).exists()


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, caplog):
    (tmp_path / SWEEP_LOCK).write_text(f"{_dead_pid()}\n")
    runner = _Recorder()
    with caplog.at_level("INFO"):
        run_sweep(_cfg(), tmp_path, runner=runner)
    assert sorted(runner.points) == [0, 1]
    assert "which no longer runs" in caplog.text
    assert not (tmp_path / SWEEP_LOCK).exists()


def test_the_lock_names_this_process_while_the_sweep_runs(tmp_path):
    seen = []

    def runner(config, runs_dir, data_root):
        seen.append((tmp_path / SWEEP_LOCK).read_text().strip())
        return ""

    run_sweep(_cfg(seeds=[0]), tmp_path, runner=runner)
    assert seen == [str(os.getpid())]


def test_resume_refuses_a_changed_definition_and_says_what_changed(tmp_path):
    """Before: a new sweep ran beside the old one and overwrote its summary."""
    run_sweep(_cfg(), tmp_path, runner=_Recorder())
    stored = (tmp_path / "sweep.yaml").read_text()
    changed = build_config({**_cfg().model_dump(mode="json"), "train": {"epochs": 3}, "sweep": {"seeds": [0, 1, 2]}})
    runner = _Recorder()
    with pytest.raises(ConfigError) as info:
        run_sweep(changed, tmp_path, resume=True, runner=runner)
    message = str(info.value)
    assert f"--resume: the sweep in {tmp_path} was started with another definition (" in message
    assert "sweep.seeds: [0, 1] -> [0, 1, 2]" in message and "train.epochs: 1 -> 3" in message
    assert "give a new --out, or add --force" in message
    assert runner.points == [] and (tmp_path / "sweep.yaml").read_text() == stored
    # how the points run is not what they are: more workers resume the same sweep
    run_sweep(_cfg(workers=2), tmp_path, resume=True, workers=1, runner=_Recorder())
    # --force continues with the new definition, which the directory then records
    runner = _Recorder()
    run_sweep(changed, tmp_path, resume=True, force=True, runner=runner)
    assert sorted(runner.points) == [0, 1, 2]
    assert yaml.safe_load((tmp_path / "sweep.yaml").read_text())["sweep"]["seeds"] == [0, 1, 2]


def test_cli_force_needs_resume(tmp_path, cli):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(_cfg().model_dump(mode="json")))
    proc = cli("sweep", str(path), "--out", str(tmp_path / "s"), "--force")
    assert proc.returncode == 2 and "--force applies to --resume only" in proc.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_processes_started_for_the_workers_ignore_sigint_from_birth():
    """Before: a Ctrl-C while the fork server imported torch printed its 40-line KeyboardInterrupt traceback."""
    before = signal.getsignal(signal.SIGINT)
    with workers_mod.sigint_ignored_by_children():
        child = subprocess.run(
            [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert child.stdout.strip() == "True"
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc")
def test_the_fork_server_ignores_sigint_while_it_imports():
    import multiprocessing.forkserver

    sweep_mod._worker_context()
    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        pytest.skip("this Python keeps the fork server's pid elsewhere")
    ignored = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigIgn"))
    assert int(ignored.split()[1], 16) >> (signal.SIGINT - 1) & 1
