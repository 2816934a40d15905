"""Explicit random number generators derived from the experiment seed.

Every component that draws randomness (a party's model initialisation and batch order, a
defense's noise, an attack's sampling) gets its own :class:`torch.Generator`, derived from the
experiment seed and the component's name. No global seed is ever set, and adding a component
never changes the random stream of another.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor


def derive_seed(seed: int, *names: str | int) -> int:
    """A 63-bit seed derived from ``seed`` and a path of names (stable across runs)."""
    key = tuple(zlib.crc32(str(n).encode()) for n in names)
    state = np.random.SeedSequence(entropy=seed, spawn_key=key).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def generator(seed: int, *names: str | int) -> torch.Generator:
    """A torch generator for the component at ``names`` under experiment ``seed`` (on the CPU, always)."""
    return torch.Generator().manual_seed(derive_seed(seed, *names))


def fill_(tensor: Tensor, fill: Callable[[Tensor], object]) -> Tensor:
    """Fill ``tensor`` in place with ``fill`` (an in-place initialiser that draws from a CPU generator, e.g.
    ``lambda t: nn.init.normal_(t, generator=g)``), drawing on the CPU and copying in when ``tensor``
    lives elsewhere: the values are the same on every device."""
    if tensor.device.type == "cpu":
        fill(tensor)
        return tensor
    cpu = torch.empty(tensor.shape, dtype=tensor.dtype)
    fill(cpu)
    with torch.no_grad():
        tensor.copy_(cpu)
    return tensor
