"""Model building blocks: seeded initialisation, layer listing, shape checks."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TypeVar

import torch
from torch import Tensor, nn

from vflbench.errors import ConfigError
from vflbench.rng import fill_

ModuleT = TypeVar("ModuleT", bound=nn.Module)

LINEAR_TYPES = (nn.Linear, nn.Conv2d, nn.Conv1d)


def linear_layers(model: nn.Module) -> list[nn.Module]:
    """The model's Linear/Conv layers in forward (registration) order; VMask masks by index."""
    return [m for m in model.modules() if isinstance(m, LINEAR_TYPES)]


def init_parameters(model: ModuleT, generator: torch.Generator) -> ModuleT:
    """Re-initialise every parameter from ``generator`` with PyTorch's default schemes.

    Models are built without touching the global RNG state's role in results: whatever the
    constructors drew is overwritten here, so the same generator seed gives the same model. The
    draws are made on the CPU (``generator`` is a CPU generator) and copied into parameters that
    live on another device, so a model's initial weights are the same on every device.
    """
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LINEAR_TYPES):
                fill_(m.weight, lambda t: nn.init.kaiming_uniform_(t, a=math.sqrt(5), generator=generator))
                if m.bias is not None:
                    fan_in, _ = nn.init._calculate_fan_in_and_fan_out(m.weight)
                    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
                    fill_(m.bias, functools.partial(nn.init.uniform_, a=-bound, b=bound, generator=generator))
            elif isinstance(m, nn.Embedding):
                fill_(m.weight, lambda t: nn.init.normal_(t, generator=generator))
                if m.padding_idx is not None:
                    m.weight[m.padding_idx].zero_()
            elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
                if getattr(m, "weight", None) is not None:
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
    return model


def check_fits(model: nn.Module, input_shape: Sequence[int], name: str, dtype: torch.dtype = torch.float32) -> int:
    """Run one dummy sample through ``model``; return its output width or raise a clear error."""
    x = torch.zeros((2, *input_shape), dtype=dtype)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out: Tensor = model(x)
    except (RuntimeError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(
            f"model {name!r} does not fit a party's input of shape {tuple(input_shape)}: {first}. "
            f"Use a model for this input (e.g. mlp2 for small or tabular slices) or fewer parties."
        ) from None
    finally:
        model.train(was_training)
    return int(out.shape[-1])
