"""Two-party additive secret sharing over Z_2^64 (VMask Eq. 1: ``Share`` / ``Reconstruct``).

A ring element ``x`` is split into ``(s0, s1)`` with ``s0`` uniform over Z_2^64 and
``s1 = x - s0`` (mod 2^64). Each share alone is uniformly distributed and independent of ``x``;
``s0 + s1 = x``. Shares are plain ``torch.int64`` tensors; a pair is a :data:`SharePair`.
By convention party 0 is the passive party P_k and party 1 the active party P_K.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vflbench.mpc.ring import uniform

SharePair = tuple[Tensor, Tensor]
"""The two parties' shares ``(s0, s1)`` of one secret (simulation view; never held by one party)."""


def share(x_ring: Tensor, generator: torch.Generator) -> SharePair:
    """Split the ring tensor ``x_ring`` into two additive shares; ``s0`` is uniform from ``generator``."""
    if x_ring.dtype != torch.int64:
        raise TypeError(f"share expects an int64 ring tensor (use ring.encode first), got {x_ring.dtype}")
    s0 = uniform(x_ring.shape, generator, device=x_ring.device)
    return s0, x_ring - s0


def reconstruct(s0: Tensor, s1: Tensor) -> Tensor:
    """``Reconstruct``: the secret ``s0 + s1`` (mod 2^64)."""
    if s0.dtype != torch.int64 or s1.dtype != torch.int64:
        raise TypeError("reconstruct expects int64 ring shares")
    return s0 + s1
