"""Bottom models for tabular and small image slices: logreg, mlp2, mlp3, lenet5."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from vflbench.models.registry import MODELS
from vflbench.registry import WIDTH, Param


def _mlp(in_dim: int, hidden: Sequence[int], out_dim: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_dim
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


@MODELS.register("logreg", summary="one fully connected layer (VLR's bottom model)")
def logreg(*, input_shape: Sequence[int], out_dim: int, meta: dict[str, Any] | None = None) -> nn.Module:
    """One Linear layer on the flattened slice."""
    return _mlp(math.prod(input_shape), (), out_dim)


@MODELS.register("mlp2", constraints={"hidden": WIDTH}, summary="2 fully connected layers with ReLU")
def mlp2(
    *, input_shape: Sequence[int], out_dim: int, meta: dict[str, Any] | None = None, hidden: int = 64
) -> nn.Module:
    """Flatten -> Linear(hidden) -> ReLU -> Linear(out_dim)."""
    return _mlp(math.prod(input_shape), (hidden,), out_dim)


@MODELS.register(
    "mlp3",
    constraints={"hidden": Param("units of the two hidden layers", ge=1, le=WIDTH.le)},
    summary="3 fully connected layers with ReLU (VMask's MLP3)",
)
def mlp3(
    *, input_shape: Sequence[int], out_dim: int, meta: dict[str, Any] | None = None, hidden: Sequence[int] = (256, 128)
) -> nn.Module:
    """Flatten -> Linear -> ReLU -> Linear -> ReLU -> Linear(out_dim)."""
    return _mlp(math.prod(input_shape), tuple(hidden), out_dim)


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al. 1998): 2 conv + 3 FC layers, ReLU and max pooling.

    The first convolution is padded by 2 so that a 28-pixel side keeps the classic geometry;
    the flattened width adapts to the party's strip (e.g. 1x28x14 for a half image).
    """

    def __init__(self, input_shape: Sequence[int], out_dim: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        h = ((height // 2) - 4) // 2
        w = ((width // 2) - 4) // 2
        if h < 1 or w < 1:
            raise ValueError(f"LeNet5 needs strips of at least 12x12 pixels, got {height}x{width}")
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * h * w, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, out_dim),
        )

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return self.classifier(self.features(x))


@MODELS.register("lenet5", summary="LeNet-5: 2 conv + 3 FC layers (VMask's MNIST/FMNIST model)")
def lenet5(*, input_shape: Sequence[int], out_dim: int, meta: dict[str, Any] | None = None) -> nn.Module:
    """LeNet-5 for an image strip of shape (C, H, W)."""
    return LeNet5(input_shape, out_dim)
