"""Sweeps: expansion, caching by config hash, resume after a kill, tables, report, tune."""

from __future__ import annotations

import json
import os
import sys

import pandas as pd
import pytest
import yaml
from conftest import minimal

from vflbench.errors import ConfigError
from vflbench.experiment import sweep as sweep_mod
from vflbench.experiment.config import build_config
from vflbench.experiment.sweep import RUNS, expand, run_sweep
from vflbench.experiment.tune import tune
from vflbench.report import build_report


def _sweep_config(**sweep):
    raw = minimal(
        data={"name": "breast_cancer"},
        train={"epochs": 2, "batch_size": 32},
        defenses=[{"name": "isotropic_noise", "strength": 1.0}],
        attacks=[{"name": "norm_scoring", "epochs": [0]}, {"name": "direction_scoring", "epochs": [0]}],
        sweep={"grid": {"defenses.0.strength": [0.5, 5.0]}, "seeds": [0, 1], **sweep},
    )
    return build_config(raw)


def test_expand_adds_a_no_defense_baseline_per_seed_and_dedupes():
    points = expand(_sweep_config())
    assert len(points) == 2 + 2 * 2
    assert len({p.hash for p in points}) == len(points)
    baselines = [p for p in points if not p.config.defenses]
    assert sorted(p.config.seed for p in baselines) == [0, 1]


def test_strength_grid_skips_parameter_free_defenses():
    cfg = _sweep_config(defenses=[[{"name": "isotropic_noise"}], [{"name": "max_norm"}]], seeds=[0])
    names = sorted((p.config.defenses[0].name if p.config.defenses else "none") for p in expand(cfg))
    assert names == ["isotropic_noise", "isotropic_noise", "max_norm", "none"]


@pytest.mark.slow
def test_sweep_tables_report_and_resume(tmp_path, monkeypatch):
    cfg = _sweep_config()
    table = run_sweep(cfg, tmp_path)
    summary = pd.read_csv(tmp_path / "summary.csv")
    for col in (
        "defense",
        "strength",
        "seed",
        "attack",
        "utility",
        "attack_value",
        "prior",
        "leakage",
        "utility_loss",
        "pu_score",
    ):
        assert col in summary.columns
    assert len(summary) == 6 * 2 and len(table) == 12
    assert set(summary["attack"]) == {"norm_scoring", "direction_scoring"}
    vanilla = summary[summary["defense"] == "none"]
    assert (vanilla["utility_loss"] == 0).all()
    strong = summary[(summary["strength"] == 5.0) & (summary["attack"] == "direction_scoring")]
    assert strong["leakage"].mean() < vanilla[vanilla["attack"] == "direction_scoring"]["leakage"].mean()
    scores = pd.read_csv(tmp_path / "scores.csv")
    assert {"defense", "best_strength", "s_pu", "utility_loss", "eps_p.norm_scoring", "c_dcs"} <= set(scores.columns)

    report = build_report(tmp_path)
    assert report.is_file() and (tmp_path / "report.html").is_file()
    assert (tmp_path / "plots" / "tradeoff_norm_scoring.png").stat().st_size > 10_000

    calls = []
    monkeypatch.setattr(sweep_mod, "_run_point", lambda *a: calls.append(a))
    run_sweep(cfg, tmp_path, resume=True, runner=sweep_mod._run_point)
    assert calls == []


def test_killed_sweep_resumes_without_losing_finished_runs(tmp_path):
    cfg = _sweep_config(seeds=[0])
    done = []

    class Killed(Exception):
        pass

    def stop_after_two(point):
        done.append(point.hash)
        if len(done) == 2:
            raise Killed

    with pytest.raises(Killed):
        run_sweep(cfg, tmp_path, on_done=stop_after_two)
    finished = {p.name for p in (tmp_path / "runs").iterdir() if (p / "result.json").is_file()}
    assert finished == set(done)
    before = {h: (tmp_path / "runs" / h / "result.json").read_text() for h in finished}
    trained = []
    run_sweep(cfg, tmp_path, resume=True, on_done=lambda p: trained.append(p.hash))
    assert len(trained) == 1 and not set(trained) & finished
    for h, text in before.items():
        assert (tmp_path / "runs" / h / "result.json").read_text() == text
    assert len(pd.read_csv(tmp_path / "summary.csv")["config_hash"].unique()) == 3


