"""Model zoo: bottom models per party slice, top models, inference heads, layer listing."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vflbench.data.base import PartySlice
from vflbench.errors import ConfigError
from vflbench.models import tabular_text, top, vision, zoo  # noqa: F401  (register models)
from vflbench.models.base import check_fits, init_parameters, linear_layers
from vflbench.models.registry import MODELS, TOP_MODELS
from vflbench.models.top import inference_head

__all__ = [
    "MODELS",
    "TOP_MODELS",
    "build_bottom",
    "build_top",
    "check_fits",
    "inference_head",
    "init_parameters",
    "linear_layers",
]


BOTTOM_RESERVED = ("input_shape", "out_dim", "meta")
TOP_RESERVED = ("in_dim", "num_classes")


def build_bottom(
    name: str,
    part: PartySlice,
    out_dim: int,
    generator: torch.Generator,
    *,
    device: torch.device | str | None = None,
    **options: Any,
) -> nn.Module:
    """Build and seed bottom model ``name`` for a party's slice (on the CPU, so that its initial weights are the
    same on every device), check that it fits, and move it to ``device`` (default: where the slice's features
    are)."""
    entry = MODELS.get(name)
    MODELS.check(name, options, reserved=BOTTOM_RESERVED, noun="option")
    try:
        model = entry.factory(input_shape=part.sample_shape, out_dim=out_dim, meta=dict(part.meta), **options)
    except ValueError as exc:
        raise ConfigError(
            f"model {name!r} does not fit a party's input of shape {part.sample_shape}: {exc}. "
            "Use a model for this input (e.g. mlp2 for small or tabular slices) "
            "or fewer parties."
        ) from None
    dtype = part.x_train.dtype
    width = check_fits(model, part.sample_shape, name, dtype)
    if width != out_dim:
        raise ConfigError(f"model {name!r} outputs {width} values, expected {out_dim}")
    return init_parameters(model, generator).to(part.x_train.device if device is None else device)


def build_top(
    name: str,
    in_dim: int,
    num_classes: int,
    generator: torch.Generator,
    *,
    device: torch.device | str | None = None,
    **options: Any,
) -> nn.Module:
    """Build and seed top model ``name`` (on the CPU, see :func:`build_bottom`), then move it to ``device``."""
    entry = TOP_MODELS.get(name)
    TOP_MODELS.check(name, options, reserved=TOP_RESERVED, noun="option")
    model = init_parameters(entry.factory(in_dim=in_dim, num_classes=num_classes, **options), generator)
    return model if device is None else model.to(device)
