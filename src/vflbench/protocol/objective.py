"""The training objective of the active party: targets, loss, and decoding.

Label defenses (label DP, KDk, CoAE, LabObf, MixUp) change the objective through the
``transform_labels`` hook: they may replace the targets (e.g. by soft labels), the loss, the
width of the model's output, and how outputs decode to classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy against class indices (int64) or probability rows (float)."""
    if targets.dtype == torch.long:
        return F.cross_entropy(logits, targets)
    return -(targets * F.log_softmax(logits, dim=1)).sum(1).mean()


def binary_logistic(logits: Tensor, targets: Tensor) -> Tensor:
    """Logistic loss on one logit per sample (VLR, binary): sigmoid is in the loss."""
    return F.binary_cross_entropy_with_logits(logits.squeeze(1), targets.float())


def argmax_decode(logits: Tensor) -> Tensor:
    """Predicted class = largest output."""
    return logits.argmax(1)


def sigmoid_decode(logits: Tensor) -> Tensor:
    """Predicted class = 1 when the single logit is positive."""
    return (logits.squeeze(1) > 0).long()


def softmax_scores(logits: Tensor) -> Tensor:
    """Class probabilities (N, C) from C logits."""
    return logits.softmax(1)


def sigmoid_scores(logits: Tensor) -> Tensor:
    """Class probabilities (N, 2) from one logit."""
    p = torch.sigmoid(logits.squeeze(1))
    return torch.stack([1 - p, p], 1)


@dataclass(frozen=True)
class Objective:
    """What the active party optimises and how its outputs become predictions.

    ``targets`` are the training targets aligned with the training rows (class indices or
    soft rows); ``out_dim`` the width of the top model's output; ``loss(outputs, targets)``;
    ``decode(outputs)`` class indices; ``scores(outputs)`` class probabilities for AUC.
    """

    targets: Tensor
    out_dim: int
    loss: Callable[[Tensor, Tensor], Tensor]
    decode: Callable[[Tensor], Tensor]
    scores: Callable[[Tensor], Tensor]
    name: str = "cross_entropy"

    def replace(self, **changes: object) -> Objective:
        """A copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]


def default_objective(y_train: Tensor, num_classes: int, *, single_logit: bool) -> Objective:
    """Cross-entropy on C outputs, or the logistic loss on one output (binary VLR)."""
    if single_logit:
        return Objective(y_train, 1, binary_logistic, sigmoid_decode, sigmoid_scores, "logistic")
    return Objective(y_train, num_classes, soft_cross_entropy, argmax_decode, softmax_scores)
