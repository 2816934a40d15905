"""Loaders on the real files in ../shared/datasets (or $VFLBENCH_DATA); skipped when absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from vflbench.data import Dataset, load_dataset, verify_datasets
from vflbench.data.files import ENV_VAR

pytestmark = pytest.mark.data


def _data_root() -> Path:
    """$VFLBENCH_DATA when it is a folder, else ../shared/datasets beside the checkout."""
    env = os.environ.get(ENV_VAR)
    if env and Path(env).is_dir():
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "datasets"


ROOT = _data_root()


def _need(folder: str) -> None:
    if not (ROOT / folder).is_dir():
        pytest.skip(f"{ROOT / folder} is absent (set ${ENV_VAR} to the shared datasets folder)")


@pytest.fixture(scope="module")
def mnist() -> Dataset:
    _need("mnist")
    return load_dataset("mnist", root=ROOT)


@pytest.mark.slow
def test_mnist(mnist: Dataset) -> None:
    assert mnist.x_train.shape == (60000, 1, 28, 28) and mnist.x_test.shape == (10000, 1, 28, 28)
    assert mnist.x_train.dtype == torch.float32 and mnist.y_train.dtype == torch.int64
    assert mnist.x_train.mean().item() == pytest.approx(0.1307, abs=1e-4)
    assert mnist.x_train.std().item() == pytest.approx(0.3081, abs=1e-4)
    assert sorted(mnist.y_train.unique().tolist()) == list(range(10))


def test_credit_default_real() -> None:
    _need("uci_credit_default")
    ds = load_dataset("credit_default", root=ROOT)
    assert len(ds.y_train) + len(ds.y_test) == 30000
    assert ds.x_train.shape[1] == 23 and len(ds.y_test) == 6000
    assert int(ds.y_train.sum() + ds.y_test.sum()) == 6636
    assert int(ds.y_test.sum()) == round(6636 * 0.2)  # stratified
    assert ds.feature_names[0] == "LIMIT_BAL" and ds.feature_names[-1] == "PAY_AMT6"


def test_trec_real() -> None:
    _need("trec")
    ds = load_dataset("trec", root=ROOT)
    assert ds.x_train.shape == (5452, 32) and ds.x_test.shape == (500, 32)
    assert ds.num_classes == 6 and ds.meta["classes"] == ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
    assert sorted(ds.y_test.unique().tolist()) == list(range(6))
    assert ds.meta["vocab_size"] > 5000
    fine = load_dataset("trec", root=ROOT, labels="fine")
    assert fine.num_classes == 50


def test_verify_real() -> None:
    present = [
        n
        for n, folder in (("mnist", "mnist"), ("credit_default", "uci_credit_default"), ("trec", "trec"))
        if (ROOT / folder).is_dir()
    ]
    if not present:
        pytest.skip(f"no shared datasets under {ROOT}")
    statuses = verify_datasets(ROOT, present)
    assert [s.status for s in statuses] == ["ok"] * len(present), statuses
