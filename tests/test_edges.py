"""The last rough edges of issue 27: each input here gave a traceback, was accepted silently, or was
answered unclearly. Each is now one clear ``error:`` line (exit status 2) that leaves nothing behind.

Commands run in-process through ``vflbench.cli.main`` (the ``cli`` fixture).
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import minimal

from vflbench.errors import ConfigError
from vflbench.experiment.config import load_config


def _write(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def _one_line_error(proc: subprocess.CompletedProcess, expected: str) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert expected in lines[0], proc.stderr
    return lines[0]


# --- tracebacks before ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        # numpy's SeedSequence traceback
        ("seed=-1", "seed = -1 is out of range; valid values are 0 to 4294967295"),
        ("seed=4294967296", "seed = 4294967296 is out of range; valid values are 0 to 4294967295"),
        # the allocator's traceback (100 TB asked for)
        (
            "model.embed_dim=100000000000",
            "model.embed_dim = 100000000000 is out of range; valid values are 1 to 1048576",
        ),
        ("model.embed_dim=0", "model.embed_dim = 0 is out of range"),
        (
            "model.bottom_options.hidden=100000000000",
            "option 'hidden' = 100000000000 is not valid; it must be >= 1 and <= 1048576.",
        ),
        ("model.top_options.hidden=[100000000000]", "option 'hidden' = [100000000000] is not valid"),
    ],
)
def test_out_of_range_sizes_and_seeds_are_one_line(tmp_path, cli, override, expected):
    cfg = _write(tmp_path / "exp.yaml", minimal(train={"epochs": 1}))
    _one_line_error(cli("run", str(cfg), "--out", str(tmp_path / "runs"), "--set", override), expected)
    assert not (tmp_path / "runs").exists()


def test_a_sweep_seed_out_of_range_is_refused_before_any_point(tmp_path, cli):
    cfg = _write(tmp_path / "sweep.yaml", minimal(train={"epochs": 1}, sweep={"seeds": [0, -1]}))
    _one_line_error(cli("sweep", str(cfg), "--out", str(tmp_path / "s")), "seed = -1 is out of range")
    assert not (tmp_path / "s").exists()


def test_running_out_of_memory_is_one_line(tmp_path, cli, monkeypatch):
    """Sizes inside the bounds can still exhaust a small machine: the allocator's error becomes one line."""
    from vflbench.experiment import run as run_module

    def no_memory(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 25600000000000 bytes. Error code 12 (Cannot allocate memory)"
        )

    monkeypatch.setattr(run_module, "train_run", no_memory)  # the test's stand-in for an allocation that fails
    cfg = _write(tmp_path / "exp.yaml", minimal(train={"epochs": 1}))
    line = _one_line_error(
        cli("run", str(cfg), "--out", str(tmp_path / "runs")), "out of memory (25,600.0 GB asked for)"
    )
    assert "model.embed_dim" in line and "train.batch_size" in line


