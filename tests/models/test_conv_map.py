"""conv_map: the pixel-aligned convolutional embedding (URVFL's ClientNet in spirit).

Before this model existed every image bottom ended in pooling and a Linear projection, so no
bottom could send a map aligned with the strip's pixels; these tests fail on that (the name is
not registered) and on a map that pools, projects or mixes far-away pixels.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vflbench.data.base import PartySlice
from vflbench.errors import ConfigError
from vflbench.models import build_bottom

SHAPE = (1, 12, 6)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def part(n: int = 6) -> PartySlice:
    x = torch.rand((n, *SHAPE), generator=torch.Generator().manual_seed(0))
    return PartySlice(x, x.clone(), "image")


def test_conv_map_sends_a_pixel_aligned_map_and_passes_gradients():
    model = build_bottom("conv_map", part(), 3 * 12 * 6, torch.Generator().manual_seed(0), channels=[4, 3])
    assert model.map_shape == (3, 12, 6)
    assert not any(isinstance(m, (nn.Linear, nn.MaxPool2d, nn.AvgPool2d)) for m in model.modules())
    x = part().x_train.requires_grad_()
    out = model.eval()(x)
    assert out.shape == (6, 3 * 12 * 6)
    # pixel alignment: two 3x3 convolutions see a 5x5 neighbourhood, so changing pixel (0, 0) of row 0
    # moves only map positions within 2 pixels of it, and no other row
    x2 = x.detach().clone()
    x2[0, 0, 0, 0] += 1.0
    with torch.no_grad():
        diff = (model(x2) - model(x.detach())).abs().view(6, 3, 12, 6)
    assert diff[0, :, :3, :3].sum() > 0
    assert diff[0, :, 3:, :].sum() == 0 and diff[0, :, :, 3:].sum() == 0 and diff[1:].sum() == 0
    # gradients reach every parameter and the input
    model.train()(x).square().mean().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_conv_map_refuses_an_embed_dim_other_than_its_map_size():
    with pytest.raises(ConfigError, match="embed_dim must be 216"):
        build_bottom("conv_map", part(), 64, torch.Generator().manual_seed(0), channels=[4, 3])
