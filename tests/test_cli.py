"""The command line: the happy path and clear one-paragraph errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import minimal


def vflbench(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the console script in a fresh process (what a user runs)."""
    return subprocess.run([sys.executable, "-m", "vflbench.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run ``vflbench.cli.main`` in this process (fast), returning (exit code, stdout, stderr)."""
    from vflbench import cli as cli_module

    def call(*args: str) -> subprocess.CompletedProcess:
        monkeypatch.setattr(sys, "argv", ["vflbench", *args])
        code = 0
        try:
            cli_module.main()
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, captured.out, captured.err)

    return call


def write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


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


@pytest.mark.parametrize(("raw", "overrides", "expected"), [
    (minimal(data={"name": "digitz"}), [], "unknown dataset 'digitz'; valid dataset names are: "),
    (minimal(model={"bottom": "mlp9"}), [], "unknown model 'mlp9'; valid model names are: "),
    (minimal(attacks=[{"name": "nope"}]), [], "unknown attack 'nope'; valid attack names are: "),
    (minimal(defenses=[{"name": "nope"}]), [], "unknown defense 'nope'; valid defense names are: "),
    (minimal(data={"parties": 9}), [], "cannot split 8 pixel columns among 9 feature-holding parties"),
    (minimal(data={"name": "synthetic", "parties": 6, "options": {"n_features": 5, "n_informative": 3}}), [],
     "cannot split 5 features among 6 feature-holding parties"),
    (minimal(train={"algorithm": "vlr", "aggregation": "concat"}, model={"bottom": "logreg", "top": "identity"}),
     [], "aggregation 'concat' is not allowed with vlr; vlr allows: sum"),
    (minimal(model={"bottom": "lenet5"}), [], "model 'lenet5' does not fit a party's input of shape (1, 8, 4)"),
    (minimal(train={"epochz": 1}), [], "unknown key 'train.epochz'; valid keys here are: algorithm"),
    (minimal(), ["train.epochs=0"], "train.epochs: Input should be greater than or equal to 1"),
    (minimal(data={"name": "mnist", "root": "/nonexistent"}), [],
     "missing train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz"),
    (minimal(attacks=[{"name": "norm_scoring"}]), [], "needs binary labels, but the task has 10 classes"),
    (minimal(attacks=[{"name": "model_completion", "epoch": 3}]), [],
     "attack 'model_completion' has no parameter 'epoch'; valid parameters are: party, known_per_class, epochs"),
])
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
