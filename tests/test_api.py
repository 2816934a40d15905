"""The public Python API: the README's example runs, results round-trip, errors are clear."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import vflbench as vb

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_example() -> str:
    text = README.read_text()
    match = re.search(r"<!-- this block is run by tests/test_api.py -->\n```python\n(.*?)```", text, re.S)
    assert match, "README's Python API example is missing"
    return match.group(1)


def test_readme_example_runs_and_shows_the_defense_working(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_readme_example(), "README.md", "exec"), scope)
    printed = capsys.readouterr().out
    assert printed.count("marvell") >= 2
    result, same, table = scope["result"], scope["same"], scope["table"]
    assert isinstance(result, vb.RunResult) and same == result  # load_result gives back what run returned
    for attack in result.attacks:  # one run: strength 1.0 lowers each attack, but one run gives no interval
        assert attack.leakage < attack.undefended_leakage - 10 and attack.leaks_without_defense is None
    assert result.utility_loss is not None
    rows = table.groupby(["defense", "strength", "attack"], dropna=False).first()
    ds = rows.xs("direction_scoring", level="attack")
    assert ds["leaks_without_defense"].all()  # the README's claims: DS leaks on every seed ...
    assert ds.loc[("marvell", 1.0), "change"] == "lower"  # ... and Marvell 1.0 lowers it measurably
    assert ds.loc[("marvell", 0.1), "change"] == "no measurable change"
    ns = rows.xs("norm_scoring", level="attack")
    assert not ns["leaks_without_defense"].any()  # NS does not leak measurably over three seeds


def test_config_accepts_mappings_files_and_configs(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: {name: digits, parties: 2}\ntrain: {epochs: 1}\n")
    from_file = vb.make_config(path, overrides=["train.epochs=2"])
    assert from_file.train.epochs == 2
    assert vb.make_config(from_file) is from_file
    assert vb.make_config({"data": {"name": "digits", "parties": 2}}).data.name == "digits"
    with pytest.raises(vb.ConfigError, match="mapping"):
        vb.make_config(42)  # type: ignore[arg-type]


def test_unknown_keys_are_config_errors_from_python_too():
    with pytest.raises(vb.ConfigError, match="epochz"):
        vb.make_config({"data": {"name": "digits", "parties": 2}, "train": {"epochz": 1}})


def test_sweep_needs_a_sweep_section(tmp_path):
    with pytest.raises(vb.ConfigError, match="no 'sweep' section"):
        vb.sweep({"data": {"name": "digits", "parties": 2}}, out=tmp_path)


def test_loading_a_missing_result_says_what_to_give(tmp_path):
    with pytest.raises(vb.ConfigError, match="result.json"):
        vb.load_result(tmp_path)
    with pytest.raises(vb.ConfigError, match="summary.csv"):
        vb.load_sweep(tmp_path)


def test_utility_loss_needs_the_vanilla_baseline():
    result = vb.run({"data": {"name": "breast_cancer", "parties": 2}, "train": {"epochs": 1}})
    assert result.utility_loss is None
    with pytest.raises(KeyError, match="no attack"):
        result.attack("sdar")


def test_unknown_attribute_of_the_package_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'rn'"):
        vb.rn  # noqa: B018


def test_init_writes_the_packaged_examples_and_refuses_to_overwrite(tmp_path):
    from typer.testing import CliRunner

    from vflbench.cli import app

    target = tmp_path / "configs"
    first = CliRunner().invoke(app, ["init", str(target)])
    assert first.exit_code == 0, first.output
    assert {p.name for p in target.iterdir()} == {"demo.yaml", "sweep_demo.yaml", "feature_demo.yaml"}
    assert vb.make_config(target / "demo.yaml").data.name == "digits"
    again = CliRunner().invoke(app, ["init", str(target)])
    assert again.exit_code != 0 and "--force" in str(again.exception)
    assert CliRunner().invoke(app, ["init", str(target), "--force"]).exit_code == 0


@pytest.mark.slow
def test_readme_feature_example_leaks_and_embedding_noise_lowers_it(tmp_path):
    """The README's feature-reconstruction example (configs/feature_demo.yaml): both attacks beat the
    mean guess without a defense, and embedding noise (sigma 1) moves both towards it."""
    demo = Path(__file__).resolve().parents[1] / "configs" / "feature_demo.yaml"
    plain = vb.run(demo, out=tmp_path)
    noisy = vb.run(vb.make_config(demo, overrides=["defenses=[{name: embedding_noise, sigma: 1.0}]"]), out=tmp_path)
    for name in ("sdar", "model_inversion"):
        before, after = plain.attack(name), noisy.attack(name)
        assert before.leakage > 20  # points of 100 x (1 - MSE / MSE_prior)
        assert after.undefended_leakage == pytest.approx(before.leakage)  # the shared undefended run
        assert after.leakage < before.leakage - 5
    mi, sdar = plain.attack("model_inversion"), plain.attack("sdar")
    assert mi.leaks_without_defense is True and len(mi.leakages) == 3 and mi.leakage_ci[0] > 20
    assert sdar.leaks_without_defense is None and len(sdar.leakages) == 1  # fixed by training: no interval
    assert plain.data["n_held_out"] == round(0.2 * plain.data["n_train"])  # SDAR's aux rows: the held-out pool
