"""Shared fixtures: tiny configs and the location of the real datasets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vflbench.protocol.hooks import PartyHook

SHARED_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"
SRC = Path(__file__).resolve().parents[1] / "src"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child Python process that runs this checkout's vflbench: this process's own (its
    ``PYTHONPATH`` too, where the dependencies may be installed, as on the lent GPU machine; its
    ``VFLBENCH_DEVICE``), with this checkout's ``src`` first on the path and one OpenMP thread, and ``extra``."""
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}


def datasets_root() -> Path | None:
    """The real datasets folder, if this machine has it."""
    env = os.environ.get("VFLBENCH_DATA")
    for candidate in (Path(env) if env else None, SHARED_DATASETS):
        if candidate is not None and candidate.is_dir():
            return candidate
    return None


@pytest.fixture
def real_data_root() -> Path:
    """Skip unless the real datasets (../shared/datasets or $VFLBENCH_DATA) are present."""
    root = datasets_root()
    if root is None or not (root / "mnist").is_dir():
        pytest.skip("real datasets not present (../shared/datasets or $VFLBENCH_DATA)")
    return root


def minimal(**sections):
    """The issue's minimal config, with sections replaced or extended."""
    raw = {
        "data": {"name": "digits", "parties": 2},
        "model": {"bottom": "mlp2", "top": "mlp2"},
        "train": {"algorithm": "vhnn", "epochs": 5, "batch_size": 64, "lr": 0.1},
        "defenses": [],
        "attacks": [],
        "seed": 0,
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return raw


@pytest.fixture(autouse=True)
def one_thread():
    """Every test trains in one torch thread, as ``run_experiment`` does (train.threads: 1): on tiny
    models and a shared 2-core machine more threads only slow each operator down."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


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


class Observer(PartyHook):
    """A test's hook at a passive party: ``see(state, gradient)`` after every backward."""

    def __init__(self, see) -> None:
        super().__init__("test")
        self.see = see

    def after_backward(self, state, gradient) -> None:
        self.see(state, gradient)
