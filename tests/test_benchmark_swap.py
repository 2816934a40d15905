"""The reproduction scripts take ``--dataset`` and ``--set`` (benchmarks/swap.py): another dataset without a
driver. Their runs here are cut to seconds with ``--set`` on the embedded data."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import reproduce  # noqa: E402
import reproduce_dmavfl  # noqa: E402
import reproduce_labobf  # noqa: E402
import swap  # noqa: E402

from vflbench.experiment.config import load_config  # noqa: E402

BREAST = ["data.name=breast_cancer", "data.options={}", "data.columns=null", "data.split=auto"]


def _args(*argv: str, setting: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    if setting:
        parser.add_argument("--setting", default=None)
    swap.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_dataset_and_set_become_overrides_and_a_tag():
    args = _args("--dataset", "breast_cancer", "--set", "train.epochs=1", "--set", "data.train_size=100")
    assert swap.overrides(args) == [*BREAST, "train.epochs=1", "data.train_size=100"]
    assert swap.overrides(_args()) == [] and swap.tag([]) == ""
    assert swap.tag(swap.overrides(args)).startswith("@") and swap.tag(["a"]) != swap.tag(["b"])
    # a script whose --dataset named one of its settings: it still does; another name is a swap
    named = _args("--dataset", "credit", setting=True)
    assert swap.setting_and_overrides(named, ["credit", "x"], "x") == ("credit", [])
    assert swap.setting_and_overrides(_args("--dataset", "wine", setting=True), ["credit"], "credit") == (
        "credit",
        ["data.name=wine", "data.options={}", "data.columns=null", "data.split=auto"],
    )


def test_reproduce_runs_its_configs_on_the_swapped_dataset(tmp_path, capsys):
    reproduce.main(
        ["kang_credit_vlr", "--dataset", "breast_cancer", "--set", "train.epochs=1", "--no-run", "--out", str(tmp_path)]
    )
    swapped = load_config(reproduce.config_path("kang_credit_vlr"), [*BREAST, "train.epochs=1"])
    assert swapped.data.name == "breast_cancer"
    missing = capsys.readouterr().err
    assert f"no {tmp_path / swapped.hash() / 'result.json'}" in missing and "[data.name=breast_cancer" in missing


def test_a_bad_swap_is_one_line_before_anything_runs(tmp_path):
    with pytest.raises(SystemExit) as info:
        reproduce.main(["kang_credit_vlr", "--dataset", "imagenet", "--out", str(tmp_path)])
    assert str(info.value).startswith(
        "error: kang_credit_vlr.yaml with data.name=imagenet"
    ) and "unknown dataset 'imagenet'" in str(info.value)
    assert not tmp_path.joinpath("x").exists() and list(tmp_path.iterdir()) == []


def test_reproduce_labobf_run_one_returns_the_trained_run(tmp_path, monkeypatch):
    from vflbench.attacks.label.mixmatch import MixMatchCompletion
    from vflbench.attacks.label.model_completion import ModelCompletion
    from vflbench.experiment.run import TrainedRun

    tiny = {"known_per_class": 5, "epochs": 1, "batch_size": 8, "prior": "local"}
    monkeypatch.setitem(reproduce_labobf.FLAVOURS, "mm", (MixMatchCompletion, {**tiny, "val_iteration": 2}))
    monkeypatch.setitem(reproduce_labobf.FLAVOURS, "mc", (ModelCompletion, tiny))
    small = (
        *BREAST,
        "train.epochs=1",
        "attacks.0.known_per_class=5",
        "attacks.0.epochs=1",
        "attacks.0.val_iteration=2",
        "attacks.0.batch_size=8",
    )
    done = reproduce_labobf.run_one("labobf_epsilon_like_raw", 0, tmp_path, None, small)
    assert isinstance(done.run, TrainedRun) and done.run.config.data.name == "breast_cancer"
    assert done.record["n_train"] == len(done.run.data.y_train) and "mm_attack_acc" in done.record
    cached = reproduce_labobf.run_one("labobf_epsilon_like_raw", 0, tmp_path, None, small)
    assert cached.run is None and cached.record == done.record  # from OUT/<stem>-s0.json
    assert done.record["selection"] == "last" and done.record["mm_selection"] == "last"
    # a record scored under another rule (earlier revisions: the best epoch on the test split) is recomputed
    path = tmp_path / "labobf_epsilon_like_raw-s0.json"
    path.write_text(json.dumps({**done.record, "selection": "test_oracle"}))
    again = reproduce_labobf.run_one("labobf_epsilon_like_raw", 0, tmp_path, None, small)
    assert again.run is not None and json.loads(path.read_text())["selection"] == "last"


def test_reproduce_labobf_refuses_a_score_selected_on_the_test_split():
    from vflbench.attacks.label.model_completion import ModelCompletion

    assert reproduce_labobf.make_attack(ModelCompletion, {}).select == "last"
    with pytest.raises(SystemExit, match="test_oracle picks its epoch on the test split"):
        reproduce_labobf.make_attack(ModelCompletion, {"select": "test_oracle"})


def test_reproduce_labobf_tables_show_t_intervals_over_seeds_and_paired_gaps():
    """Before: mean ± sd over seeds and no interval on LabObf − R_lower."""

    def record(seed: int, attack: float, prior: float) -> dict:
        return {
            "seed": seed,
            "mm_attack_acc": attack,
            "mm_prior_acc": prior,
            "mm_selection": "last",
            "selection": "last",
            "n_train": 10,
            "n_test": 5,
            "n_balanced_test": 5,
            "majority": 50.0,
        }

    raw = [record(0, 60.0, 55.0), record(1, 62.0, 56.0), record(2, 64.0, 60.0)]
    obf = [record(0, 57.0, 50.0), record(1, 57.0, 50.0), record(2, 60.0, 50.0)]
    text = reproduce_labobf.tables({"labobf_epsilon_like_raw": raw, "labobf_epsilon_like_labobf": obf})
    # R_upper: mean 62, sd 2, t(0.975, 2) = 4.3027: half-width 4.3027 * 2 / sqrt(3) = 4.97
    assert "| 62.00 [57.03, 66.97] | - | - |" in text
    # LabObf − R_lower paired by seed: differences 2, 1, 0 -> mean 1, sd 1, half-width 2.48
    assert "| LabObf - R_lower (MixMatch) | -10.92 | +1.00 [-1.48, +3.48] |" in text
    assert "`select: last`" in text and "95% Student-t interval" in text and "±" not in text


def test_reproduce_dmavfl_stores_leakage_in_points_and_counts_only_trained_rows(tmp_path):
    """Before: ``leakage`` was prior - MSE (MSE units) and ``n_train`` counted the held-out aux rows."""
    from vflbench.metrics.scores import leakage_points

    small = [*BREAST, "train.epochs=1", "attacks.0.pretrain_epochs=1"]
    record = reproduce_dmavfl.run_one(
        "credit_dmavfl", reproduce_dmavfl.EXPERIMENTS["credit_dmavfl"], None, tmp_path, 1, small
    )
    assert record["leakage"] == pytest.approx(leakage_points("mse", record["value"], record["prior"]))
    assert record["leakage"] == pytest.approx(100 * (1 - record["value"] / record["prior"]))
    assert record["n_held_out"] > 0
    cfg = reproduce_dmavfl.build(reproduce_dmavfl.EXPERIMENTS["credit_dmavfl"], small)
    from vflbench.experiment.scenario import load_vertical_data

    training_rows = len(load_vertical_data(cfg).y_train)
    assert record["n_train"] + record["n_held_out"] == training_rows
    assert record["swap"] == small and json.dumps(record)


def test_vmask_table2_reads_the_sweep_and_pairs_the_change_by_seed(tmp_path):
    """Every cell is the mean [95% t interval] over seeds, read from result.json with RunResult.from_dict."""
    import vmask_table2

    from vflbench.experiment.results import AttackResult, RunResult, Timing, UtilityResult, write_atomic

    def attack(name: str, value: float, prior: float) -> AttackResult:
        return AttackResult(
            name=name,
            target="labels",
            metric="accuracy",
            direction="higher",
            value=value,
            prior=prior,
            prior_name="scratch",
            leakage=100 * (value - prior),
            values=[value],
            priors=[prior],
            leakages=[100 * (value - prior)],
            details={"selection": "last"},
        )

    directory = tmp_path / "vmask_seeds_tabmnist_mlp3"
    rows = []
    for defense, values in (("none", (0.66, 0.68, 0.70)), ("vmask", (0.50, 0.51, 0.55))):
        for seed, value in enumerate(values):
            run_hash = f"{defense}{seed}"
            result = RunResult(
                config_hash=run_hash,
                seed=seed,
                data={},
                utility=UtilityResult("accuracy", 0.97),
                defense=[] if defense == "none" else [{"name": defense, "params": {}}],
                attacks=[attack(vmask_table2.REINIT, value, 0.48), attack(vmask_table2.ADAPTIVE, 0.7, 0.48)],
                timing=Timing(1.0, [1.0]),
                comm={},
            )
            write_atomic(directory / "runs" / run_hash / "result.json", json.dumps(result.to_dict()))
            rows.append(
                {
                    "defense": defense if defense == "none" else f'{defense} [name="{defense}"]',
                    "seed": seed,
                    "config_hash": run_hash,
                    "mask_ratio": None if defense == "none" else 0.5,
                }
            )
    import pandas as pd

    pd.DataFrame(rows).to_csv(directory / "summary.csv", index=False)
    text = vmask_table2.table("tabmnist_mlp3", directory)
    # Vanilla reinit leakage 18, 20, 22 points: mean 20, sd 2 -> half-width 4.3027 * 2 / sqrt(3) = 4.97
    assert (
        "| Vanilla | 97.00 [97.00, 97.00] | 99.02 | 68.00 [63.03, 72.97] | 80.72 | 48.00 [48.00, 48.00] | 41.35 | "
        "+20.00 [+15.03, +24.97] | +39.37 | – |"
    ) in text
    # VMask minus Vanilla by seed: -16, -17, -15 -> mean -16, sd 1, half-width 2.48: lower
    assert "-16.00 [-18.48, -13.52] lower" in text and "| 0.50 |" in text
    assert "model_completion: last; vmask_weight_recovery: last" in text
