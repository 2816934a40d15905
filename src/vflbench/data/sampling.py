"""Seeded samplers of what a threat model grants: known labels and auxiliary sets.

Both draw from the training rows and can exclude rows (e.g. the evaluated targets), so that
what an attacker is given is disjoint from what it is scored on. Row ids are CPU tensors wherever
the labels live (docs/decisions/devices.md, "Devices"): indexing a device tensor with them is allowed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from vflbench.errors import DataError


def _candidates(n: int, exclude: Tensor | None) -> Tensor:
    mask = torch.ones(n, dtype=torch.bool)
    if exclude is not None and len(exclude):
        mask[exclude] = False
    return mask


def known_label_indices(
    y: Tensor, *, per_class: int, generator: torch.Generator, exclude: Tensor | None = None
) -> Tensor:
    """Draw ``per_class`` row indices of every class (sorted), avoiding ``exclude``."""
    if per_class < 1:
        raise DataError(f"known labels per class must be >= 1, got {per_class}")
    y, exclude = y.cpu(), None if exclude is None else exclude.cpu()
    allowed = _candidates(len(y), exclude)
    picked = []
    for c in torch.unique(y).tolist():
        rows = torch.nonzero((y == c) & allowed).flatten()
        if len(rows) < per_class:
            raise DataError(f"class {c} has only {len(rows)} eligible rows; cannot draw {per_class} known labels")
        picked.append(rows[torch.randperm(len(rows), generator=generator)[:per_class]])
    return torch.cat(picked).sort().values


def aux_indices(
    y: Tensor,
    *,
    generator: torch.Generator,
    size: int | None = None,
    fraction: float | None = None,
    classes: Sequence[int] | None = None,
    exclude: Tensor | None = None,
) -> Tensor:
    """Draw an auxiliary set (sorted row indices) by count or by fraction of the rows.

    ``classes`` restricts the draw to some classes, which gives an out-of-distribution
    auxiliary set when it leaves classes out.
    """
    if (size is None) == (fraction is None):
        raise DataError("give exactly one of aux size (a count) or aux fraction")
    y, exclude = y.cpu(), None if exclude is None else exclude.cpu()
    allowed = _candidates(len(y), exclude)
    if classes is not None:
        allowed &= torch.isin(y, torch.as_tensor(list(classes), dtype=y.dtype))
    rows = torch.nonzero(allowed).flatten()
    if fraction is not None:
        if not 0.0 < fraction <= 1.0:
            raise DataError(f"aux fraction must be in (0, 1], got {fraction}")
        size = max(1, round(fraction * len(rows)))
    assert size is not None
    if not 1 <= size <= len(rows):
        raise DataError(f"aux size must be between 1 and {len(rows)} eligible rows, got {size}")
    return rows[torch.randperm(len(rows), generator=generator)[:size]].sort().values
