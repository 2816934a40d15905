"""Image datasets in their published formats: MNIST-style idx files, CIFAR python pickles."""

from __future__ import annotations

import gzip
import importlib
import pickle
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vflbench.data.base import Dataset
from vflbench.data.files import require_files
from vflbench.data.registry import DATASETS
from vflbench.errors import DataError

IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
MNIST_MD5 = dict(
    zip(
        IDX_FILES,
        (
            "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "d53e105ee54ea40749a09fcbcd1e9432",
            "9fb629c4189551a2d022fa330f9573f3",
            "ec29112dd5afa0611ce80d1b7f02629c",
        ),
        strict=True,
    )
)
FASHION_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
}


def read_idx(path: Path) -> np.ndarray:
    """Read a gzipped idx file (the MNIST format): magic, dims, then big-endian data."""
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read()
    except (EOFError, OSError, zlib.error) as exc:  # a truncated or damaged download (gzip.BadGzipFile is an OSError)
        raise DataError(
            f"{path} is truncated or corrupt ({exc}); delete it and fetch it again "
            "(`vflbench datasets verify` checks every file)"
        ) from None
    if len(data) < 4:
        raise DataError(f"{path} is not an idx file (too short)")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise DataError(f"{path} is not an unsigned-byte idx file (magic {data[:4].hex()})")
    shape = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise DataError(f"{path} is truncated: {body.size} values for shape {shape}")
    return body.reshape(shape)


def _idx_dataset(
    name: str, root: Path | None, folder: str, md5: dict[str, str], verify: bool, source: str, flatten: bool
) -> Dataset:
    base = require_files(name, root, folder, IDX_FILES, md5=md5 if verify else None, source=source)
    arrays = [read_idx(base / f) for f in IDX_FILES]
    x_tr, y_tr, x_te, y_te = arrays
    to_x = (
        (lambda a: torch.from_numpy(a.astype(np.float32) / 255.0).reshape(len(a), -1))
        if flatten
        else (lambda a: torch.from_numpy(a.astype(np.float32) / 255.0).unsqueeze(1))
    )
    return Dataset(
        name=name,
        kind="tabular" if flatten else "image",
        x_train=to_x(x_tr),
        y_train=torch.from_numpy(y_tr.astype(np.int64)),
        x_test=to_x(x_te),
        y_test=torch.from_numpy(y_te.astype(np.int64)),
        num_classes=10,
    )


_MNIST_SRC = "http://yann.lecun.com/exdb/mnist/"
_FASHION_SRC = "https://github.com/zalandoresearch/fashion-mnist"


@DATASETS.register(
    "mnist",
    summary="MNIST 28x28 digits (idx .gz), 60k/10k, 10 classes",
    kind="image",
    folder="mnist",
    files=IDX_FILES,
    md5=MNIST_MD5,
    source=_MNIST_SRC,
)
def load_mnist(*, root: Path | None = None, verify: bool = True) -> Dataset:
    """MNIST images (1x28x28, [0, 1])."""
    return _idx_dataset("mnist", root, "mnist", MNIST_MD5, verify, _MNIST_SRC, flatten=False)


@DATASETS.register(
    "fashion_mnist",
    summary="Fashion-MNIST 28x28 (idx .gz), 60k/10k, 10 classes",
    kind="image",
    folder="fashion_mnist",
    files=IDX_FILES,
    md5=FASHION_MD5,
    source=_FASHION_SRC,
)
def load_fashion_mnist(*, root: Path | None = None, verify: bool = True) -> Dataset:
    """Fashion-MNIST images (1x28x28, [0, 1])."""
    return _idx_dataset("fashion_mnist", root, "fashion_mnist", FASHION_MD5, verify, _FASHION_SRC, flatten=False)


@DATASETS.register(
    "tabmnist",
    summary="MNIST flattened to 784 tabular features (VMask's TabMNIST)",
    kind="tabular",
    folder="mnist",
    files=IDX_FILES,
    md5=MNIST_MD5,
    source=_MNIST_SRC,
)
def load_tabmnist(*, root: Path | None = None, verify: bool = True) -> Dataset:
    """MNIST flattened to 784 pixel features in [0, 1]."""
    return _idx_dataset("tabmnist", root, "mnist", MNIST_MD5, verify, _MNIST_SRC, flatten=True)


@DATASETS.register(
    "tabfmnist",
    summary="Fashion-MNIST flattened to 784 tabular features (TabFMNIST)",
    kind="tabular",
    folder="fashion_mnist",
    files=IDX_FILES,
    md5=FASHION_MD5,
    source=_FASHION_SRC,
)
def load_tabfmnist(*, root: Path | None = None, verify: bool = True) -> Dataset:
    """Fashion-MNIST flattened to 784 pixel features in [0, 1]."""
    return _idx_dataset("tabfmnist", root, "fashion_mnist", FASHION_MD5, verify, _FASHION_SRC, flatten=True)


CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
CIFAR100_FOLDER = "cifar-100-python"
CIFAR100_FILES = ("train", "test")
_CIFAR_SRC = "https://www.cs.toronto.edu/~kriz/cifar.html"

#: The only globals a CIFAR pickle may reference: numpy array reconstruction and the byte
#: decoding that Python 2 pickles need. Anything else is refused, so a tampered file cannot
#: run code when it is unpickled.
_PICKLE_GLOBALS = {
    ("_codecs", "encode"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
}


class _ArrayUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals in ``_PICKLE_GLOBALS``."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a dataset pickle")
        if module.startswith("numpy.core"):
            # numpy >= 2 renamed numpy.core to numpy._core; try the new name first.
            try:
                renamed = importlib.import_module(module.replace("numpy.core", "numpy._core"))
                return getattr(renamed, name)
            except (ImportError, AttributeError):
                pass
        return getattr(importlib.import_module(module), name)


def read_cifar_batch(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR python pickle: uint8 images (N, 3, 32, 32) and int64 labels (N,)."""
    try:
        with path.open("rb") as fh:
            batch = _ArrayUnpickler(fh, encoding="bytes").load()
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        ImportError,
        IndexError,
        KeyError,
    ) as exc:
        raise DataError(f"{path} is not a CIFAR python pickle: {exc}") from None
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        keys = (
            sorted(k.decode("latin-1") if isinstance(k, bytes) else str(k) for k in batch)
            if isinstance(batch, dict)
            else []
        )
        raise DataError(
            f"{path} is not a CIFAR python pickle: expected a dict with keys "
            f"b'data' and {label_key!r}, found keys {keys}"
        )
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path}: b'data' must be uint8 rows of 3072 values (3x32x32), got {data.dtype} {data.shape}")
    if labels.shape != (len(data),):
        raise DataError(f"{path}: {len(data)} images but {labels.size} labels")
    return data.reshape(-1, 3, 32, 32), labels


def _cifar_dataset(
    name: str,
    root: Path | None,
    folder: str,
    train_files: Sequence[str],
    test_files: Sequence[str],
    label_key: bytes,
    num_classes: int,
) -> Dataset:
    base = require_files(name, root, folder, (*train_files, *test_files), source=_CIFAR_SRC)

    def read(files: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [read_cifar_batch(base / f, label_key) for f in files]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise DataError(f"{name}: labels must lie in 0..{num_classes - 1}, found {y.min()}..{y.max()} in {base}/")
        return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y)

    x_tr, y_tr = read(train_files)
    x_te, y_te = read(test_files)
    return Dataset(
        name=name, kind="image", x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te, num_classes=num_classes
    )


@DATASETS.register(
    "cifar10",
    summary="CIFAR-10 32x32 colour (python pickles), 50k/10k, 10 classes",
    kind="image",
    folder=CIFAR10_FOLDER,
    files=CIFAR10_FILES,
    source=_CIFAR_SRC,
)
def load_cifar10(*, root: Path | None = None) -> Dataset:
    """CIFAR-10 images (3x32x32, [0, 1]) from ``cifar-10-batches-py``.

    Train is ``data_batch_1`` ... ``data_batch_5`` in order, test is ``test_batch``; labels
    are ``b'labels'``. Only the archive ``cifar-10-python.tar.gz`` has a published checksum
    (md5 c58f30108f718f92721af3b95e74349a), so the extracted files are checked for presence
    and format, not by checksum. The pickles are read with an unpickler that allows only
    numpy array reconstruction.
    """
    return _cifar_dataset("cifar10", root, CIFAR10_FOLDER, CIFAR10_FILES[:5], CIFAR10_FILES[5:], b"labels", 10)


@DATASETS.register(
    "cifar100",
    summary="CIFAR-100 32x32 colour (python pickles), 50k/10k, 100 classes",
    kind="image",
    folder=CIFAR100_FOLDER,
    files=CIFAR100_FILES,
    source=_CIFAR_SRC,
)
def load_cifar100(*, root: Path | None = None) -> Dataset:
    """CIFAR-100 images (3x32x32, [0, 1]) from ``cifar-100-python``, 100 fine labels.

    Train is ``train``, test is ``test``; labels are ``b'fine_labels'``. Only the archive
    ``cifar-100-python.tar.gz`` has a published checksum, so the extracted files are checked
    for presence and format, not by checksum.
    """
    return _cifar_dataset(
        "cifar100", root, CIFAR100_FOLDER, CIFAR100_FILES[:1], CIFAR100_FILES[1:], b"fine_labels", 100
    )
