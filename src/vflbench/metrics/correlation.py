"""Distance correlation (Székely), the statistic of the dCor and NoPeek defenses and of LabObf's embedding
extension attack.

Computed in the "square-root form" of NoPeek/FSHA and VFLAIR (Székely's V-statistic): double-centred
Euclidean distance matrices A, B; ``dCov = sqrt(mean(A*B))``, ``dVar = sqrt(mean(A*A))``,
``dCor = dCov / sqrt(dVar_x * dVar_y)``; with VFLAIR's +1e-16 under dCov and each dVar (pairwise
distances by ``torch.cdist``, see :func:`pairwise_distances`).
"""

from __future__ import annotations

import torch
from torch import Tensor

COV_EPS = 1e-16


def as_matrix(x: Tensor) -> Tensor:
    """Samples as rows of a floating-point matrix (1-D: one column; N-D: flattened)."""
    x = x.unsqueeze(1) if x.dim() == 1 else x.flatten(1)
    return x if x.is_floating_point() else x.float()


def pairwise_distances(x: Tensor) -> Tensor:
    """Euclidean distances between the rows of ``x`` (N, N), safe to differentiate.

    ``torch.cdist``'s gradient is ``(x_i - x_j) / d_ij`` with 0 at coincident rows; the diagonal
    is set to exactly 0 (cdist's matrix-product path leaves rounding noise there). VFLAIR's
    ``sqrt(d2 + 1e-20)`` is not used: on ``|a|^2 + |b|^2 - 2ab`` it multiplies float32 rounding
    by up to 5e9 at coincident rows, which made training diverge.
    """
    d = torch.cdist(x, x)
    return d * (1 - torch.eye(len(x), dtype=d.dtype, device=d.device))


def _double_centre(d: Tensor) -> Tensor:
    return d - d.mean(0, keepdim=True) - d.mean(1, keepdim=True) + d.mean()


def distance_correlation(x: Tensor, y: Tensor) -> Tensor:
    """Sample distance correlation of paired rows of ``x`` and ``y`` (any shapes, same N).

    In [0, 1]: 0 for independent samples (up to the V-statistic's small-sample bias), 1 when
    ``y`` is a similarity transform of ``x`` (e.g. a scaled, shifted copy). Differentiable.
    """
    x = as_matrix(x)
    y = as_matrix(y).to(x.dtype)
    if len(x) != len(y):
        raise ValueError(f"distance correlation needs paired samples, got {len(x)} and {len(y)} rows")
    a, b = _double_centre(pairwise_distances(x)), _double_centre(pairwise_distances(y))
    dcov = torch.sqrt((a * b).mean().clamp_min(0) + COV_EPS)
    dvar_x = torch.sqrt((a * a).mean() + COV_EPS)
    dvar_y = torch.sqrt((b * b).mean() + COV_EPS)
    return dcov / torch.sqrt(dvar_x * dvar_y)
