"""Binary ROC AUC of many score sets in one vectorised pass.

The AUC of a score set equals the Mann-Whitney statistic: the probability that a random positive
scores above a random negative, ties counting one half. With mid-ranks (tied scores share the
mean of their ranks) it is ``(R_pos - n_pos (n_pos + 1) / 2) / (n_pos n_neg)``, where ``R_pos`` is
the positives' rank sum. This is the value of scikit-learn's ``roc_auc_score`` (the trapezoidal
area under the ROC curve, whose tied thresholds give the same half credit), up to floating-point
rounding. The label attacks of Kang et al.'s threat model T1 are scored by the mean AUC over every
training batch; one pass over all batches replaces one scikit-learn call per batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def batched_binary_auc(scores: Sequence[Tensor], labels: Sequence[Tensor]) -> Tensor:
    """The AUC of each ``(scores[i], labels[i])`` pair (float64); NaN where a set lacks a class.

    ``scores[i]`` is a 1-D tensor of finite scores (higher means positive), ``labels[i]`` the
    0/1 labels of the same rows. Computed on the first score set's device.
    """
    if len(scores) != len(labels):
        raise ValueError(f"got {len(scores)} score sets but {len(labels)} label sets")
    if not scores:
        return torch.empty(0, dtype=torch.float64)
    dev = scores[0].device
    sizes = torch.tensor([len(s) for s in scores], device=dev)
    batch = torch.repeat_interleave(torch.arange(len(scores), device=dev), sizes)
    s = torch.cat([x.reshape(-1).to(dev) for x in scores]).double()
    y = torch.cat([x.reshape(-1).to(dev) for x in labels]).double()
    if len(s) != len(y) or len(s) != int(sizes.sum()):
        raise ValueError("every score set needs one label per score")
    order = torch.argsort(s, stable=True)
    order = order[torch.argsort(batch[order], stable=True)]  # by batch, then by score
    s, y, batch = s[order], y[order], batch[order]
    first = torch.ones(len(s), dtype=torch.bool, device=dev)
    first[1:] = (s[1:] != s[:-1]) | (batch[1:] != batch[:-1])
    group = torch.cumsum(first, 0) - 1
    count = torch.bincount(group).double()
    offset = torch.cumsum(sizes, 0) - sizes
    position = torch.arange(len(s), device=dev) - offset[batch]  # 0-based rank inside the batch
    mid_rank = position[first].double() + (count + 1) / 2  # 1-based mean rank of each tie group
    rank_sum = torch.zeros(len(scores), dtype=torch.float64, device=dev).index_add_(0, batch, mid_rank[group] * y)
    n_pos = torch.zeros(len(scores), dtype=torch.float64, device=dev).index_add_(0, batch, y)
    n_neg = sizes.double() - n_pos
    auc = (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return torch.where((n_pos > 0) & (n_neg > 0), auc, torch.full_like(auc, float("nan")))
