"""End-to-end training: accuracy floors, determinism, baselines, real MNIST."""

from __future__ import annotations

import json

import pytest
from conftest import minimal

from vflbench.experiment.config import build_config
from vflbench.experiment.run import run_experiment


def test_digits_vhnn_reaches_085_and_is_deterministic(tmp_path):
    cfg = build_config(minimal())
    a = run_experiment(cfg, out_dir=tmp_path / "a")
    run_experiment(cfg, out_dir=tmp_path / "b")
    assert a.utility.value >= 0.85
    ra = json.loads((tmp_path / "a" / cfg.hash() / "result.json").read_text())
    rb = json.loads((tmp_path / "b" / cfg.hash() / "result.json").read_text())
    for r in (ra, rb):
        r.pop("timing")
    assert ra == rb


def test_different_seeds_give_different_runs():
    a = run_experiment(build_config(minimal(train={"epochs": 1})))
    b = run_experiment(build_config(minimal(train={"epochs": 1}, seed=1)))
    assert a.utility.per_epoch != b.utility.per_epoch


def test_vlr_on_breast_cancer():
    cfg = build_config(
        minimal(
            data={"name": "breast_cancer"}, model={"bottom": "logreg", "top": "identity"}, train={"algorithm": "vlr"}
        )
    )
    assert run_experiment(cfg).utility.value >= 0.8


def test_vsnn_on_digits_and_alone_is_reported_as_impossible():
    cfg = build_config(minimal(train={"algorithm": "vsnn"}, baselines=["alone"]))
    result = run_experiment(cfg)
    assert result.utility.value >= 0.8
    assert "no features" in result.baselines["alone"]["skipped"]


def test_alone_baseline_is_worse_than_vfl_on_digits():
    result = run_experiment(build_config(minimal(baselines=["vanilla", "alone"])))
    assert result.baselines["vanilla"]["value"] == result.utility.value
    assert result.baselines["alone"]["value"] < result.utility.value


def test_run_directory_follows_the_results_contract(tmp_path):
    cfg = build_config(minimal(train={"epochs": 2}))
    run_experiment(cfg, out_dir=tmp_path)
    run_dir = tmp_path / cfg.hash()
    result = json.loads((run_dir / "result.json").read_text())
    assert {"utility", "defense", "attacks", "timing", "comm"} <= set(result)
    assert {"metric", "value", "per_epoch"} <= set(result["utility"])
    assert {"train_seconds", "epoch_seconds", "attack_seconds"} <= set(result["timing"])
    assert {"messages", "bytes_up", "bytes_down"} <= set(result["comm"])
    env = json.loads((run_dir / "env.json").read_text())
    assert env["threads"] == 1 and "torch" in env
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run_dir / "config.yaml").is_file()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "active.bottom.final.pt",
        "active.top.final.pt",
        "passive_1.bottom.final.pt",
    ]


@pytest.mark.slow
def test_mnist_lenet5_one_epoch(real_data_root):
    cfg = build_config(
        minimal(
            data={"name": "mnist"},
            model={"bottom": "lenet5", "top": "mlp2"},
            train={"epochs": 1, "batch_size": 128, "threads": 1},
        )
    )
    result = run_experiment(cfg, data_root=real_data_root)
    assert result.utility.value >= 0.9
    assert result.data["slice_shapes"] == [[1, 28, 14], [1, 28, 14]]
