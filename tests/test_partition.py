"""Vertical partitioning, subsampling and the threat-model samplers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vflbench.data import aux_indices, known_label_indices, load_dataset, partition, subsample
from vflbench.data.base import Dataset
from vflbench.errors import DataError


def _tabular(n_features: int, n: int = 40) -> Dataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, n_features, generator=g) * 3 + 1
    y = torch.arange(n) % 2
    return Dataset("t", "tabular", x[:30], y[:30], x[30:], y[30:], 2)


@settings(max_examples=40, deadline=None)
@given(n_features=st.integers(2, 40), parties=st.integers(2, 10), active=st.booleans())
def test_tabular_slices_are_disjoint_and_cover(n_features, parties, active):
    holders = parties if active else parties - 1
    if holders > n_features:
        with pytest.raises(DataError, match="cannot split"):
            partition(_tabular(n_features), parties=parties, active_has_features=active)
        return
    vd = partition(_tabular(n_features), parties=parties, active_has_features=active, standardise=False)
    slices = [*vd.passive, *([vd.active] if active else [])]
    assert len(vd.passive) == parties - 1 and (vd.active is None) != active
    cols = [c for s in slices for c in s.columns]
    assert sorted(cols) == list(range(n_features))
    assert torch.equal(torch.cat([s.x_train for s in slices], 1), _tabular(n_features).x_train)


@settings(max_examples=20, deadline=None)
@given(parties=st.integers(2, 8), axis=st.sampled_from(["width", "height"]))
def test_image_strips_reassemble_the_image(parties, axis):
    ds = load_dataset("digits")
    vd = partition(ds, parties=parties, active_has_features=True, split=axis)
    dim = 3 if axis == "width" else 2
    whole = torch.cat([*(s.x_train for s in vd.passive), vd.active.x_train], dim)
    assert torch.equal(whole, ds.x_train)


def test_left_half_goes_to_the_passive_party():
    ds = load_dataset("digits")
    vd = partition(ds, parties=2, active_has_features=True)
    assert torch.equal(vd.passive[0].x_train, ds.x_train[..., :4])
    assert vd.passive[0].meta["range"] == (0, 4)


def test_too_many_parties_for_features_is_a_clear_error():
    with pytest.raises(DataError, match="cannot split 8 pixel columns among 9"):
        partition(load_dataset("digits"), parties=9, active_has_features=True)
    with pytest.raises(DataError, match="between 2 and 10"):
        partition(load_dataset("wine"), parties=11, active_has_features=True)


def test_standardisation_is_fitted_on_train_only():
    vd = partition(_tabular(4), parties=2, active_has_features=True)
    s = vd.passive[0]
    assert torch.allclose(s.x_train.mean(0), torch.zeros(2), atol=1e-5)
    assert torch.allclose(s.x_train.std(0, unbiased=False), torch.ones(2), atol=1e-5)
    assert not torch.allclose(s.x_test.mean(0), torch.zeros(2), atol=1e-3)


def test_explicit_columns_are_validated():
    ds = _tabular(6)
    vd = partition(ds, parties=2, active_has_features=True, columns=[[0, 1, 2], [3, 4]])
    assert vd.passive[0].columns == (0, 1, 2) and vd.active.columns == (3, 4)
    with pytest.raises(DataError, match="given to two parties"):
        partition(ds, parties=2, active_has_features=True, columns=[[0, 1], [1, 2]])
    with pytest.raises(DataError, match="one list per party"):
        partition(ds, parties=3, active_has_features=True, columns=[[0], [1]])


def test_subsample_is_seeded_and_recorded_sizes():
    ds = load_dataset("digits")
    a = subsample(ds, train_size=100, test_size=50, generator=torch.Generator().manual_seed(1))
    b = subsample(ds, train_size=100, test_size=50, generator=torch.Generator().manual_seed(1))
    assert len(a.y_train) == 100 and len(a.y_test) == 50
    assert torch.equal(a.x_train, b.x_train)


def test_known_labels_per_class_disjoint_from_excluded_rows():
    y = torch.arange(200) % 4
    exclude = torch.arange(0, 100)
    idx = known_label_indices(y, per_class=5, generator=torch.Generator().manual_seed(0), exclude=exclude)
    assert len(idx) == 20 and torch.bincount(y[idx]).tolist() == [5, 5, 5, 5]
    assert not torch.isin(idx, exclude).any()
    again = known_label_indices(y, per_class=5, generator=torch.Generator().manual_seed(0), exclude=exclude)
    assert torch.equal(idx, again)


def test_aux_by_fraction_and_out_of_distribution_classes():
    y = torch.arange(1000) % 10
    g = torch.Generator().manual_seed(0)
    assert len(aux_indices(y, fraction=0.1, generator=g)) == 100
    ood = aux_indices(y, size=50, classes=[0, 1, 2], generator=g)
    assert set(y[ood].tolist()) <= {0, 1, 2}
    with pytest.raises(DataError, match="exactly one"):
        aux_indices(y, generator=g)
