"""Bad input: one clear line naming the problem, exit status 2, no traceback, and nothing written.

Each case is a command line run in-process through ``vflbench.cli.main``; the comment on each
row says what the command did before (a traceback, or silently running something else).
"""

from __future__ import annotations

import gzip
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import minimal

MC = {"name": "model_completion", "epochs": 1, "known_per_class": 2}


def _write(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def unwritable(tmp_path) -> Path:
    """A directory this process cannot create anything in (root ignores permission bits, so it gets /sys)."""
    if os.geteuid() == 0:
        if not Path("/sys/kernel").is_dir():
            pytest.skip("needs a read-only /sys when run as root")
        yield Path("/sys/kernel")
        return
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    yield locked
    locked.chmod(stat.S_IRWXU)


def _truncated_mnist(root: Path) -> None:
    folder = root / "mnist"
    folder.mkdir(parents=True)
    for name in (
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ):
        whole = gzip.compress(bytes(4) + os.urandom(4000))
        (folder / name).write_bytes(whole[: len(whole) // 2])


# (config sections, --set overrides, expected message). Every row was accepted or crashed before.
CONFIG_CASES = {
    # ran as select: last
    "literal choice": (
        {"attacks": [{**MC, "select": "worst"}]},
        [],
        "attack 'model_completion': parameter 'select' = 'worst' is not valid; expected one of "
        "'last', 'validation', 'test_oracle'.",
    ),
    # ran SGD
    "literal with suggestion": (
        {"attacks": [{**MC, "optimizer": "adamw"}]},
        [],
        "parameter 'optimizer' = 'adamw' is not valid; expected one of 'adam', 'sgd'. Did you mean 'adam'?",
    ),
    # TypeError after the whole training
    "wrong type after training": (
        {"attacks": [{**MC, "lr": "fast"}]},
        [],
        "parameter 'lr' = 'fast' is not valid; expected a finite number.",
    ),
    "infinite attack lr": (
        {"attacks": [{**MC, "lr": float("inf")}]},
        [],
        "parameter 'lr' = .inf is not valid; expected a finite number.",
    ),
    "negative lr": ({"attacks": [{**MC, "lr": -0.1}]}, [], "parameter 'lr' = -0.1 is not valid; it must be > 0."),
    "negative epochs": (
        {"attacks": [{**MC, "epochs": -2}]},
        [],
        "parameter 'epochs' = -2 is not valid; it must be >= 1.",
    ),
    # train.lr: .inf trained on NaN
    "infinite train lr": ({}, ["train.lr=.inf"], "train.lr: Input should be a finite number"),
    # strength: true ran as 1.0
    "bool strength": (
        {"defenses": [{"name": "isotropic_noise", "strength": True}]},
        [],
        "defense 'isotropic_noise': parameter 'strength' = true is not valid; expected a finite number.",
    ),
    # Python's TypeError text
    "string strength": (
        {"defenses": [{"name": "isotropic_noise", "strength": "high"}]},
        [],
        "defense 'isotropic_noise': parameter 'strength' = 'high' is not valid; expected a finite number.",
    ),
    "defense parameter name": (
        {"defenses": [{"name": "isotropic_noise", "alpah": 1.0}]},
        [],
        "defense 'isotropic_noise' has no parameter 'alpah'; valid parameters are: alpha, "
        "strength. Did you mean 'alpha'?",
    ),
    "defense name": (
        {"defenses": [{"name": "isotropic_nois"}]},
        [],
        "unknown defense 'isotropic_nois'; valid defense names are: ",
    ),
    "defense literal": (
        {"defenses": [{"name": "discrete_sgd", "mode": "fun"}]},
        [],
        "defense 'discrete_sgd': parameter 'mode' = 'fun' is not valid; expected one of 'kang', 'fu'.",
    ),
    "attack parameter name": ({"attacks": [{**MC, "selct": "best"}]}, [], "Did you mean 'select'?"),
    "model option": (
        {"model": {"bottom": "mlp2", "bottom_options": {"hiden": 8}}},
        [],
        "model 'mlp2' has no option 'hiden'; valid options are: hidden. Did you mean 'hidden'?",
    ),
    "dataset option type": (
        {"data": {"name": "synthetic", "options": {"n_samples": "many"}}},
        [],
        "dataset 'synthetic': option 'n_samples' = 'many' is not valid; expected an integer.",
    ),
    # ignored
    "columns on images": (
        {"data": {"columns": [[0, 1], [2, 3]]}},
        [],
        "digits is a image dataset: data.columns applies to tabular datasets only",
    ),
    # refused after the run directory was made
    "marvell on 10 classes": ({"defenses": [{"name": "marvell"}]}, [], "needs binary labels"),
    # refused after the training, when the attack drew its labelled rows
    "known labels per class": (
        {"attacks": [{**MC, "known_per_class": 1000}]},
        [],
        "attack 'model_completion': known_per_class 1000 is more than the smallest class",
    ),
    # refused after the training
    "auc on 10 classes": (
        {"train": {"metric": "auc"}},
        [],
        "train.metric 'auc' needs a binary task, but digits has 10 classes",
    ),
    # hidden behind "Input should be a valid list"
    "yaml syntax in --set": (
        {},
        ["attacks=[{name: x}"],
        "--set 'attacks=[{name: x}': the value '[{name: x}' is not valid YAML",
    ),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_config_is_one_line_and_writes_nothing(tmp_path, cli, case):
    sections, overrides, expected = CONFIG_CASES[case]
    cfg = _write(
        tmp_path / "exp.yaml",
        minimal(train={"epochs": 1}, **sections)
        if "train" not in sections
        else minimal(**{**sections, "train": {"epochs": 1, **sections["train"]}}),
    )
    args = ["run", str(cfg), "--out", str(tmp_path / "runs")]
    for o in overrides:
        args += ["--set", o]
    _assert_one_line_error(cli(*args), expected)
    assert not (tmp_path / "runs").exists()


def _assert_one_line_error(proc: subprocess.CompletedProcess, expected: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert expected in lines[0], proc.stderr


def test_bad_paths_are_one_line_and_write_nothing(tmp_path, cli, unwritable):
    cfg = _write(tmp_path / "exp.yaml", minimal(train={"epochs": 1}))
    sweep_cfg = _write(tmp_path / "sweep.yaml", minimal(train={"epochs": 1}, sweep={"seeds": [0, 1]}))
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = [
        (["run", str(tmp_path)], f"{tmp_path} is a directory; give the path of an experiment YAML file"),
        (["run", str(cfg), "--out", str(a_file)], f"--out {a_file} is a file; give a directory"),
        (["run", str(cfg), "--out", str(a_file / "runs")], f"{a_file} is a file, not a directory"),
        (["run", str(cfg), "--out", str(unwritable / "runs")], f"cannot write in {unwritable}"),
        (["sweep", str(sweep_cfg), "--out", str(unwritable / "s")], f"cannot write in {unwritable}"),
        (["sweep", str(sweep_cfg), "--out", str(unwritable), "--resume"], f"cannot write in {unwritable}"),
        (["report", str(unwritable)], f"cannot write in {unwritable}"),
        (["report", str(tmp_path / "nothing")], "does not exist"),
        # a traceback before; 0 silently became the config's workers
        (["sweep", str(sweep_cfg), "--out", str(tmp_path / "s"), "--workers", "-3"], "--workers must be at least 1"),
        (["sweep", str(sweep_cfg), "--out", str(tmp_path / "s"), "--workers", "0"], "--workers must be at least 1"),
    ]
    for args, expected in cases:
        _assert_one_line_error(cli(*args), expected)
    assert not (tmp_path / "s").exists()
    assert not any(p.name.startswith(".vflbench-") for p in tmp_path.iterdir())


def test_truncated_gz_without_verification(tmp_path, cli):
    """A truncated download read with `verify: false` was an EOFError traceback."""
    _truncated_mnist(tmp_path / "data")
    cfg = _write(
        tmp_path / "exp.yaml",
        minimal(
            data={"name": "mnist", "root": str(tmp_path / "data"), "options": {"verify": False}}, train={"epochs": 1}
        ),
    )
    _assert_one_line_error(cli("run", str(cfg), "--out", str(tmp_path / "runs")), "is truncated or corrupt")
    assert not (tmp_path / "runs").exists()


def test_datasets_verify_exits_non_zero_on_a_corrupt_file(tmp_path, cli):
    """main() ignored the status typer returned, so a corrupt file exited 0."""
    _truncated_mnist(tmp_path)
    proc = cli("datasets", "verify", "--data-root", str(tmp_path), "mnist")
    assert proc.returncode == 1 and "corrupt" in proc.stdout


def test_a_sweep_point_the_data_refuses_fails_before_any_point_runs(tmp_path, cli):
    """A known_per_class above the smallest class in one grid value failed only when that point ran."""
    cfg = _write(
        tmp_path / "sweep.yaml",
        minimal(train={"epochs": 1}, attacks=[MC], sweep={"grid": {"attacks.0.known_per_class": [2, 1000]}}),
    )
    _assert_one_line_error(
        cli("sweep", str(cfg), "--out", str(tmp_path / "s")), "known_per_class 1000 is more than the smallest class"
    )
    assert not (tmp_path / "s").exists()
