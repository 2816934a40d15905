"""verify_datasets: presence and checksums of file-based datasets, without loading them."""

from __future__ import annotations

from pathlib import Path

import pytest
from dataset_writers import write_cifar10, write_credit, write_trec

from vflbench.data import DATASETS, DatasetStatus, verify_datasets
from vflbench.data.files import ENV_VAR
from vflbench.errors import DataError, VFLBenchError


def _by_name(statuses: list[DatasetStatus]) -> dict[str, DatasetStatus]:
    return {s.name: s for s in statuses}


def test_verify_reports_each_status(tmp_path: Path) -> None:
    write_cifar10(tmp_path / "cifar-10-batches-py", per_batch=1)
    write_trec(tmp_path / "trec", ["HUM:ind Who ?"], ["HUM:ind Who ?"])
    statuses = _by_name(verify_datasets(tmp_path))
    assert "csv" not in statuses  # generic loader: its file is an option
    assert set(statuses) == {e.name for e in DATASETS if not e.info.get("generic")}
    assert statuses["digits"].status == "embedded"
    # cifar10 publishes no per-file checksums: present, but not verified, and the message names each file
    assert statuses["cifar10"].status == "unverified"
    assert (
        "no published checksum for data_batch_1, data_batch_2, data_batch_3, data_batch_4, data_batch_5, "
        "test_batch, so only their presence was checked"
    ) in statuses["cifar10"].message
    assert statuses["trec"].status == "corrupt"
    assert "sha256" in statuses["trec"].message and "train_5500.label" in statuses["trec"].message
    credit = statuses["credit_default"]
    assert credit.status == "missing"
    assert "UCI_Credit_Card.csv" in credit.message and str(tmp_path) in credit.message
    assert statuses["cifar100"].status == "missing"


def test_verify_selected_names(tmp_path: Path) -> None:
    write_credit(tmp_path / "uci_credit_default" / "UCI_Credit_Card.csv")
    statuses = verify_datasets(tmp_path, ["credit_default", "wine"])
    assert [(s.name, s.status) for s in statuses] == [("credit_default", "corrupt"), ("wine", "embedded")]
    with pytest.raises(DataError, match="no fixed files"):
        verify_datasets(tmp_path, ["csv"])
    with pytest.raises(VFLBenchError, match="valid dataset names"):
        verify_datasets(tmp_path, ["imagenet"])


def test_verify_without_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    status = _by_name(verify_datasets(None, ["mnist"]))["mnist"]
    assert status.status == "missing" and "no datasets root" in status.message
    write_cifar10(tmp_path / "cifar-10-batches-py", per_batch=1)
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert verify_datasets(None, ["cifar10"])[0].status == "unverified"


def test_verify_covers_every_file_based_loader() -> None:
    for entry in DATASETS:
        if entry.info.get("generic") or not entry.info.get("files"):
            continue
        assert entry.info.get("folder"), entry.name
        for key in ("md5", "sha256"):
            assert set(entry.info.get(key) or {}) <= set(entry.info["files"]), (entry.name, key)


def test_verify_names_each_missing_file_once(tmp_path: Path) -> None:
    """The message listed the missing files, then every expected file again."""
    write_cifar10(tmp_path / "cifar-10-batches-py", per_batch=1)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    status = verify_datasets(tmp_path, ["cifar10"])[0]
    assert status.status == "missing"
    assert status.message.startswith(
        f"missing data_batch_3 in {tmp_path / 'cifar-10-batches-py'}/ (present: "
        "data_batch_1, data_batch_2, data_batch_4, data_batch_5, test_batch)"
    )
    assert all(status.message.count(f) == 1 for f in ("data_batch_1", "data_batch_3", "test_batch"))
    mnist = verify_datasets(tmp_path, ["mnist"])[0].message
    assert mnist.count("train-images-idx3-ubyte.gz") == 1 and str(tmp_path / "mnist") in mnist


def test_cli_verify_exits_non_zero_for_a_named_dataset_that_is_missing(tmp_path: Path, cli) -> None:
    """`datasets verify mnist` on a missing dataset exited 0."""
    proc = cli("datasets", "verify", "--data-root", str(tmp_path), "mnist")
    assert proc.returncode == 1 and "missing" in proc.stdout
    assert "error: mnist is missing" in proc.stderr
    write_cifar10(tmp_path / "cifar-10-batches-py", per_batch=1)
    proc = cli("datasets", "verify", "--data-root", str(tmp_path), "cifar10", "wine")
    assert proc.returncode == 0 and "unverified" in proc.stdout
    # without names, the datasets not downloaded are listed as missing and the check passes
    assert cli("datasets", "verify", "--data-root", str(tmp_path)).returncode == 0
