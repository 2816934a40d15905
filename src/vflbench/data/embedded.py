"""Embedded datasets: shipped with scikit-learn, no files needed."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from sklearn import datasets as skd
from sklearn.model_selection import train_test_split

from vflbench.data.base import Dataset, Kind
from vflbench.data.registry import DATASETS, SPLIT
from vflbench.errors import DataError

#: Fixed seed of the train/test split of embedded datasets, so that every run and every
#: paper-style table uses the same split; the experiment seed changes everything else.
SPLIT_SEED = 0


def _split(
    name: str,
    kind: Kind,
    x: np.ndarray,
    y: np.ndarray,
    *,
    test_fraction: float,
    feature_names: tuple[str, ...] | None = None,
) -> Dataset:
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"{name}: test_fraction must be in (0, 1), got {test_fraction}")
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, stratify=y, random_state=SPLIT_SEED)
    return Dataset(
        name=name,
        kind=kind,
        x_train=torch.as_tensor(x_tr, dtype=torch.float32),
        y_train=torch.as_tensor(y_tr, dtype=torch.long),
        x_test=torch.as_tensor(x_te, dtype=torch.float32),
        y_test=torch.as_tensor(y_te, dtype=torch.long),
        num_classes=int(np.max(y)) + 1,
        feature_names=feature_names,
    )


@DATASETS.register(
    "digits",
    constraints=SPLIT,
    summary="scikit-learn 8x8 handwritten digits, 1,797 images, 10 classes",
    kind="image",
    files=(),
)
def load_digits(*, root: Path | None = None, test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's 8x8 digits as 1x8x8 images scaled to [0, 1]."""
    bunch = skd.load_digits()
    x = (bunch.data / 16.0).reshape(-1, 1, 8, 8)
    return _split("digits", "image", x, bunch.target, test_fraction=test_fraction)


@DATASETS.register(
    "breast_cancer",
    constraints=SPLIT,
    summary="Wisconsin breast cancer, 569 rows, 30 features, binary",
    kind="tabular",
    files=(),
)
def load_breast_cancer(*, root: Path | None = None, test_fraction: float = 0.2) -> Dataset:
    """Wisconsin diagnostic breast cancer; 1 = malignant (the positive finding, 37% of rows).

    scikit-learn codes benign as 1; we follow the diagnostic convention (and Li et al.'s, where
    the positive class is the minority), so label 1 is malignant.
    """
    bunch = skd.load_breast_cancer()
    return _split(
        "breast_cancer",
        "tabular",
        bunch.data,
        1 - bunch.target,
        test_fraction=test_fraction,
        feature_names=tuple(bunch.feature_names),
    )


@DATASETS.register(
    "wine", constraints=SPLIT, summary="UCI wine, 178 rows, 13 features, 3 classes", kind="tabular", files=()
)
def load_wine(*, root: Path | None = None, test_fraction: float = 0.25) -> Dataset:
    """UCI wine recognition (3 classes)."""
    bunch = skd.load_wine()
    return _split(
        "wine",
        "tabular",
        bunch.data,
        bunch.target,
        test_fraction=test_fraction,
        feature_names=tuple(bunch.feature_names),
    )


@DATASETS.register(
    "synthetic",
    constraints=SPLIT,
    summary="make_classification with chosen samples/features/classes; feature_scale: "
    "columns standardised on the training rows, then multiplied by it (Epsilon's scale: "
    "1/sqrt(2000); needs data.standardise: false)",
    kind="tabular",
    files=(),
)
def load_synthetic(
    *,
    root: Path | None = None,
    n_samples: int = 2000,
    n_features: int = 20,
    n_informative: int = 10,
    n_classes: int = 2,
    class_sep: float = 1.0,
    generator_seed: int = 0,
    test_fraction: float = 0.2,
    feature_scale: float | None = None,
) -> Dataset:
    """scikit-learn ``make_classification`` with the given shape (its own seed).

    ``feature_scale``: ``None`` (default) returns make_classification's columns as drawn. A positive
    number standardises every column with the training rows' mean and standard deviation and then
    multiplies it by ``feature_scale``, so that the data sit at a chosen scale; e.g. ``1/sqrt(2000)``
    (0.02236) is the scale of Epsilon's columns, whose rows are standardised and then scaled to unit
    length over 2,000 features. The partition's own standardisation would undo the scale, so such a
    dataset is refused unless ``data.standardise`` is false (the dataset's ``meta["feature_scale"]``
    tells :func:`~vflbench.data.partition.partition`).
    """
    if n_informative > n_features:
        raise DataError(f"synthetic: n_informative ({n_informative}) cannot exceed n_features ({n_features})")
    if feature_scale is not None and (
        isinstance(feature_scale, bool)
        or not isinstance(feature_scale, int | float)
        or not math.isfinite(feature_scale)
        or feature_scale <= 0
    ):
        raise DataError(
            f"synthetic: feature_scale must be a finite number > 0 (e.g. 0.02236 = 1/sqrt(2000), Epsilon's "
            f"column scale) or null for make_classification's own scale, got {feature_scale!r}"
        )
    try:
        x, y = skd.make_classification(
            n_samples=n_samples,
            n_features=n_features,
            n_informative=n_informative,
            n_redundant=0,
            n_classes=n_classes,
            class_sep=class_sep,
            random_state=generator_seed,
        )
    except ValueError as exc:
        raise DataError(f"synthetic: {exc}") from None
    ds = _split("synthetic", "tabular", x, y, test_fraction=test_fraction)
    if feature_scale is None:
        return ds
    mean = ds.x_train.mean(0)
    std = ds.x_train.std(0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))
    factor = float(feature_scale)
    return replace(
        ds,
        x_train=(ds.x_train - mean) / std * factor,
        x_test=(ds.x_test - mean) / std * factor,
        meta={**ds.meta, "feature_scale": factor},
    )
