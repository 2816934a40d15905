"""Timing of a masked layer against its plaintext counterpart (for docs and benchmarks)."""

from __future__ import annotations

import time

import torch
from torch import nn

from vflbench.mpc.comm import Comm
from vflbench.mpc.dealer import Dealer
from vflbench.mpc.layers import mask_layer


def time_shared_linear(
    *, batch: int = 128, n_in: int = 784, n_out: int = 256, repeats: int = 10, seed: int = 0
) -> dict[str, float | int]:
    """Median seconds of one forward+backward (with input gradient) of a masked and a plain ``nn.Linear``.

    Uses the current torch thread count (set it before calling). Also returns the ring elements
    sent per forward+backward in each direction.
    """
    g = torch.Generator().manual_seed(seed)
    plain = nn.Linear(n_in, n_out)
    comm = Comm()
    shared = mask_layer(
        plain,
        dealer=Dealer(seed + 1),
        comm=comm,
        generator_passive=torch.Generator().manual_seed(seed + 2),
        generator_active=torch.Generator().manual_seed(seed + 3),
        sigma=0.01,
    )
    x = torch.rand(batch, n_in, generator=g, requires_grad=True)
    gy = torch.randn(batch, n_out, generator=g)

    def run(layer: nn.Module) -> float:
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            layer(x).backward(gy)
            times.append(time.perf_counter() - t0)
            x.grad = None
        return sorted(times[1:])[len(times[1:]) // 2]

    t_plain = run(plain)
    comm.reset()
    t_shared = run(shared)
    steps = repeats + 1
    return {
        "plain_s": t_plain,
        "shared_s": t_shared,
        "ratio": t_shared / t_plain,
        "elements_up": comm.elements["passive_to_active"] // steps,
        "elements_down": comm.elements["active_to_passive"] // steps,
        "threads": torch.get_num_threads(),
    }
