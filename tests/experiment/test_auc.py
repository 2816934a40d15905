"""The vectorised per-batch AUC equals scikit-learn's roc_auc_score, ties included."""

from __future__ import annotations

import math

import pytest
import torch
from sklearn.metrics import roc_auc_score

from vflbench.metrics.auc import batched_binary_auc


def _sets(seed: int, n: int, *, ties: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    scores, labels = [], []
    for _ in range(n):
        size = int(torch.randint(2, 40, (1,), generator=g))
        s = torch.randn(size, generator=g)
        if ties:
            s = (s * 2).round() / 2  # few distinct values: many ties inside and across classes
        scores.append(s)
        labels.append(torch.randint(0, 2, (size,), generator=g))
    return scores, labels


@pytest.mark.parametrize("ties", [False, True])
def test_batched_auc_equals_sklearn_per_set(ties: bool) -> None:
    scores, labels = _sets(0, 200, ties=ties)
    got = batched_binary_auc(scores, labels).tolist()
    checked = 0
    for s, y, value in zip(scores, labels, got, strict=True):
        if len(torch.unique(y)) < 2:
            assert math.isnan(value)
            continue
        assert value == pytest.approx(roc_auc_score(y.numpy(), s.double().numpy()), abs=1e-12)
        checked += 1
    assert checked > 150


def test_batched_auc_orders_sets_independently() -> None:
    # a perfect set next to an inverted one: sorting across sets must not mix their ranks
    scores = [torch.tensor([0.1, 0.9, 0.2, 0.8]), torch.tensor([5.0, -5.0, 4.0])]
    labels = [torch.tensor([0, 1, 0, 1]), torch.tensor([0, 1, 0])]
    assert batched_binary_auc(scores, labels).tolist() == [1.0, 0.0]


def test_all_tied_scores_give_one_half() -> None:
    assert batched_binary_auc([torch.zeros(6)], [torch.tensor([0, 1, 1, 0, 1, 0])]).tolist() == [0.5]


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="label"):
        batched_binary_auc([torch.zeros(3)], [torch.zeros(2)])
