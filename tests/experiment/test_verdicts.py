"""Verdicts of a sweep: one leakage scale for every attack (a feature attack that works leaks a
positive number of points everywhere), no credit for stopping an attack that does not beat its
prior without a defense, and notes on adaptive attacks a defense was not evaluated against."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from conftest import minimal

from vflbench.errors import ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.sweep import adaptive_coverage, run_sweep
from vflbench.experiment.tune import tune
from vflbench.report import build_report

# Model completion with one known label per class and the local prior J_loc does not beat J_loc on
# breast_cancer at seed 0 (undefended leakage about -32 points): there is nothing to defend.
IDLE_ATTACK = {"name": "model_completion", "epochs": 1, "known_per_class": 1, "prior": "local"}
# Black-box model inversion (He et al.'s inverse network) beats the aux-mean guess on breast_cancer.
FEATURE_ATTACK = {
    "name": "model_inversion",
    "mode": "black_box",
    "shadow_epochs": 5,
    "inverse_epochs": 20,
    "n_targets": 50,
}


def _cfg(attacks, defense, strengths, seeds=(0,)):
    raw = minimal(
        data={"name": "breast_cancer"},
        train={"epochs": 2, "batch_size": 32},
        defenses=[{"name": defense}],
        attacks=attacks,
        evaluation={"repeats": 3},
    )
    raw["sweep"] = {"grid": {"defenses.0.strength": strengths}, "seeds": list(seeds)}
    return build_config(raw)


def test_sweep_gives_no_pu_score_for_an_attack_that_does_not_leak_without_defense(tmp_path):
    """Old behaviour: the attack's negative leakage scored as privacy score 5, so dcor earned S*_PU 5
    for 'stopping' an attack that never beat its prior; and nothing said dcor was never evaluated
    against embedding extension."""
    run_sweep(_cfg([IDLE_ATTACK], "dcor", [0.1]), tmp_path)
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == 2  # the defended run reused the sweep's undefended run instead of training its own
    summary = pd.read_csv(tmp_path / "summary.csv")
    none = summary[summary["defense"] == "none"].iloc[0]
    dcor = summary[summary["defense"] == "dcor"].iloc[0]
    assert none["leakage"] < 0 and not none["leaks_without_defense"]
    assert dcor["undefended_leakage"] == pytest.approx(none["leakage"]) and not dcor["leaks_without_defense"]
    assert summary["pu_score"].isna().all()
    assert summary["pu_note"].str.contains("does not leak measurably without a defense").all()
    result = json.loads((tmp_path / "runs" / dcor["config_hash"] / "result.json").read_text())
    assert result["attacks"][0]["leaks_without_defense"] is False

    scores = pd.read_csv(tmp_path / "scores.csv").set_index("defense")
    assert scores["s_pu"].isna().all() and scores["c_dcs"].isna().all()
    assert "model_completion: left out of s_pu and c_dcs" in scores.loc["dcor", "note"]

    coverage = pd.read_csv(tmp_path / "coverage.csv")
    assert coverage.to_dict("records")[0]["adaptive"] == "embedding_extension"
    assert not coverage["evaluated"].iloc[0]

    report = build_report(tmp_path).read_text()
    assert "Attacks that do not leak measurably without a defense" in report
    assert "model_completion on breast_cancer" in report
    assert "dcor was not evaluated against its adaptive attack embedding_extension" in report

    with pytest.raises(ConfigError, match="does not leak measurably without a defense"):
        tune(_cfg([IDLE_ATTACK], "dcor", [0.1]), tmp_path / "tune", budget=5.0, low=0.01, high=1.0, steps=2)


def test_a_feature_attack_that_works_leaks_positive_points_everywhere(tmp_path):
    """Old behaviour: the feature attack's leakage was prior - MSE in MSE units (< 1), and it entered
    Kang's label score table (S*_PU 5 for an undefended run) and C-DCS as if lower MSE leaked less."""
    run_sweep(
        _cfg(
            [{"name": "direction_scoring", "epochs": [0]}, FEATURE_ATTACK], "embedding_noise", [0.05], seeds=(0, 1, 2)
        ),
        tmp_path,
    )
    summary = pd.read_csv(tmp_path / "summary.csv")
    mi = summary[summary["attack"] == "model_inversion"].set_index("defense")
    assert (mi["attack_direction"] == "lower").all() and (mi["attack_value"] < mi["prior"]).all()
    expected = 100 * (1 - mi["attack_value"] / mi["prior"])
    assert (mi["leakage"] > 1.0).all() and mi["leakage"].tolist() == pytest.approx(expected.tolist())
    assert mi["leaks_without_defense"].all() and mi["pu_score"].isna().all()
    assert mi["pu_note"].str.contains("not defined for feature attacks").all()
    ds = summary[summary["attack"] == "direction_scoring"].set_index("defense")
    assert (ds.loc["none", "pu_score"] == 0).all()  # Kang's 'No Protect' convention

    scores = pd.read_csv(tmp_path / "scores.csv").set_index("defense")
    assert scores.loc["none", "eps_p.model_inversion"] > 1.0 and scores.loc["none", "s_pu"] == 0
    assert scores.loc["embedding_noise", "eps_p.model_inversion"] > 1.0
    assert (
        "model_inversion: left out of s_pu and c_dcs, not defined for feature attacks"
        in scores.loc["embedding_noise", "note"]
    )

    report = build_report(tmp_path).read_text()
    assert "100·(1 − MSE / MSE_prior)" in report
    means = summary.groupby(["defense", "attack"])["leakage"].mean()
    assert f"{means[('none', 'model_inversion')]:.2f}" in report

    with pytest.raises(ConfigError, match="feature attack.*model_inversion.*100\\*\\(1 - MSE/MSE_prior\\)"):
        tune(_cfg([FEATURE_ATTACK], "embedding_noise", [0.05]), tmp_path / "tune", budget=5.0, low=0.01, high=1.0)
    assert not (tmp_path / "tune").exists()  # refused before any training


