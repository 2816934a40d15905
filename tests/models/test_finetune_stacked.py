"""complete_stacked: several fine-tunings of linear models run as one stacked model give what one complete()
each gives, up to float32 rounding: the same draws, batch order and updates, but ``baddbmm`` instead of
``addmm``, which round alike on some CPUs (bit-identical where measured first) and not on others (AMD EPYC:
up to 6e-8 apart)."""

import copy

import pytest
import torch
from torch import nn

from vflbench.models import init_parameters
from vflbench.models.finetune import complete, complete_stacked
from vflbench.models.zoo import mlp3


def _candidates(shadow: nn.Module, masks: list[set[int]]) -> list[tuple[nn.Module, torch.Generator]]:
    out = []
    for masked in masks:
        g = torch.Generator().manual_seed(100 + len(masked))
        model = copy.deepcopy(shadow)
        layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        for i in masked:
            init_parameters(layers[i], g)
        out.append((model, g))
    return out


@pytest.mark.parametrize(
    "recipe",
    [
        {"optimizer": "adam", "lr": 1e-3},
        {"optimizer": "sgd", "lr": 0.05, "batch_size": None},
        {"optimizer": "adam", "lr": 1e-3, "batch_size": 8, "finetune_bottom": False},
    ],
)
def test_stacked_fine_tuning_equals_one_complete_per_model(recipe):
    """VMask's simulated attacks were run one complete() each; the stacked run may differ only by float32
    rounding (a different seed use, batch order or reduction would move the outputs by far more)."""
    g0 = torch.Generator().manual_seed(0)
    shadow, shape = mlp3(input_shape=(12,), out_dim=8), (12,)
    init_parameters(shadow, g0)
    x = torch.randn(60, *shape, generator=g0)
    y = torch.randint(0, 4, (60,), generator=g0)
    masks = [set(), {0}, {0, 2}]
    kwargs = {"num_classes": 4, "embed_dim": 8, "epochs": 3, **recipe}
    one = [complete(m, x[:20], y[:20], x[20:], generator=g, **kwargs) for m, g in _candidates(shadow, masks)]
    models, generators = zip(*_candidates(shadow, masks), strict=True)
    stacked = complete_stacked(list(models), x[:20], y[:20], x[20:], generators=list(generators), **kwargs)
    assert len(stacked) == len(one)
    for a, b in zip(one, stacked, strict=True):
        assert len(a) == len(b) == 3
        for p, q in zip(a, b, strict=True):
            torch.testing.assert_close(q, p, rtol=0.0, atol=1e-6)
