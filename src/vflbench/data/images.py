"""Image datasets in their published formats: MNIST-style idx files."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import torch

from vflbench.data.base import Dataset
from vflbench.data.files import require_files
from vflbench.data.registry import DATASETS
from vflbench.errors import DataError

IDX_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
MNIST_MD5 = dict(zip(IDX_FILES, ("f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432",
                                 "9fb629c4189551a2d022fa330f9573f3", "ec29112dd5afa0611ce80d1b7f02629c"), strict=True))
FASHION_MD5 = {"train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
               "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79"}


def read_idx(path: Path) -> np.ndarray:
    """Read a gzipped idx file (the MNIST format): magic, dims, then big-endian data."""
    with gzip.open(path, "rb") as fh:
        data = fh.read()
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


def _idx_dataset(name: str, root: Path | None, folder: str, md5: dict[str, str],
                 verify: bool, source: str, flatten: bool) -> Dataset:
    base = require_files(name, root, folder, IDX_FILES, md5=md5 if verify else None, source=source)
    arrays = [read_idx(base / f) for f in IDX_FILES]
    x_tr, y_tr, x_te, y_te = arrays
    to_x = (lambda a: torch.from_numpy(a.astype(np.float32) / 255.0).reshape(len(a), -1)) if flatten \
        else (lambda a: torch.from_numpy(a.astype(np.float32) / 255.0).unsqueeze(1))
    return Dataset(name=name, kind="tabular" if flatten else "image",
                   x_train=to_x(x_tr), y_train=torch.from_numpy(y_tr.astype(np.int64)),
                   x_test=to_x(x_te), y_test=torch.from_numpy(y_te.astype(np.int64)), num_classes=10)


_MNIST_SRC = "http://yann.lecun.com/exdb/mnist/"
_FASHION_SRC = "https://github.com/zalandoresearch/fashion-mnist"


@DATASETS.register("mnist", summary="MNIST 28x28 digits (idx .gz), 60k/10k, 10 classes",
                   kind="image", folder="mnist", files=IDX_FILES)
def load_mnist(*, root: Path | None = None, verify: bool = True) -> Dataset:
    """MNIST images (1x28x28, [0, 1])."""
    return _idx_dataset("mnist", root, "mnist", MNIST_MD5, verify, _MNIST_SRC, flatten=False)


@DATASETS.register("fashion_mnist", summary="Fashion-MNIST 28x28 (idx .gz), 60k/10k, 10 classes",
                   kind="image", folder="fashion_mnist", files=IDX_FILES)
def load_fashion_mnist(*, root: Path | None = None, verify: bool = True) -> Dataset:
    """Fashion-MNIST images (1x28x28, [0, 1])."""
    return _idx_dataset("fashion_mnist", root, "fashion_mnist", FASHION_MD5, verify, _FASHION_SRC, flatten=False)


@DATASETS.register("tabmnist", summary="MNIST flattened to 784 tabular features (VMask's TabMNIST)",
                   kind="tabular", folder="mnist", files=IDX_FILES)
def load_tabmnist(*, root: Path | None = None, verify: bool = True) -> Dataset:
    """MNIST flattened to 784 pixel features in [0, 1]."""
    return _idx_dataset("tabmnist", root, "mnist", MNIST_MD5, verify, _MNIST_SRC, flatten=True)


@DATASETS.register("tabfmnist", summary="Fashion-MNIST flattened to 784 tabular features (TabFMNIST)",
                   kind="tabular", folder="fashion_mnist", files=IDX_FILES)
def load_tabfmnist(*, root: Path | None = None, verify: bool = True) -> Dataset:
    """Fashion-MNIST flattened to 784 pixel features in [0, 1]."""
    return _idx_dataset("tabfmnist", root, "fashion_mnist", FASHION_MD5, verify, _FASHION_SRC, flatten=True)
