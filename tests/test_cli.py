"""The command line: the happy path and clear one-paragraph errors on bad input."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import minimal


def vflbench(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the console script in a fresh process (what a user runs)."""
    return subprocess.run(
        [sys.executable, "-m", "vflbench.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
def test_run_prints_a_table_and_writes_the_run_directory(tmp_path):
    cfg = write(tmp_path, minimal(train={"epochs": 2}, baselines=["alone"]))
    proc = vflbench("run", str(cfg), "--out", str(tmp_path / "runs"), "--set", "seed=3")
    assert proc.returncode == 0, proc.stderr
    assert "VFL (vanilla)" in proc.stdout and "alone" in proc.stdout
    [run_dir] = (tmp_path / "runs").iterdir()
    result = json.loads((run_dir / "result.json").read_text())
    assert result["seed"] == 3 and set(result["baselines"]) == {"alone"}
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == 3
    assert "epoch 2/2" in proc.stderr  # plain progress lines when not a terminal


@pytest.mark.parametrize(
    ("raw", "overrides", "expected"),
    [
        (minimal(data={"name": "digitz"}), [], "unknown dataset 'digitz'; valid dataset names are: "),
        (minimal(model={"bottom": "mlp9"}), [], "unknown model 'mlp9'; valid model names are: "),
        (minimal(attacks=[{"name": "nope"}]), [], "unknown attack 'nope'; valid attack names are: "),
        (minimal(defenses=[{"name": "nope"}]), [], "unknown defense 'nope'; valid defense names are: "),
        (minimal(data={"parties": 9}), [], "cannot split 8 pixel columns among 9 feature-holding parties"),
        (
            minimal(data={"name": "synthetic", "parties": 6, "options": {"n_features": 5, "n_informative": 3}}),
            [],
            "cannot split 5 features among 6 feature-holding parties",
        ),
        (
            minimal(train={"algorithm": "vlr", "aggregation": "concat"}, model={"bottom": "logreg", "top": "identity"}),
            [],
            "aggregation 'concat' is not allowed with vlr; vlr allows: sum",
        ),
        (minimal(model={"bottom": "lenet5"}), [], "model 'lenet5' does not fit a party's input of shape (1, 8, 4)"),
        (minimal(train={"epochz": 1}), [], "unknown key 'train.epochz'; valid keys here are: algorithm"),
        (minimal(), ["train.epochs=0"], "train.epochs: Input should be greater than or equal to 1"),
        (
            minimal(data={"name": "mnist", "root": "/nonexistent"}),
            [],
            "missing train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz",
        ),
        (minimal(attacks=[{"name": "norm_scoring"}]), [], "needs binary labels, but the task has 10 classes"),
        (
            minimal(attacks=[{"name": "model_completion", "epoch": 3}]),
            [],
            "attack 'model_completion' has no parameter 'epoch'; valid parameters are: party, known_per_class, epochs",
        ),
    ],
)
def test_bad_input_gives_one_paragraph_and_exit_code_2(tmp_path, cli, raw, overrides, expected):
    cfg = write(tmp_path, raw)
    args = ["run", str(cfg), "--out", str(tmp_path / "runs")]
    for o in overrides:
        args += ["--set", o]
    proc = cli(*args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert expected in " ".join(proc.stderr.split()), proc.stderr
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("result.json"))


def test_missing_config_file(tmp_path, cli):
    proc = cli("run", str(tmp_path / "none.yaml"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr


@pytest.mark.slow
def test_list_and_describe(cli):
    proc = cli("list", "datasets")
    assert proc.returncode == 0 and "breast_cancer" in proc.stdout and "mnist" in proc.stdout
    proc = cli("describe", "model_completion")
    assert proc.returncode == 0
    for word in ("paper", "threat", "reads", "known_per_class", "50"):
        assert word in proc.stdout
    proc = cli("describe", "nope")
    assert proc.returncode == 2 and "valid names are" in proc.stderr
    proc = cli("list", "gadgets")
    assert proc.returncode == 2
    assert "valid kinds are: datasets, models, attacks, defenses" in " ".join(proc.stderr.split())

    proc = vflbench("run", str(Path("/nonexistent.yaml")))
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


# --- interruption: a real `vflbench sweep` process stopped by a signal -------------------------------------------


def _slow_sweep(tmp_path: Path, points: int) -> Path:
    """A sweep of ``points`` runs of about half a second each (unloaded) on the embedded digits."""
    raw = minimal(
        train={"epochs": 2, "batch_size": 16},
        sweep={"grid": {"train.lr": [0.01 * (i + 1) for i in range(points)]}, "baseline": False},
    )
    return write(tmp_path, raw)


class Sweeps:
    """`vflbench sweep` processes started by a test, and the workers it watches."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []
        self.workers: set[int] = set()

    def start(self, cfg: Path, out: Path, *extra: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vflbench.cli", "sweep", str(cfg), "--out", str(out), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(proc)
        return proc

    def watch(self, pids: set[int]) -> set[int]:
        self.workers |= pids
        return pids


@pytest.fixture
def sweeps():
    """Whatever a failed test leaves running is killed at teardown."""
    tracked = Sweeps()
    yield tracked
    for proc in tracked.started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    for pid in tracked.workers:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _finished(out: Path) -> set[str]:
    return {p.parent.name for p in (out / "runs").glob("*/result.json")}


def _wait_for_first_point(proc: subprocess.Popen, out: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not _finished(out):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no sweep point finished in time"
        time.sleep(0.05)


def _all_gone(pids: set[int], *, within: float) -> bool:
    """Whether every process of ``pids`` has exited within ``within`` seconds."""
    deadline = time.monotonic() + within
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


def _alive_children(pid: int) -> set[int]:
    """Live (not zombie) processes whose parent is ``pid`` (Linux /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")


@pytest.mark.slow
def test_sigint_stops_the_sweep_writes_the_summary_and_resume_finishes(tmp_path, cli, sweeps):
    """Old behaviour: the sweep ran every remaining point, wrote no summary of the finished ones and exited 0."""
    cfg, out = _slow_sweep(tmp_path, points=4), tmp_path / "s"
    proc = sweeps.start(cfg, out)
    _wait_for_first_point(proc, out)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "--resume" in stderr
    done = _finished(out)
    assert 1 <= len(done) < 4
    assert set(pd.read_csv(out / "summary.csv")["config_hash"]) == done
    before = {h: (out / "runs" / h / "result.json").stat().st_mtime_ns for h in done}
    resumed = cli("sweep", str(cfg), "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert {h: (out / "runs" / h / "result.json").stat().st_mtime_ns for h in done} == before  # not re-run
    assert len(_finished(out)) == 4 and len(set(pd.read_csv(out / "summary.csv")["config_hash"])) == 4


@pytest.mark.slow
@linux_only
def test_sigterm_ends_the_workers_and_exits_143(tmp_path, sweeps):
    """Old behaviour: the pool went on with every queued point and the sweep exited 0."""
    cfg, out = _slow_sweep(tmp_path, points=8), tmp_path / "s"
    proc = sweeps.start(cfg, out, "--workers", "2")
    _wait_for_first_point(proc, out)
    workers = sweeps.watch(_alive_children(proc.pid))
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    assert len(_finished(out)) < 8 and (out / "summary.csv").is_file()
    assert _all_gone(workers, within=10.0)


@pytest.mark.slow
@linux_only
def test_workers_exit_when_the_sweep_is_killed(tmp_path, sweeps):
    """Old behaviour: after `kill -9` of the sweep its workers (~500 MB each) lived on forever."""
    cfg, out = _slow_sweep(tmp_path, points=8), tmp_path / "s"
    proc = sweeps.start(cfg, out, "--workers", "2")
    _wait_for_first_point(proc, out)
    workers = sweeps.watch(_alive_children(proc.pid))
    assert workers
    proc.kill()
    proc.communicate(timeout=30)
    assert _all_gone(workers, within=10.0)


def test_a_diverged_training_is_flagged(tmp_path, cli):
    """A NaN loss was reported as a normal result (AUC 0.5, accuracy of one class)."""
    cfg = write(tmp_path, minimal(data={"name": "breast_cancer"}, train={"epochs": 2, "lr": 1e6}))
    proc = cli("run", str(cfg), "--out", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    assert "(diverged)" in proc.stdout
    [result] = (tmp_path / "runs").glob("*/result.json")
    assert json.loads(result.read_text())["utility"]["diverged"] is True
    cfg = write(tmp_path, minimal(data={"name": "breast_cancer"}, train={"epochs": 1}))
    proc = cli("run", str(cfg), "--out", str(tmp_path / "ok"))
    assert "(diverged)" not in proc.stdout
    [result] = (tmp_path / "ok").glob("*/result.json")
    assert json.loads(result.read_text())["utility"]["diverged"] is False


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_output_files_follow_the_umask(tmp_path, umask, mode):
    """write_atomic wrote every result 0600 (tempfile.mkstemp's mode) whatever the umask."""
    from vflbench.experiment.results import write_atomic

    previous = os.umask(umask)
    try:
        write_atomic(tmp_path / "result.json", "{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "result.json").stat().st_mode) == mode


@pytest.mark.slow
def test_sigint_during_run_exits_130(tmp_path, sweeps):
    """Old behaviour: Ctrl-C on `vflbench run` exited 0."""
    cfg = write(tmp_path, minimal(train={"epochs": 200, "batch_size": 16}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "vflbench.cli", "run", str(cfg), "--out", str(tmp_path / "runs")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sweeps.started.append(proc)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "runs").glob("*/metrics.jsonl")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and not list((tmp_path / "runs").glob("*/result.json"))


@linux_only
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_the_parent_watchdog_alone_ends_an_orphaned_worker(tmp_path, method):
    """The portable path (no PR_SET_PDEATHSIG): a worker whose sweep is killed exits by itself, also while
    the killed sweep is a zombie (not reaped yet: its pid still answers) and, for a fork server's worker,
    while the fork server (the worker's parent) lives on."""
    child = tmp_path / "child.py"
    child.write_text(
        "import multiprocessing, threading, time\n"
        "from vflbench.experiment.sweep import _watch_parent\n"
        "def work(queue):\n"
        "    threading.Thread(target=_watch_parent, daemon=True).start()\n"
        "    queue.put(multiprocessing.current_process().pid)\n"
        "    time.sleep(60)\n"
        "if __name__ == '__main__':\n"
        f"    context = multiprocessing.get_context({method!r})\n"
        "    queue = context.Queue()\n"
        "    context.Process(target=work, args=(queue,)).start()\n"
        "    print(queue.get(), flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, str(child)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    worker = None
    try:
        worker = int(proc.stdout.readline())
        proc.kill()  # not reaped until the end: a zombie meanwhile
        assert _all_gone({worker}, within=10.0)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)