def test_other_runtime_errors_keep_their_traceback(tmp_path, cli, monkeypatch):
    """Only a failed allocation is the environment's fault; any other RuntimeError is a bug and must show."""
    from vflbench.experiment import run as run_module

    def bug(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(run_module, "train_run", bug)
    cfg = _write(tmp_path / "exp.yaml", minimal(train={"epochs": 1}))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        cli("run", str(cfg), "--out", str(tmp_path / "runs"))


class _FullDisk:
    """``os.write`` for a disk that fills up while a file whose name starts with ``.<target>.`` (the library's
    temporary file for ``target``) is written: half of the buffer goes to disk, then ENOSPC."""

    def __init__(self, target: str) -> None:
        self.prefix = f".{target}."
        self.real = os.write

    def __call__(self, fd: int, data) -> int:
        if Path(os.readlink(f"/proc/self/fd/{fd}")).name.startswith(self.prefix):
            self.real(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.real(fd, data)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a file descriptor's file through /proc")
@pytest.mark.parametrize("target", ["config.yaml", "metrics.jsonl", "active.top.final.pt", "result.json"])
def test_a_full_disk_during_run_is_one_line_and_leaves_nothing(tmp_path, cli, monkeypatch, target):
    """Before: a 63-line torch.save traceback, a 0-byte .tmp and a run directory without result.json."""
    cfg = _write(tmp_path / "exp.yaml", minimal(train={"epochs": 2}))
    monkeypatch.setattr(os, "write", _FullDisk(target))  # the test's full disk; the library writes through os.write
    line = _one_line_error(
        cli("run", str(cfg), "--out", str(tmp_path / "runs")),
        "No space left on device while writing " + str(tmp_path / "runs"),
    )
    assert target in line
    assert "the unfinished run directory" in line and "was removed; free some space and run again" in line
    assert list((tmp_path / "runs").iterdir()) == []  # no run directory, no temporary file


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a file descriptor's file through /proc")
@pytest.mark.parametrize("target", ["result.json", "summary.csv"])
def test_a_full_disk_during_a_sweep_has_no_traceback(tmp_path, cli, monkeypatch, target):
    cfg = _write(tmp_path / "sweep.yaml", minimal(train={"epochs": 1}, sweep={"seeds": [0, 1]}))
    monkeypatch.setattr(os, "write", _FullDisk(target))
    proc = cli("sweep", str(cfg), "--out", str(tmp_path / "s"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("error: No space left on device")
    assert not [p for p in (tmp_path / "s").rglob("*") if p.name.endswith(".tmp")]
    assert not [p for p in (tmp_path / "s" / "runs").glob("*") if not (p / "result.json").is_file()]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a file descriptor's file through /proc")
def test_a_full_disk_leaves_an_earlier_run_directory_in_place(tmp_path, cli, monkeypatch):
    cfg = _write(tmp_path / "exp.yaml", minimal(train={"epochs": 1}))
    assert cli("run", str(cfg), "--out", str(tmp_path / "runs")).returncode == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    before = (run_dir / "result.json").read_text()
    monkeypatch.setattr(os, "write", _FullDisk("metrics.jsonl"))
    line = _one_line_error(cli("run", str(cfg), "--out", str(tmp_path / "runs")), "No space left on device")
    assert f"{run_dir} existed before this run and was left in place" in line
    assert (run_dir / "result.json").read_text() == before
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]


# --- accepted silently before ----------------------------------------------------------------------------------------


def test_a_key_given_twice_is_refused_with_its_lines(tmp_path, cli):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("data: {name: digits}\ntrain:\n  epochs: 1\n  lr: 0.1\n  epochs: 3\n")
    _one_line_error(
        cli("run", str(cfg), "--out", str(tmp_path / "runs")),
        f"{cfg}: the key 'epochs' is given twice in one section (lines 3 and 5)",
    )
    clean = _write(tmp_path / "clean.yaml", minimal(train={"epochs": 1}))
    _one_line_error(cli("run", str(clean), "--set", "data={name: a, name: b}"), "the key 'name' is given twice")


def test_the_same_key_in_different_sections_and_merge_keys_are_fine():
    from vflbench.experiment.config import load_yaml

    text = "base: &b {epochs: 1, lr: 0.1}\ntrain:\n  <<: *b\n  lr: 0.2\nmodel: {lr: 3}\n"
    assert load_yaml(text, "x.yaml") == {
        "base": {"epochs": 1, "lr": 0.1},
        "train": {"epochs": 1, "lr": 0.2},
        "model": {"lr": 3},
    }


def test_run_refuses_a_config_with_a_sweep_section(tmp_path, cli):
    """Before: it ran the base config and said nothing."""
    cfg = _write(tmp_path / "sweep.yaml", minimal(train={"epochs": 1}, sweep={"seeds": [0, 1]}))
    _one_line_error(
        cli("run", str(cfg), "--out", str(tmp_path / "runs")),
        f"{cfg} has a sweep: section, and `vflbench run` runs one experiment; run the sweep with: "
        f"vflbench sweep {cfg} --out DIR",
    )
    assert not (tmp_path / "runs").exists()


def _csv_config(tmp_path: Path, text: str) -> Path:
    (tmp_path / "data.csv").write_text(text)
    return _write(
        tmp_path / "exp.yaml",
        minimal(
            data={"name": "csv", "options": {"path": str(tmp_path / "data.csv"), "label": "y"}}, train={"epochs": 1}
        ),
    )


def test_a_label_column_with_one_class_is_refused(tmp_path, cli):
    """Before: it trained and reported accuracy 1.0000."""
    cfg = _csv_config(tmp_path, "a,b,y\n" + "".join(f"{i},{i * 2},yes\n" for i in range(20)))
    _one_line_error(
        cli("run", str(cfg), "--out", str(tmp_path / "runs")),
        "the label column 'y' of " + str(tmp_path / "data.csv") + " holds one class ('yes') in all 20 "
        "rows; a classifier needs at least two classes",
    )
    assert not (tmp_path / "runs").exists()


def test_training_rows_of_one_class_are_refused(tmp_path, cli):
    """Any dataset, not only a CSV: training rows of one class trained a constant classifier."""
    data = {"name": "synthetic", "options": {"n_samples": 60, "n_classes": 1}}
    cfg = _write(tmp_path / "exp.yaml", minimal(data=data, train={"epochs": 1}))
    _one_line_error(
        cli("run", str(cfg), "--out", str(tmp_path / "runs")),
        "training rows of synthetic hold only class 0; a classifier needs at least two classes",
    )
    assert not (tmp_path / "runs").exists()


# --- unclear before --------------------------------------------------------------------------------------------------


def test_a_csv_with_a_header_and_no_rows_says_so_first(tmp_path, cli):
    """Before: 'string columns ... encoded as ordinal codes', then 'the class counts are []'."""
    cfg = _csv_config(tmp_path, "a,b,y\n")
    line = _one_line_error(
        cli("run", str(cfg), "--out", str(tmp_path / "runs")),
        f"csv: {tmp_path / 'data.csv'} has no rows: only a header (columns ['a', 'b', 'y'])",
    )
    assert "ordinal" not in line and "class counts" not in line


def test_a_tab_in_yaml_is_named_with_its_place(tmp_path, cli):
    """Before: a multi-line PyYAML message naming the character `t`."""
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("data: {name: digits}\ntrain:\n\tepochs: 1\n")
    _one_line_error(cli("run", str(cfg)), f"{cfg}: a tab character at line 3 col 1; YAML indents with spaces")
    cfg.write_text("data: {name: digits}\ntrain:\n  epochs: 1\n  \tlr: 0.1\n")
    _one_line_error(cli("run", str(cfg)), "a tab character at line 4 col 3; YAML indents with spaces")


def test_other_yaml_errors_are_one_line_with_their_place(tmp_path):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("data: {name: digits\ntrain: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert "\n" not in str(info.value) and "is not valid YAML" in str(info.value) and "line 2 col" in str(info.value)


# --- set-up ----------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_readme_demo_table_is_what_the_demo_prints(tmp_path):
    """The README showed 3 of the table's 6 columns."""
    import re

    from vflbench.cli import _result_table
    from vflbench.experiment.run import run_experiment

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    block = readme.split("`make demo` prints this table", 1)[1].split("```", 2)[1]
    result = run_experiment(load_config(root / "configs" / "demo.yaml"), out_dir=tmp_path)
    table = _result_table(result)
    header = next(line for line in block.splitlines() if line.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == [str(c.header) for c in table.columns]
    rows = {
        cells[0]: cells[1:]
        for line in block.splitlines()
        if line.startswith("│")
        for cells in [[c.strip() for c in line.strip("│").split("│")]]
    }
    printed = {
        str(table.columns[0]._cells[i]): [str(c._cells[i]) for c in table.columns[1:]] for i in range(table.row_count)
    }
    assert rows == printed
    assert re.search(rf"run {result.config_hash} \(seed 0\)", block)


@pytest.mark.skipif(
    not any((Path(d) / "make").is_file() for d in os.environ.get("PATH", "").split(os.pathsep)), reason="needs make"
)
def test_make_demo_says_what_it_is_doing_before_each_long_step(tmp_path):
    """`make demo` was silent for minutes while pip installed torch."""
    root = Path(__file__).resolve().parents[1]
    plan = subprocess.run(
        ["make", "-n", "demo", f"VENV={tmp_path / 'venv'}"], cwd=root, capture_output=True, text=True, timeout=60
    ).stdout.splitlines()
    torch = next(i for i, line in enumerate(plan) if "pip install" in line and "torch==" in line)
    assert any(line.startswith('echo "==> [2/3] installing torch') for line in plan[:torch])
    assert any(line.startswith('echo "==> training the demo') for line in plan)


# --- swapping in a dataset: LabObf's attribute scaling -------------------------------------------------------------


def test_labobf_warns_when_its_attribute_scaling_is_left_to_the_library_default(caplog):
    """The reproduction configs append Algorithm 2's raw integer, the library's default rescales it: silently."""
    from vflbench.experiment.config import build_config
    from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses

    warnings = {}
    for normalise in (None, True, False):
        spec = {"name": "labobf"} if normalise is None else {"name": "labobf", "normalise": normalise}
        cfg = build_config(minimal(data={"name": "breast_cancer"}, defenses=[spec]))
        caplog.clear()
        with caplog.at_level("WARNING", logger="vflbench.defenses.labobf"):
            build_federation(cfg, load_vertical_data(cfg), defenses=plan_defenses(cfg, ["passive_1"]))
        warnings[normalise] = [r.getMessage() for r in caplog.records if "normalise is not set" in r.getMessage()]
    assert warnings[True] == [] and warnings[False] == []
    (message,) = warnings[None]
    assert "the reproduction configs (configs/repro/labobf_*.yaml) append the raw integer 0..200" in message


def test_every_labobf_config_says_how_it_scales_the_attribute():
    root = Path(__file__).resolve().parents[1] / "configs"
    specs = [
        (path.name, d)
        for path in sorted(root.rglob("*.yaml"))
        for d in (yaml.safe_load(path.read_text()) or {}).get("defenses") or []
        if d.get("name") == "labobf"
    ]
    assert specs and all("normalise" in d for _, d in specs), [name for name, d in specs if "normalise" not in d]


# --- package habits -------------------------------------------------------------------------------------------------


def test_the_package_ships_py_typed():
    from importlib.resources import files

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = Path(__file__).resolve().parents[1]
    assert (files("vflbench") / "py.typed").is_file()
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["vflbench"]
    assert "py.typed" in data


def test_pre_commit_runs_what_ci_runs():
    """The hooks run the Makefile's lint and typecheck commands (what .ci/run calls) and the format check."""
    root = Path(__file__).resolve().parents[1]
    hooks = yaml.safe_load((root / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    entries = {h["entry"] for h in hooks}
    makefile = (root / "Makefile").read_text().splitlines()
    for target in ("lint", "typecheck"):
        recipe = makefile[makefile.index(f"{target}: $(STAMP)") + 1].strip()
        assert recipe.replace("$(BIN)/", ".venv/bin/") in entries, (target, recipe, entries)
    assert ".venv/bin/ruff format --check src tests benchmarks" in entries
    assert all(h["pass_filenames"] is False and h["language"] == "system" for h in hooks)
    assert "make lint typecheck" in (root / ".ci" / "run").read_text()


def test_the_changelog_has_an_unreleased_section_and_the_current_version():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = Path(__file__).resolve().parents[1]
    text = (root / "CHANGELOG.md").read_text()
    version = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[0] == "## [Unreleased]" and any(h.startswith(f"## [{version}] - ") for h in headings)
