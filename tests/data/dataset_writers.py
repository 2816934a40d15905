"""Writers of small files in the exact published formats of the file-based datasets."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np

RT_IOT_COLUMNS = (
    "id.orig_p,id.resp_p,proto,service,flow_duration,fwd_pkts_tot,bwd_pkts_tot,fwd_data_pkts_tot,"
    "bwd_data_pkts_tot,fwd_pkts_per_sec,bwd_pkts_per_sec,flow_pkts_per_sec,down_up_ratio,"
    "fwd_header_size_tot,fwd_header_size_min,fwd_header_size_max,bwd_header_size_tot,"
    "bwd_header_size_min,bwd_header_size_max,flow_FIN_flag_count,flow_SYN_flag_count,"
    "flow_RST_flag_count,fwd_PSH_flag_count,bwd_PSH_flag_count,flow_ACK_flag_count,"
    "fwd_URG_flag_count,bwd_URG_flag_count,flow_CWR_flag_count,flow_ECE_flag_count,"
    "fwd_pkts_payload.min,fwd_pkts_payload.max,fwd_pkts_payload.tot,fwd_pkts_payload.avg,"
    "fwd_pkts_payload.std,bwd_pkts_payload.min,bwd_pkts_payload.max,bwd_pkts_payload.tot,"
    "bwd_pkts_payload.avg,bwd_pkts_payload.std,flow_pkts_payload.min,flow_pkts_payload.max,"
    "flow_pkts_payload.tot,flow_pkts_payload.avg,flow_pkts_payload.std,fwd_iat.min,fwd_iat.max,"
    "fwd_iat.tot,fwd_iat.avg,fwd_iat.std,bwd_iat.min,bwd_iat.max,bwd_iat.tot,bwd_iat.avg,"
    "bwd_iat.std,flow_iat.min,flow_iat.max,flow_iat.tot,flow_iat.avg,flow_iat.std,"
    "payload_bytes_per_second,fwd_subflow_pkts,bwd_subflow_pkts,fwd_subflow_bytes,"
    "bwd_subflow_bytes,fwd_bulk_bytes,bwd_bulk_bytes,fwd_bulk_packets,bwd_bulk_packets,"
    "fwd_bulk_rate,bwd_bulk_rate,active.min,active.max,active.tot,active.avg,active.std,idle.min,"
    "idle.max,idle.tot,idle.avg,idle.std,fwd_init_window_size,bwd_init_window_size,"
    "fwd_last_window_size"
).split(",")

CREDIT_HEADER = (
    '"ID","LIMIT_BAL","SEX","EDUCATION","MARRIAGE","AGE","PAY_0","PAY_2","PAY_3","PAY_4","PAY_5",'
    '"PAY_6","BILL_AMT1","BILL_AMT2","BILL_AMT3","BILL_AMT4","BILL_AMT5","BILL_AMT6","PAY_AMT1",'
    '"PAY_AMT2","PAY_AMT3","PAY_AMT4","PAY_AMT5","PAY_AMT6","default.payment.next.month"'
)

BANK_HEADER = (
    '"age";"job";"marital";"education";"default";"balance";"housing";"loan";"contact";'
    '"day";"month";"duration";"campaign";"pdays";"previous";"poutcome";"y"'
)


def write_cifar_batch(
    path: Path, images: np.ndarray, labels: Sequence[int], *, label_key: bytes, legacy_numpy_name: bool = True
) -> None:
    """A CIFAR python pickle: dict with bytes keys, uint8 rows of 3072, a list of labels.

    The published files are Python 2 pickles (protocol 2) that name ``numpy.core.multiarray``;
    ``legacy_numpy_name`` rewrites the global to that name as in the real files.
    """
    batch = {
        b"batch_label": b"testing batch 1 of 1",
        label_key: list(map(int, labels)),
        b"data": images.reshape(len(images), -1).astype(np.uint8),
        b"filenames": [f"img_{i}.png".encode() for i in range(len(images))],
    }
    if label_key == b"fine_labels":
        batch[b"coarse_labels"] = [int(v) // 5 for v in labels]
    blob = pickle.dumps(batch, protocol=2)
    if legacy_numpy_name:
        blob = blob.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
    path.write_bytes(blob)


def write_credit(path: Path, n: int = 20, positives: int = 5) -> np.ndarray:
    """A UCI_Credit_Card.csv with ``n`` rows; returns the (n, 25) integer table written."""
    rng = np.random.default_rng(0)
    rows = rng.integers(-2, 9, size=(n, 25))
    rows[:, 0] = np.arange(1, n + 1)
    rows[:, 1] = 10000 * (np.arange(n) + 1)  # LIMIT_BAL: a unique row key
    rows[:, -1] = 0
    rows[:positives, -1] = 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(CREDIT_HEADER + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return rows


def write_trec(folder: Path, train: Sequence[str], test: Sequence[str]) -> None:
    """TREC ``.label`` files (latin-1 lines ``COARSE:fine question``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train_5500.label").write_bytes(("\n".join(train) + "\n").encode("latin-1"))
    (folder / "TREC_10.label").write_bytes(("\n".join(test) + "\n").encode("latin-1"))


def write_cifar10(folder: Path, per_batch: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The six CIFAR-10 batch files; returns all images (N, 3, 32, 32) and labels, train first."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    images, labels = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = rng.integers(0, 256, size=(per_batch, 3, 32, 32), dtype=np.uint8)
        y = rng.integers(0, 10, size=per_batch)
        write_cifar_batch(folder / name, x, y, label_key=b"labels")
        images.append(x)
        labels.append(y)
    return np.concatenate(images), np.concatenate(labels)
