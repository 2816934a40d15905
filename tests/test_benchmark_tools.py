"""The measuring scripts that run on other machines (``benchmarks/gpu_check.py`` on a lent GPU machine) or rarely
(``benchmarks/sweep_overhead.py``) still run: a schema change once broke the sleeping-run benchmark unnoticed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402


def test_the_sleeping_run_benchmark_runs_a_sweep_and_reports_its_workers(tmp_path: Path):
    out = tmp_path / "overhead.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "sweep_overhead.py"), "--workers", "2", "--seeds", "1"]
    proc = subprocess.run(
        [*cmd, "--sleep", "0.05", "--json", str(out)], capture_output=True, text=True, env=env, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = json.loads(out.read_text())["results"]
    assert result["runs"] == 7 and result["workers"] == 2
    assert result["pids"] == 2  # both workers ran points
    assert len(result["starts"]) == len(result["ends"]) == 7
    assert all(end >= start + 0.05 for start, end in zip(result["starts"], result["ends"], strict=True))


def test_the_sweep_timeline_reads_each_runs_first_and_last_file(tmp_path: Path):
    began = 1_000_000.0
    runs = tmp_path / "runs"
    for name, (start, end) in {"a": (2.0, 5.0), "b": (2.5, 4.0), "c": (5.5, 7.0)}.items():
        run = runs / name
        run.mkdir(parents=True)
        for file, when in (("config.yaml", start), ("metrics.jsonl", end - 0.1), ("result.json", end)):
            (run / file).write_text("{}")
            os.utime(run / file, (began + when, began + when))
    unfinished = runs / "d"  # a run without result.json is not counted
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text("{}")
    os.utime(unfinished / "config.yaml", (began + 1.0, began + 1.0))
    timeline = gpu_check._sweep_timeline(runs, began, workers=2)
    assert timeline["first_start_s"] == 2.0
    assert timeline["all_busy_s"] == 2.5  # the second start: both workers busy
    assert timeline["last_end_s"] == 7.0
    assert abs(timeline["sum_run_wall_s"] - (3.0 + 1.5 + 1.5)) < 1e-9
    assert gpu_check._sweep_timeline(runs, began, workers=8)["all_busy_s"] == 5.5  # fewer runs than workers


def test_the_test_log_parser_counts_outcomes_with_and_without_xdist():
    log = "\n".join(
        [
            "[gw0] [ 10%] PASSED tests/a.py::test_one",
            "[gw1] [ 20%] FAILED tests/b.py::test_two",
            "tests/c.py::test_three SKIPPED (needs CUDA)",
            "tests/c.py::test_four PASSED",
            "=================================== FAILURES ===================================",
            "__________________________________ test_two __________________________________",
            "tests/b.py:3: in test_two",
            "    assert 1 == 2",
            "E   assert 1 == 2",
            "=========================== short test summary info ============================",
            "============= 1 failed, 2 passed, 1 skipped in 3.21s =============",
        ]
    )
    parsed = gpu_check.parse_tests(log)
    assert parsed["counts"] == {"passed": 2, "failed": 1, "skipped": 1}
    assert parsed["failed"] == ["tests/b.py::test_two"]
    assert "E   assert 1 == 2" in parsed["tracebacks"]["test_two"]
    assert parsed["summary"] == "1 failed, 2 passed, 1 skipped"
