"""File-based loaders on small files written in the exact published formats."""

from __future__ import annotations

import math
import pickle
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from dataset_writers import (
    BANK_HEADER,
    RT_IOT_COLUMNS,
    write_cifar10,
    write_cifar_batch,
    write_credit,
    write_trec,
)

from vflbench.data import load_dataset, partition
from vflbench.data.files import require_files, sha256sum
from vflbench.data.text import tokenize
from vflbench.errors import DataError


def _assert_missing(exc: pytest.ExceptionInfo[DataError], root: Path, *names: str) -> None:
    message = str(exc.value)
    assert str(root) in message
    for name in names:
        assert name in message


# --------------------------------------------------------------------------- files.py


def test_require_files_sha256(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_bytes(b"abc")
    good = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert sha256sum(tmp_path / "d" / "a.txt") == good
    assert require_files("x", tmp_path, "d", ["a.txt"], sha256={"a.txt": good}) == tmp_path / "d"
    with pytest.raises(DataError, match="sha256") as exc:
        require_files("x", tmp_path, "d", ["a.txt"], sha256={"a.txt": "0" * 64})
    _assert_missing(exc, tmp_path, "a.txt", "expected " + "0" * 64)


def test_require_files_without_root() -> None:
    with pytest.raises(DataError, match="no datasets root") as exc:
        require_files("x", None, "d", ["a.txt"])
    assert "<root>/d/" in str(exc.value) and "VFLBENCH_DATA" in str(exc.value)


# --------------------------------------------------------------------------- CIFAR


def _scaled(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images.astype(np.float32) / 255.0)


@pytest.mark.parametrize("legacy", [True, False])
def test_cifar10(tmp_path: Path, legacy: bool) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    x, y = write_cifar10(folder) if legacy else (None, None)
    if not legacy:  # files pickled by a current numpy (numpy._core names) load too
        folder.mkdir()
        rng = np.random.default_rng(2)
        xs, ys = [], []
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            xb, yb = rng.integers(0, 256, (2, 3, 32, 32), dtype=np.uint8), [1, 2]
            write_cifar_batch(folder / name, xb, yb, label_key=b"labels", legacy_numpy_name=False)
            xs.append(xb)
            ys.append(yb)
        x, y = np.concatenate(xs), np.concatenate(ys)
    ds = load_dataset("cifar10", root=tmp_path)
    n_test = len(x) // 6
    assert ds.kind == "image" and ds.num_classes == 10
    assert ds.x_train.shape == (5 * n_test, 3, 32, 32) and ds.x_test.shape == (n_test, 3, 32, 32)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert float(ds.x_train.min()) >= 0.0 and float(ds.x_train.max()) <= 1.0
    assert torch.equal(ds.x_train, _scaled(x[:-n_test])) and torch.equal(ds.x_test, _scaled(x[-n_test:]))
    assert ds.y_train.tolist() == list(y[:-n_test]) and ds.y_test.tolist() == list(y[-n_test:])


def test_cifar_rows_are_channel_major(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar10(folder, per_batch=1)
    row = np.zeros(3072, dtype=np.uint8)
    row[:1024], row[1024:2048], row[2048:] = 10, 20, 30  # R, G, B planes
    row[1] = 255  # red, row 0, column 1
    row[1024 + 32] = 255  # green, row 1, column 0
    write_cifar_batch(folder / "test_batch", row[None], [7], label_key=b"labels")
    ds = load_dataset("cifar10", root=tmp_path)
    img = ds.x_test[0]
    assert img[0, 0, 0] == pytest.approx(10 / 255) and img[0, 0, 1] == 1.0
    assert img[1, 1, 0] == 1.0 and img[1, 0, 0] == pytest.approx(20 / 255)
    assert img[2, 5, 5] == pytest.approx(30 / 255)
    assert ds.y_test.tolist() == [7]


def test_cifar100_fine_labels(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    rng = np.random.default_rng(3)
    x_tr = rng.integers(0, 256, (6, 3, 32, 32), dtype=np.uint8)
    x_te = rng.integers(0, 256, (2, 3, 32, 32), dtype=np.uint8)
    write_cifar_batch(folder / "train", x_tr, [0, 99, 42, 5, 6, 7], label_key=b"fine_labels")
    write_cifar_batch(folder / "test", x_te, [98, 1], label_key=b"fine_labels")
    ds = load_dataset("cifar100", root=tmp_path)
    assert ds.num_classes == 100 and ds.x_train.shape == (6, 3, 32, 32)
    assert ds.y_train.tolist() == [0, 99, 42, 5, 6, 7] and ds.y_test.tolist() == [98, 1]
    assert torch.equal(ds.x_test, _scaled(x_te))


def test_cifar_missing_file(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar10(folder, per_batch=1)
    (folder / "test_batch").unlink()
    with pytest.raises(DataError, match="missing test_batch") as exc:
        load_dataset("cifar10", root=tmp_path)
    _assert_missing(exc, tmp_path, "cifar-10-batches-py", "data_batch_1", "data_batch_5")
    with pytest.raises(DataError) as exc:
        load_dataset("cifar100", root=tmp_path)
    _assert_missing(exc, tmp_path, "cifar-100-python", "train", "test")


def test_cifar_refuses_foreign_pickles(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar10(folder, per_batch=1)
    (folder / "data_batch_2").write_bytes(pickle.dumps({b"data": print, b"labels": [1]}))
    with pytest.raises(DataError, match="not allowed"):
        load_dataset("cifar10", root=tmp_path)
    (folder / "data_batch_2").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="data_batch_2"):
        load_dataset("cifar10", root=tmp_path)
    write_cifar_batch(folder / "data_batch_2", np.zeros((1, 3, 32, 32), np.uint8), [1], label_key=b"fine_labels")
    with pytest.raises(DataError, match="b'labels'"):
        load_dataset("cifar10", root=tmp_path)


# --------------------------------------------------------------------------- credit default


def test_credit_default(tmp_path: Path) -> None:
    rows = write_credit(tmp_path / "uci_credit_default" / "UCI_Credit_Card.csv", n=20, positives=5)
    ds = load_dataset("credit_default", root=tmp_path, verify=False)
    assert ds.kind == "tabular" and ds.num_classes == 2
    assert ds.x_train.shape == (16, 23) and ds.x_test.shape == (4, 23)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert ds.feature_names[0] == "LIMIT_BAL" and ds.feature_names[-1] == "PAY_AMT6"
    assert len(ds.feature_names) == 23 and "ID" not in ds.feature_names
    assert int(ds.y_train.sum()) == 4 and int(ds.y_test.sum()) == 1  # stratified
    by_key = {int(r[1]): r for r in rows}
    for x, y in zip(torch.cat([ds.x_train, ds.x_test]), torch.cat([ds.y_train, ds.y_test]), strict=True):
        row = by_key[int(x[0])]
        assert x.tolist() == row[1:24].astype(float).tolist() and int(y) == row[24]
    again = load_dataset("credit_default", root=tmp_path, verify=False)
    assert torch.equal(again.x_train, ds.x_train)  # fixed split seed
    other = load_dataset("credit_default", root=tmp_path, verify=False, test_fraction=0.5)
    assert len(other.y_test) == 10


def test_credit_default_checksum_and_layout(tmp_path: Path) -> None:
    path = tmp_path / "uci_credit_default" / "UCI_Credit_Card.csv"
    write_credit(path)
    with pytest.raises(DataError, match="corrupt or a different version: sha256") as exc:
        load_dataset("credit_default", root=tmp_path)
    _assert_missing(exc, tmp_path, "UCI_Credit_Card.csv", "a0f0ab49d632")
    path.unlink()
    with pytest.raises(DataError, match="missing UCI_Credit_Card.csv") as exc:
        load_dataset("credit_default", root=tmp_path)
    _assert_missing(exc, tmp_path, "uci_credit_default")
    path.write_text("ID,LIMIT_BAL,y\n1,2,0\n")
    with pytest.raises(DataError, match="expected exactly"):
        load_dataset("credit_default", root=tmp_path, verify=False)


# --------------------------------------------------------------------------- bank marketing

_JOBS = ["management", "technician", "entrepreneur", "blue-collar", "unknown", "admin."]
_MONTHS = ["may", "jun", "jul", "aug", "oct", "nov", "dec", "jan", "feb", "mar", "apr", "sep"]


def _write_bank(root: Path, n: int = 24) -> list[list[object]]:
    rows = []
    for i in range(n):
        rows.append(
            [
                30 + i,
                _JOBS[i % 6],
                ["married", "single", "divorced"][i % 3],
                ["tertiary", "secondary", "unknown", "primary"][i % 4],
                ["no", "yes"][i % 5 == 0],
                1000 + i,
                ["yes", "no"][i % 2],
                "no",
                ["unknown", "cellular", "telephone"][i % 3],
                1 + i % 28,
                _MONTHS[i % 12],
                100 + i,
                1 + i % 3,
                -1 if i % 2 else 90,
                i % 4,
                ["unknown", "failure", "other", "success"][i % 4],
                ["no", "yes"][i % 3 == 0],
            ]
        )
    lines = [BANK_HEADER]
    for r in rows:
        lines.append(";".join(f'"{v}"' if isinstance(v, str) else str(v) for v in r))
    folder = root / "bank_marketing"
    folder.mkdir(parents=True)
    (folder / "bank-full.csv").write_text("\n".join(lines) + "\n")
    return rows


def test_bank_marketing(tmp_path: Path) -> None:
    rows = _write_bank(tmp_path)
    ds = load_dataset("bank_marketing", root=tmp_path)
    assert ds.x_train.shape == (19, 16) and ds.x_test.shape == (5, 16)
    assert ds.x_train.dtype == torch.float32 and ds.num_classes == 2
    assert ds.feature_names == (
        "age",
        "job",
        "marital",
        "education",
        "default",
        "balance",
        "housing",
        "loan",
        "contact",
        "day",
        "month",
        "duration",
        "campaign",
        "pdays",
        "previous",
        "poutcome",
    )
    cats = ds.meta["categories"]
    assert set(cats) == {"job", "marital", "education", "default", "housing", "loan", "contact", "month", "poutcome"}
    assert cats["job"] == tuple(sorted(_JOBS)) and cats["month"][0] == "apr"
    assert cats["default"] == ("no", "yes")
    by_balance = {r[5]: r for r in rows}
    names = ds.feature_names
    for x, y in zip(torch.cat([ds.x_train, ds.x_test]), torch.cat([ds.y_train, ds.y_test]), strict=True):
        row = by_balance[int(x[5])]
        for j, name in enumerate(names):
            want = cats[name].index(row[j]) if name in cats else row[j]
            assert x[j].item() == want, name
        assert int(y) == (row[16] == "yes")


def test_bank_marketing_bad_label(tmp_path: Path) -> None:
    _write_bank(tmp_path)
    path = tmp_path / "bank_marketing" / "bank-full.csv"
    path.write_text(path.read_text().replace('"yes"\n', '"maybe"\n', 1))
    with pytest.raises(DataError, match="'yes' or 'no'"):
        load_dataset("bank_marketing", root=tmp_path)
    path.unlink()
    with pytest.raises(DataError, match="missing bank-full.csv") as exc:
        load_dataset("bank_marketing", root=tmp_path)
    _assert_missing(exc, tmp_path, "bank_marketing")


# --------------------------------------------------------------------------- RT-IoT2022

_ATTACKS = ["MQTT_Publish", "DOS_SYN_Hping", "ARP_poisioning", "Thing_Speak"]


def _write_rt_iot(root: Path, n: int = 20, columns: list[str] | None = None) -> None:
    columns = RT_IOT_COLUMNS if columns is None else columns
    lines = ["," + ",".join(columns) + ",Attack_type"]
    for i in range(n):
        values = []
        for j, col in enumerate(columns):
            if col == "proto":
                values.append(["tcp", "udp", "icmp"][i % 3])
            elif col == "service":
                values.append(["mqtt", "-", "dns", "http"][i % 4])
            elif col == "id.orig_p":
                values.append(str(40000 + i))  # a unique row key
            else:
                values.append(f"{(i * 7 + j) % 13 * 0.5}")
        lines.append(f"{i}," + ",".join(values) + "," + _ATTACKS[i % 4])
    folder = root / "rt_iot2022"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "RT_IOT2022.csv").write_text("\n".join(lines) + "\n")


def test_rt_iot2022(tmp_path: Path) -> None:
    _write_rt_iot(tmp_path)
    ds = load_dataset("rt_iot2022", root=tmp_path)
    assert ds.x_train.shape == (16, 83) and ds.x_test.shape == (4, 83)
    assert ds.x_train.dtype == torch.float32 and ds.num_classes == 4
    assert ds.feature_names == tuple(RT_IOT_COLUMNS)
    assert ds.meta["classes"] == ("ARP_poisioning", "DOS_SYN_Hping", "MQTT_Publish", "Thing_Speak")
    assert ds.meta["categories"] == {"proto": ("icmp", "tcp", "udp"), "service": ("-", "dns", "http", "mqtt")}
    proto, service = RT_IOT_COLUMNS.index("proto"), RT_IOT_COLUMNS.index("service")
    for x, y in zip(torch.cat([ds.x_train, ds.x_test]), torch.cat([ds.y_train, ds.y_test]), strict=True):
        i = int(x[0]) - 40000
        assert ds.meta["classes"][int(y)] == _ATTACKS[i % 4]
        assert ds.meta["categories"]["proto"][int(x[proto])] == ["tcp", "udp", "icmp"][i % 3]
        assert ds.meta["categories"]["service"][int(x[service])] == ["mqtt", "-", "dns", "http"][i % 4]
        assert x[4].item() == pytest.approx((i * 7 + 4) % 13 * 0.5)  # flow_duration


def test_rt_iot2022_layout_errors(tmp_path: Path) -> None:
    _write_rt_iot(tmp_path, columns=RT_IOT_COLUMNS[:-1])
    with pytest.raises(DataError, match="82 feature columns.*83"):
        load_dataset("rt_iot2022", root=tmp_path)
    (tmp_path / "rt_iot2022" / "RT_IOT2022.csv").write_text(",a,b\n0,1,2\n")
    with pytest.raises(DataError, match="no label column 'Attack_type'"):
        load_dataset("rt_iot2022", root=tmp_path)


# --------------------------------------------------------------------------- Criteo


def _criteo_lines(n: int = 30) -> list[list[str]]:
    rng = np.random.default_rng(4)
    rows = []
    for i in range(n):
        ints = [str(int(v)) for v in rng.integers(-3, 500, size=13)]
        ints[0] = str(i)  # I1 is a row key
        ints[1 + i % 12] = "" if i % 3 == 0 else ints[1 + i % 12]
        cats = [f"{int(v):08x}" for v in rng.integers(0, 2**32, size=26)]
        cats[i % 26] = "" if i % 2 == 0 else cats[i % 26]
        rows.append([str(int(i % 4 == 0))] + ints + cats)
    return rows


def _write_criteo(root: Path, rows: list[list[str]]) -> None:
    folder = root / "criteo"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dac_sample.txt").write_text("".join("\t".join(r) + "\n" for r in rows))


def test_criteo(tmp_path: Path) -> None:
    rows = _criteo_lines()
    rows[5][-1] = ""  # a missing last field leaves a trailing tab
    _write_criteo(tmp_path, rows)
    ds = load_dataset("criteo", root=tmp_path, hash_buckets=50)
    assert ds.x_train.shape == (24, 39) and ds.x_test.shape == (6, 39)
    assert ds.x_train.dtype == torch.float32 and ds.num_classes == 2
    assert ds.meta["categorical"] == tuple(range(13, 39))
    assert ds.meta["cardinalities"] == (51,) * 26
    assert ds.feature_names[:2] == ("I1", "I2") and ds.feature_names[13] == "C1"
    x_all = torch.cat([ds.x_train, ds.x_test])
    y_all = torch.cat([ds.y_train, ds.y_test])
    assert float(x_all[:, 13:].min()) >= 0 and float(x_all[:, 13:].max()) <= 50
    for x, y in zip(x_all, y_all, strict=True):
        i = round(math.expm1(float(x[0])))
        row = rows[i]
        assert int(y) == int(row[0])
        for j in range(13):
            raw = int(row[1 + j]) if row[1 + j] else 0
            assert x[j].item() == pytest.approx(math.log1p(max(raw, 0)), rel=1e-6)
        for j in range(26):
            value = row[14 + j]
            want = 0 if value == "" else 1 + zlib.crc32(value.encode()) % 50
            assert int(x[13 + j]) == want


def test_criteo_options_and_partition(tmp_path: Path) -> None:
    _write_criteo(tmp_path, _criteo_lines(40))
    ds = load_dataset("criteo", root=tmp_path, max_rows=20)
    assert len(ds.y_train) + len(ds.y_test) == 20
    assert ds.meta["cardinalities"][0] == 1001
    vd = partition(ds, parties=2, active_has_features=True)
    active = vd.active
    assert active is not None and active.columns == tuple(range(20, 39))  # 20 + 19 columns
    assert active.meta["categorical"] == tuple(range(19)) and active.meta["cardinalities"][0] == 1001
    assert torch.equal(active.x_train, ds.x_train[:, 20:39])  # codes are never standardised
    assert vd.passive[0].meta["categorical"] == tuple(range(13, 20))
    with pytest.raises(DataError, match="hash_buckets"):
        load_dataset("criteo", root=tmp_path, hash_buckets=0)
    with pytest.raises(DataError, match="max_rows"):
        load_dataset("criteo", root=tmp_path, max_rows=0)


def test_criteo_bad_lines(tmp_path: Path) -> None:
    rows = _criteo_lines(10)
    rows[3] = rows[3][:20]
    _write_criteo(tmp_path, rows)
    with pytest.raises(DataError, match="line 4: expected 40 tab-separated fields"):
        load_dataset("criteo", root=tmp_path)
    rows = _criteo_lines(10)
    rows[2][4] = "abc"
    _write_criteo(tmp_path, rows)
    with pytest.raises(DataError, match="I4"):
        load_dataset("criteo", root=tmp_path)
    (tmp_path / "criteo" / "dac_sample.txt").unlink()
    with pytest.raises(DataError, match="missing dac_sample.txt") as exc:
        load_dataset("criteo", root=tmp_path)
    _assert_missing(exc, tmp_path, "criteo")


# --------------------------------------------------------------------------- generic CSV


def _write_csv(path: Path, sep: str = ",") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [sep.join(["id", "colour", "size", "kind"])]
    for i in range(20):
        lines.append(sep.join([str(i), ["red", "blue", "green"][i % 3], f"{i * 0.5}", ["cat", "dog"][i % 2]]))
    path.write_text("\n".join(lines) + "\n")


def test_csv(tmp_path: Path) -> None:
    _write_csv(tmp_path / "mine" / "pets.csv")
    ds = load_dataset("csv", root=tmp_path, path="mine/pets.csv", label="kind")
    assert ds.x_train.shape == (16, 3) and ds.x_test.shape == (4, 3)
    assert ds.feature_names == ("id", "colour", "size") and ds.num_classes == 2
    assert ds.meta["classes"] == ("cat", "dog")
    assert ds.meta["categories"] == {"colour": ("blue", "green", "red")}
    for x, y in zip(torch.cat([ds.x_train, ds.x_test]), torch.cat([ds.y_train, ds.y_test]), strict=True):
        i = int(x[0])
        assert ds.meta["categories"]["colour"][int(x[1])] == ["red", "blue", "green"][i % 3]
        assert x[2].item() == i * 0.5 and int(y) == i % 2
    sub = load_dataset("csv", root=tmp_path, path=str(tmp_path / "mine" / "pets.csv"), label="kind", features=["size"])
    assert sub.feature_names == ("size",) and sub.x_train.shape == (16, 1)


def test_csv_separator_and_errors(tmp_path: Path) -> None:
    _write_csv(tmp_path / "pets.csv", sep=";")
    ds = load_dataset("csv", root=tmp_path, path="pets.csv", label="kind", sep=";", test_fraction=0.5)
    assert ds.x_train.shape == (10, 3)
    with pytest.raises(DataError, match=r"no label column 'species'.*\['id', 'colour', 'size', 'kind'\]"):
        load_dataset("csv", root=tmp_path, path="pets.csv", label="species", sep=";")
    with pytest.raises(DataError, match="no columns \\['weight'\\]"):
        load_dataset("csv", root=tmp_path, path="pets.csv", label="kind", sep=";", features=["weight"])
    with pytest.raises(DataError, match="needs the options path"):
        load_dataset("csv", root=tmp_path)
    with pytest.raises(DataError, match="no file") as exc:
        load_dataset("csv", root=tmp_path, path="nope.csv", label="kind")
    assert str(tmp_path) in str(exc.value)
    with pytest.raises(DataError, match="valid options are"):
        load_dataset("csv", root=tmp_path, path="pets.csv", label="kind", delimiter=";")


def test_csv_missing_numeric_values(tmp_path: Path) -> None:
    (tmp_path / "gaps.csv").write_text("a,b,y\n1,,0\n2,3,1\n4,5,0\n6,7,1\n")
    with pytest.raises(DataError, match="missing or non-finite values in the numeric columns b"):
        load_dataset("csv", root=tmp_path, path="gaps.csv", label="y")


# --------------------------------------------------------------------------- TREC

_TREC_TRAIN = [
    "DESC:manner How did serfdom develop in and then leave Russia ?",
    "ENTY:cremat What films featured the character Popeye Doyle ?",
    "HUM:ind Who was the café owner in Casablanca ?",
    "NUM:date When did Popeye first appear ?",
    "LOC:city What city is the capital of Russia ?",
    "ABBR:exp What does NASA stand for ?",
    "HUM:desc Who was Galileo ?",
]
_TREC_TEST = [
    "NUM:dist How far is it from Denver to Aspen ?",
    "HUM:desc Who was Popeye ?",
]


def test_trec(tmp_path: Path) -> None:
    write_trec(tmp_path / "trec", _TREC_TRAIN, _TREC_TEST)
    ds = load_dataset("trec", root=tmp_path, verify=False)
    assert ds.kind == "text" and ds.num_classes == 6
    assert ds.meta["classes"] == ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
    assert ds.y_train.tolist() == [1, 2, 3, 5, 4, 0, 3] and ds.y_test.tolist() == [5, 3]
    assert ds.x_train.shape == (7, 32) and ds.x_test.shape == (2, 32)
    assert ds.x_train.dtype == torch.int64
    vocab = ds.meta["vocab"]
    assert vocab[:2] == ("<pad>", "<unk>") and ds.meta["vocab_size"] == len(vocab)
    assert "café" in vocab  # latin-1 decoded, letters kept
    assert "denver" not in vocab and "aspen" not in vocab  # test words are not in the vocabulary
    index = {t: i for i, t in enumerate(vocab)}
    first = ["how", "far", "is", "it", "from", "denver", "to", "aspen"]
    assert ds.x_test[0, :8].tolist() == [index.get(t, 1) for t in first]
    assert ds.x_test[0, 8:].eq(0).all()
    assert ds.x_test[0, 5].item() == 1  # unknown
    assert vocab[2:4] == ("the", "what")  # most frequent first, ties alphabetical
    counts = [sum(tokenize(q.split(" ", 1)[1]).count(t) for q in _TREC_TRAIN) for t in vocab[2:]]
    assert counts == sorted(counts, reverse=True)


def test_trec_options(tmp_path: Path) -> None:
    write_trec(tmp_path / "trec", _TREC_TRAIN, ["HUM:desc Who was Popeye ?"])
    fine = load_dataset("trec", root=tmp_path, verify=False, labels="fine", max_len=4, min_freq=2)
    assert fine.num_classes == 7 and fine.meta["classes"][0] == "ABBR:exp"
    assert fine.meta["classes"][fine.y_test.item()] == "HUM:desc"
    assert fine.x_train.shape == (7, 4) and fine.x_test.shape == (1, 4)
    assert set(fine.meta["vocab"][2:]) == {"what", "who", "was", "the", "popeye", "russia", "did", "in"}
    with pytest.raises(DataError, match="'labels' = 'medium' is not valid; expected one of 'coarse', 'fine'"):
        load_dataset("trec", root=tmp_path, verify=False, labels="medium")
    with pytest.raises(DataError, match="max_len"):
        load_dataset("trec", root=tmp_path, verify=False, max_len=0)


def test_trec_fine_label_unseen_in_train(tmp_path: Path) -> None:
    write_trec(tmp_path / "trec", _TREC_TRAIN, _TREC_TEST)
    with pytest.raises(DataError, match="NUM:dist"):
        load_dataset("trec", root=tmp_path, verify=False, labels="fine")


def test_trec_checksum_and_format(tmp_path: Path) -> None:
    write_trec(tmp_path / "trec", _TREC_TRAIN, _TREC_TEST)
    with pytest.raises(DataError, match="sha256") as exc:
        load_dataset("trec", root=tmp_path)
    _assert_missing(exc, tmp_path, "train_5500.label", "TREC_10.label")
    (tmp_path / "trec" / "TREC_10.label").unlink()
    with pytest.raises(DataError, match="missing TREC_10.label") as exc:
        load_dataset("trec", root=tmp_path)
    _assert_missing(exc, tmp_path, "train_5500.label")
    write_trec(tmp_path / "trec", _TREC_TRAIN, ["what is this"])
    with pytest.raises(DataError, match="line 1"):
        load_dataset("trec", root=tmp_path, verify=False)


def test_tokenize() -> None:
    assert tokenize("Who's the U.S. café-owner_1 ?") == ["who", "s", "the", "u", "s", "café", "owner", "1"]


# --------------------------------------------------------------------------- AG News


def _write_ag_news(root: Path) -> None:
    folder = root / "ag_news"
    folder.mkdir(parents=True)
    train = [
        '"3","Wall St. Bears Claw Back Into the Black (Reuters)","Reuters - Short-sellers, '
        "Wall Street's dwindling\\band of ultra-cynics, are seeing green again.\"",
        '"2","Phelps wins ""gold"" again","ATHENS - Michael Phelps won, again."',
        '"1","Talks resume","Diplomats met in Geneva on Monday."',
        '"4","New chip","A faster chip, says Intel."',
    ]
    test = ['"4","Intel unveils chip","Geneva welcomes Intel\'s new chip."']
    (folder / "train.csv").write_text("\n".join(train) + "\n")
    (folder / "test.csv").write_text("\n".join(test) + "\n")


def test_ag_news(tmp_path: Path) -> None:
    _write_ag_news(tmp_path)
    ds = load_dataset("ag_news", root=tmp_path)
    assert ds.kind == "text" and ds.num_classes == 4
    assert ds.meta["classes"] == ("World", "Sports", "Business", "Sci/Tech")
    assert ds.y_train.tolist() == [2, 1, 0, 3] and ds.y_test.tolist() == [3]
    assert ds.x_train.shape == (4, 64) and ds.x_test.dtype == torch.int64
    vocab = ds.meta["vocab"]
    index = {t: i for i, t in enumerate(vocab)}
    # title + " " + description, quotes unescaped, backslash splits tokens
    assert {"gold", "phelps", "dwindling", "band", "geneva"} <= set(vocab)
    assert "unveils" not in vocab and "welcomes" not in vocab
    words = ["intel", "unveils", "chip", "geneva", "welcomes", "intel", "s", "new", "chip"]
    assert ds.x_test[0, :9].tolist() == [index.get(t, 1) for t in words]
    assert ds.x_test[0, 9:].eq(0).all()
    short = load_dataset("ag_news", root=tmp_path, max_rows=2, max_len=5)
    assert short.x_train.shape == (2, 5) and short.y_train.tolist() == [2, 1]


def test_ag_news_errors(tmp_path: Path) -> None:
    _write_ag_news(tmp_path)
    (tmp_path / "ag_news" / "test.csv").write_text('"5","x","y"\n')
    with pytest.raises(DataError, match="class index must be 1-4"):
        load_dataset("ag_news", root=tmp_path)
    (tmp_path / "ag_news" / "test.csv").unlink()
    with pytest.raises(DataError, match="missing test.csv") as exc:
        load_dataset("ag_news", root=tmp_path)
    _assert_missing(exc, tmp_path, "train.csv", "ag_news")


def test_text_partition_keeps_vocab_size(tmp_path: Path) -> None:
    write_trec(tmp_path / "trec", _TREC_TRAIN, _TREC_TEST)
    ds = load_dataset("trec", root=tmp_path, verify=False)
    vd = partition(ds, parties=2, active_has_features=False)
    assert vd.passive[0].meta["vocab_size"] == ds.meta["vocab_size"]
