"""The embedded ``synthetic`` dataset's ``feature_scale`` (a stand-in at a real dataset's scale)."""

from __future__ import annotations

import math

import pytest
import torch

from vflbench.data import load_dataset, partition
from vflbench.errors import DataError

SHAPE = {"n_samples": 600, "n_features": 8, "n_informative": 3, "class_sep": 0.5, "generator_seed": 3}
EPSILON = 1 / math.sqrt(2000)


def test_feature_scale_standardises_on_train_rows_then_scales() -> None:
    plain = load_dataset("synthetic", **SHAPE)
    scaled = load_dataset("synthetic", **SHAPE, feature_scale=EPSILON)
    assert torch.equal(plain.y_train, scaled.y_train) and torch.equal(plain.y_test, scaled.y_test)
    assert scaled.meta["feature_scale"] == pytest.approx(EPSILON)
    # every training column: mean 0, standard deviation feature_scale (make_classification's are ~1-2)
    assert torch.allclose(scaled.x_train.mean(0), torch.zeros(8), atol=1e-6)
    assert torch.allclose(scaled.x_train.std(0, unbiased=False), torch.full((8,), EPSILON), rtol=1e-4)
    assert plain.x_train.std(0).max() > 0.5
    # test rows use the training rows' statistics: the same affine map as the training rows
    mean, std = plain.x_train.mean(0), plain.x_train.std(0, unbiased=False)
    assert torch.allclose(scaled.x_test, (plain.x_test - mean) / std * EPSILON, atol=1e-7)
    assert not torch.allclose(scaled.x_test.mean(0), torch.zeros(8), atol=1e-4)


def test_scaled_stand_in_is_the_standardised_one_times_the_scale() -> None:
    """What the Epsilon-scale reproduction relies on: the same parties' inputs, only smaller."""
    columns = [[0, 1, 2], [3, 4, 5, 6, 7]]
    standardised = partition(
        load_dataset("synthetic", **SHAPE), parties=2, active_has_features=True, split="columns", columns=columns
    )
    scaled = partition(
        load_dataset("synthetic", **SHAPE, feature_scale=EPSILON),
        parties=2,
        active_has_features=True,
        split="columns",
        columns=columns,
        standardise=False,
    )
    for a, b in ((standardised.passive[0], scaled.passive[0]), (standardised.active, scaled.active)):
        assert a is not None and b is not None
        assert torch.allclose(b.x_train, a.x_train * EPSILON, atol=1e-6)
        assert torch.allclose(b.x_test, a.x_test * EPSILON, atol=1e-6)


def test_standardising_a_scaled_dataset_is_refused() -> None:
    ds = load_dataset("synthetic", **SHAPE, feature_scale=0.1)
    with pytest.raises(DataError, match=r"feature_scale=0\.1 .*set data\.standardise: false"):
        partition(ds, parties=2, active_has_features=True)


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, math.nan, math.inf, True, "small"])
def test_bad_feature_scale_is_refused(bad: object) -> None:
    with pytest.raises(DataError, match="feature_scale"):
        load_dataset("synthetic", **SHAPE, feature_scale=bad)