def test_adaptive_coverage_marks_defenses_evaluated_without_their_adaptive_attacks():
    stacks = [
        ([{"name": "dcor", "params": {}}], {"model_completion"}),
        ([{"name": "dcor", "params": {"weight": 0.5}}], {"embedding_extension"}),
        ([{"name": "labobf", "params": {"per_class": 2}}], {"model_completion"}),
        ([{"name": "vmask_rs", "params": {}}], {"model_completion"}),
    ]
    rows = {r["defense"]: r for r in adaptive_coverage(stacks).to_dict("records")}
    assert rows["dcor"]["evaluated"] and rows["dcor"]["note"] == ""
    assert not rows["labobf"]["evaluated"] and rows["labobf"]["adaptive"] == "false_attribute: true"
    assert rows["vmask_rs"]["adaptive"].startswith("vmask_weight_recovery") and not rows["vmask_rs"]["evaluated"]
    assert "vmask_rs was not evaluated against its adaptive attack vmask_weight_recovery" in rows["vmask_rs"]["note"]
    with_false = {
        r["adaptive"]: r["evaluated"]
        for r in adaptive_coverage([([{"name": "labobf", "params": {"false_attribute": True}}], set())]).to_dict(
            "records"
        )
    }
    assert with_false == {"labobf_adaptive_mixmatch": False, "false_attribute: true": True}
    adaptive = [([{"name": "labobf", "params": {}}], {"labobf_adaptive_mixmatch"})]
    assert adaptive_coverage(adaptive).set_index("adaptive").loc["labobf_adaptive_mixmatch", "evaluated"]


def test_describe_names_the_attacks_on_what_a_defense_protects_and_its_adaptive_attacks():
    from typer.testing import CliRunner

    from vflbench.cli import app

    def describe(name):
        proc = CliRunner().invoke(app, ["describe", name])
        assert proc.exit_code == 0, proc.output
        # rich wraps lines at the terminal's width (fixed when the console was made, from $COLUMNS then): join
        # them, then cut out the two sections, which end at the next section or the parameters table
        text = " ".join(proc.output.split())
        sections = re.search(
            r"attacks on what it protects: (.*?) adaptive attacks: (.*?)(?: parameters [^a-z]|$)", text
        )
        assert sections is not None, proc.output
        return {"attacks on what it protects": sections[1], "adaptive attacks": sections[2]}

    vmask = describe("vmask_rs")
    assert (
        "model_completion" in vmask["attacks on what it protects"]
        and "dmavfl" not in vmask["attacks on what it protects"]
    )
    assert "vmask_weight_recovery" in vmask["adaptive attacks"]
    assert "embedding_extension" in describe("dcor")["adaptive attacks"]
    assert "false_attribute: true" in describe("labobf")["adaptive attacks"]
    assert "labobf_adaptive_mixmatch" in describe("labobf")["adaptive attacks"]
    nopeek = describe("nopeek")
    assert (
        "dmavfl" in nopeek["attacks on what it protects"]
        and "norm_scoring" not in nopeek["attacks on what it protects"]
    )


def test_run_table_says_when_an_attack_does_not_leak_without_defense():
    from rich.console import Console

    from vflbench.cli import _result_table
    from vflbench.experiment.run import run_experiment

    raw = minimal(
        data={"name": "breast_cancer"},
        train={"epochs": 2, "batch_size": 32},
        defenses=[{"name": "dcor", "weight": 0.1}],
        attacks=[IDLE_ATTACK],
        evaluation={"repeats": 3},
    )
    result = run_experiment(build_config(raw))
    attack = result.attacks[0]
    assert attack.leaks_without_defense is False and attack.undefended_leakage < 0
    console = Console(record=True, width=300)
    console.print(_result_table(result))
    assert "no measurable leak: nothing to defend" in console.export_text()
