"""Timing of a masked layer against its plaintext counterpart (for docs and benchmarks)."""

from __future__ import annotations

import time

import torch
from torch import nn

from vflbench.mpc.dealer import Dealer
from vflbench.mpc.layers import mask_layer
from vflbench.mpc.parties import PROTOCOL_KINDS, LocalSession, local_session


def protocol_elements(session: LocalSession) -> tuple[int, int]:
    """Ring elements (8 bytes each) of VMask's protocol messages counted so far: to P_K, to P_k."""
    totals = {"up": 0, "down": 0}
    for phase in session.channel.stats.values():
        for kind in PROTOCOL_KINDS:
            for direction, stats in phase.by_kind.get(kind, {}).items():
                totals[direction] += stats.bytes
    return totals["up"] // 8, totals["down"] // 8


def time_shared_linear(
    *, batch: int = 128, n_in: int = 784, n_out: int = 256, repeats: int = 10, seed: int = 0
) -> dict[str, float | int]:
    """Median seconds of one forward+backward (with input gradient) of a masked and a plain ``nn.Linear``.

    Uses the current torch thread count (set it before calling). Also returns the ring elements
    sent per forward+backward in each direction.
    """
    g = torch.Generator().manual_seed(seed)
    plain = nn.Linear(n_in, n_out)
    session = local_session(Dealer(seed + 1), noise=torch.Generator().manual_seed(seed + 3))
    shared = mask_layer(
        plain, link=session.passive, generator_passive=torch.Generator().manual_seed(seed + 2), sigma=0.01
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
    before = protocol_elements(session)
    t_shared = run(shared)
    steps = repeats + 1
    up, down = (n - b for n, b in zip(protocol_elements(session), before, strict=True))
    return {
        "plain_s": t_plain,
        "shared_s": t_shared,
        "ratio": t_shared / t_plain,
        "elements_up": up // steps,
        "elements_down": down // steps,
        "threads": torch.get_num_threads(),
    }