@pytest.mark.slow
def test_sweep_cli_with_two_workers(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "sweep.yaml"
    raw = _sweep_config(seeds=[0], grid={"defenses.0.strength": [5.0]}).model_dump(mode="json")
    path.write_text(yaml.safe_dump(raw))
    proc = subprocess.run(
        [sys.executable, "-m", "vflbench.cli", "sweep", str(path), "--out", str(tmp_path / "s"), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "s" / "summary.csv").is_file()
    proc = subprocess.run(
        [sys.executable, "-m", "vflbench.cli", "report", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr


def test_tune_finds_a_strength_that_meets_the_budget(tmp_path):
    raw = minimal(
        data={"name": "breast_cancer"},
        train={"epochs": 2, "batch_size": 32},
        defenses=[{"name": "isotropic_noise"}],
        attacks=[{"name": "direction_scoring", "epochs": [0]}],
        sweep={"seeds": [0, 1, 2]},
    )
    result = tune(build_config(raw), tmp_path, budget=30.0, low=0.1, high=50.0, steps=4)
    assert result.chosen is not None and result.chosen["worst_ci_high"] <= 30.0
    assert any(not t["meets"] for t in result.trace)  # the weak end leaks more than the budget
    assert json.loads((tmp_path / "tune.json").read_text())["chosen"]["strength"] == result.chosen["strength"]
    build_report(tmp_path)
    assert (tmp_path / "plots" / "tune.png").is_file()


def test_tune_averages_over_the_sweep_seeds_and_plots_by_strength(tmp_path):
    raw = minimal(
        data={"name": "breast_cancer"},
        train={"epochs": 2, "batch_size": 32},
        defenses=[{"name": "isotropic_noise"}],
        attacks=[{"name": "direction_scoring", "epochs": [0]}],
        sweep={"seeds": [0, 1]},
    )
    result = tune(build_config(raw), tmp_path, budget=20.0, low=0.1, high=50.0, steps=3)
    assert result.seeds == [0, 1]
    runs = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/result.json")]
    assert sorted({r["seed"] for r in runs}) == [0, 1] and len(runs) == 2 * (1 + len(result.trace))
    trial = result.trace[0]
    per_seed = [r for r in runs if r["defense"] and r["defense"][0]["params"].get("strength") == trial["strength"]]
    assert trial["utility"] == pytest.approx(sum(r["utility"]["value"] for r in per_seed) / 2)
    build_report(tmp_path)
    assert (tmp_path / "plots" / "tune.png").is_file()
    assert "seeds [0, 1]" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_ray_executor_runs_and_resumes_a_sweep_on_a_local_instance(tmp_path):
    ray = pytest.importorskip("ray", reason="the Ray executor needs the `cluster` extra (installed by make test)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        cfg = _sweep_config(seeds=[0], grid={"defenses.0.strength": [0.5, 5.0]}, executor="ray")
        done: list[str] = []
        table = run_sweep(cfg, tmp_path, on_done=lambda p: done.append(p.hash))
        assert table["config_hash"].nunique() == 3 and len(done) == 3 and (tmp_path / "summary.csv").is_file()
        lost = tmp_path / RUNS / done[-1] / "result.json"
        kept = tmp_path / RUNS / done[0] / "result.json"
        before = kept.stat().st_mtime_ns
        lost.unlink()
        again: list[str] = []
        table = run_sweep(cfg, tmp_path, resume=True, on_done=lambda p: again.append(p.hash))
        assert again == [done[-1]] and lost.is_file() and kept.stat().st_mtime_ns == before
        assert table["config_hash"].nunique() == 3
    finally:
        ray.shutdown()


def test_ray_executor_without_ray_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("no ray")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    from vflbench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"vflbench\[cluster\]"):
        run_sweep(_sweep_config(seeds=[0], executor="ray"), tmp_path)


@pytest.mark.slow
def test_budget_sweep_reports_the_mask_ratio_and_plots_it(tmp_path):
    """VMask Fig. 8 in a report: a smaller budget masks more layers (budget 0 masks every layer
    after the first epoch, budget 1 nothing after the first epoch's initial mask of layer 1)."""
    raw = minimal(
        data={"name": "digits", "parties": 2, "aux_pool": 300},
        model={"bottom": "mlp3", "top": "mlp2"},
        train={"epochs": 3, "momentum": 0.0},
        defenses=[{"name": "vmask", "mc_epochs": 5}],
        attacks=[{"name": "model_completion", "epochs": 2}],
    )
    raw["sweep"] = {"grid": {"defenses.0.strength": [0.0, 1.0]}}
    run_sweep(build_config(raw), tmp_path)
    summary = pd.read_csv(tmp_path / "summary.csv")
    ratio = summary.dropna(subset=["strength"]).groupby("strength")["mask_ratio"].first()
    assert ratio[0.0] == pytest.approx((1 / 3 + 1 + 1) / 3) and ratio[1.0] == pytest.approx(1 / 9)
    assert summary[summary["defense"] == "none"]["mask_ratio"].isna().all()
    report = build_report(tmp_path).read_text()
    assert "budget_vmask.png" in report and (tmp_path / "plots" / "budget_vmask.png").stat().st_size > 10_000


def test_invalid_grid_fails_before_any_run(tmp_path):
    raw = minimal(defenses=[{"name": "isotropic_noise", "alpha": 1.0}], attacks=[{"name": "norm_scoring"}])
    raw["sweep"] = {"grid": {"defenses.0.strength": [1.0, 5.0]}}
    with pytest.raises(ConfigError, match="give 'strength' or 'alpha', not both"):
        run_sweep(build_config(raw), tmp_path)
    assert not (tmp_path / "runs").exists()


def test_tradeoff_labels_strengths_that_land_on_one_point_together():
    from vflbench.report.plots import _point_labels

    group = pd.DataFrame(
        {"strength": [0.05, 0.1, 0.5, None], "eps_u": [-0.15, -0.15, -0.06, 0.0], "eps_p": [-2.36, -2.36, -4.9, 20.0]}
    )
    assert _point_labels(group) == {(-0.15, -2.36): "0.05, 0.1", (-0.06, -4.9): "0.5"}


def _runner_recording_pid(config, runs_dir, data_root):
    """The default runner, leaving a file named after the process that ran the point."""
    import os
    from pathlib import Path

    done = sweep_mod._run_point(config, runs_dir, data_root)
    (Path(runs_dir) / f"{done}.{os.getpid()}.pid").touch()
    return done


def test_n_workers_run_the_points_longest_first_while_this_process_hands_them_out(tmp_path):
    """Before issue 26 this process ran points too (so it reported the workers' points only between its own); now
    the n workers run every point and this process hands them out and reports each as it finishes."""
    import os

    cfg = _sweep_config(seeds=[0], grid={"train.epochs": [1, 3, 2]}, defenses=[[{"name": "max_norm"}]])
    order = [p.config.train.epochs for p in sweep_mod._longest_first(expand(cfg))]
    assert order == sorted(order, reverse=True)
    run_sweep(cfg, tmp_path, workers=2, runner=_runner_recording_pid)
    pids = {int(p.name.split(".")[1]) for p in (tmp_path / RUNS).glob("*.pid")}
    assert len(list((tmp_path / RUNS).glob("*.pid"))) == len(expand(cfg))
    assert os.getpid() not in pids and len(pids) == 2


def _sleeping_runner(config, runs_dir, data_root):
    """Sleeps a tenth of a second per training epoch and writes nothing: the executor's behaviour alone."""
    import time

    time.sleep(0.1 * config["train"]["epochs"])
    return build_config(config).hash()


def test_each_point_is_reported_as_soon_as_it_finishes(tmp_path):
    """Before issue 26 the sweep's own process reported the workers' points only after its own point: a long point
    there held back the report of every short one finished meanwhile (the issue's 'points finish one at a time')."""
    import time

    cfg = _sweep_config(seeds=[0], grid={"train.epochs": [30, 1, 2]}, defenses=[[{"name": "max_norm"}]], baseline=False)
    reported = {}
    started = time.monotonic()
    run_sweep(
        cfg,
        tmp_path,
        workers=2,
        runner=_sleeping_runner,
        on_done=lambda p: reported.setdefault(p.config.train.epochs, time.monotonic() - started),
    )
    assert set(reported) == {30, 1, 2}
    assert reported[1] < reported[30] - 1.0 and reported[2] < reported[30] - 1.0


def _failing_runner(config, runs_dir, data_root):
    if config["train"]["epochs"] == 2:
        raise ValueError("point failed")
    return _sleeping_runner(config, runs_dir, data_root)


def test_a_failed_point_in_a_worker_stops_the_sweep_with_its_error(tmp_path):
    cfg = _sweep_config(
        seeds=[0], grid={"train.epochs": [1, 2, 100]}, defenses=[[{"name": "max_norm"}]], baseline=False
    )
    with pytest.raises(ValueError, match="point failed"):
        run_sweep(cfg, tmp_path, workers=2, runner=_failing_runner)


def test_results_are_the_same_with_one_worker_and_with_three(tmp_path):
    """Where a point runs (this process, a forked worker; before or after its undefended reference) does not
    change its result."""
    cfg = _sweep_config(seeds=[0, 1], grid={"defenses.0.strength": [5.0]})
    results = {}
    for workers in (1, 3):
        out = tmp_path / str(workers)
        run_sweep(cfg, out, workers=workers)
        results[workers] = {
            p.parent.name: {k: v for k, v in json.loads(p.read_text()).items() if k != "timing"}
            for p in (out / RUNS).glob("*/result.json")
        }
    assert len(results[1]) == 4 and results[1] == results[3]


def test_an_undefended_point_is_not_trained_while_another_worker_trains_it_as_a_reference(tmp_path):
    """Old behaviour: a worker training a defended point claimed its undefended reference run, while the other
    worker trained the same run as the sweep's undefended point without claiming it: trained twice. Now the
    undefended point claims it too: it waits for the holder's result and does not train it again; and the
    undefended points are handed out first."""
    import threading
    import time

    from vflbench.experiment.run import claim_undefended

    cfg = build_config(minimal(data={"name": "breast_cancer"}, train={"epochs": 1}, attacks=[{"name": "norm_scoring"}]))
    runs = tmp_path / RUNS
    result = runs / cfg.hash() / "result.json"
    with claim_undefended(cfg, runs) as mine:  # another worker, training it as a defended point's reference
        assert mine
        point = threading.Thread(target=sweep_mod._run_point, args=(cfg.model_dump(mode="json"), str(runs), None))
        point.start()
        time.sleep(1.0)
        assert point.is_alive() and not result.exists()  # waiting, not training
        result.parent.mkdir(parents=True)
        result.write_text("{}")  # the holder's result
    point.join(30)
    assert not point.is_alive() and result.read_text() == "{}"  # not trained again
    points = expand(_sweep_config())
    order = sweep_mod._longest_first(list(reversed(points)))
    assert [bool(p.config.defenses) for p in order] == sorted(bool(p.config.defenses) for p in points)


def test_a_defended_point_trains_while_another_worker_trains_its_undefended_reference(tmp_path):
    """Before issue 26 a defended point with attacks waited for its undefended reference before it trained: with
    the references of every seed in training, the other workers sat idle. It needs that run's result only to
    score its attacks, so it now trains first and waits (if at all) at the end."""
    import threading
    import time

    from vflbench.experiment.run import claim_undefended, run_experiment, undefended_config

    cfg = build_config(
        minimal(
            data={"name": "breast_cancer"},
            train={"epochs": 2, "batch_size": 32},
            defenses=[{"name": "max_norm"}],
            attacks=[{"name": "norm_scoring"}],
        )
    )
    runs = tmp_path / RUNS
    plain = undefended_config(cfg)
    with claim_undefended(plain, runs) as mine:  # another worker is training the reference
        assert mine
        point = threading.Thread(target=run_experiment, args=(cfg,), kwargs={"out_dir": runs})
        point.start()
        metrics = runs / cfg.hash() / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) == 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(metrics.read_text().splitlines()) == 2  # trained both epochs while the reference is claimed
        time.sleep(0.5)
        assert point.is_alive() and not (runs / cfg.hash() / "result.json").exists()  # waiting for the reference
        reference = run_experiment(plain, out_dir=runs)  # what the other worker writes
    point.join(120)
    assert not point.is_alive()
    result = json.loads((runs / cfg.hash() / "result.json").read_text())
    assert result["attacks"][0]["undefended_leakage"] == reference.attacks[0].leakage


def test_a_shared_undefended_run_is_claimed_once_and_a_dead_holder_is_taken_over(tmp_path):
    """Two sweep workers whose points share an undefended run train it once: the second waits for the first's
    result instead of training it again; a lock left by a killed process does not block anyone."""
    import subprocess
    import threading

    from vflbench.experiment.run import _claim

    lock, result = tmp_path / ".h.undefended", tmp_path / "h" / "result.json"
    with _claim(lock, result) as first:
        assert first and lock.read_text() == str(os.getpid())

        def finish() -> None:
            result.parent.mkdir()
            result.write_text("{}")

        timer = threading.Timer(0.5, finish)
        timer.start()
        with _claim(lock, result) as second:  # waits while the first holder works, then reuses its result
            assert not second and result.is_file()
    assert not lock.exists()
    result.unlink()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock.write_text(str(dead.pid))  # a holder that is gone
    with _claim(lock, result) as taken:
        assert taken
