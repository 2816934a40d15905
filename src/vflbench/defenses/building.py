"""Building blocks shared by the regularising defenses: a module that keeps its
extra loss, Gaussian KL and noise from the defense's generator, and a bottom model's output width.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from vflbench.errors import CompatibilityError
from vflbench.models.base import linear_layers

DcorForm = Literal["dcor", "log"]


class StoresLoss(nn.Module):
    """A wrapper that keeps its last training-forward loss term in ``loss_`` until taken.

    ``loss_`` holds autograd history, so it is left out of copies and pickles (attackers and
    checkpoints copy models).
    """

    loss_: Tensor | None

    def take_loss(self) -> Tensor | None:
        """The stored loss term (once), or ``None``."""
        loss, self.loss_ = self.loss_, None
        return loss

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["loss_"] = None
        return state


def gaussian_kl(mu: Tensor, sigma: Tensor) -> Tensor:
    """KL(N(mu, sigma^2) || N(0, 1)): summed over dimensions, averaged over the batch."""
    return (-0.5 * (1 + 2 * torch.log(sigma) - mu.pow(2) - sigma.pow(2))).sum(1).mean()


def normal_like(shape: torch.Size, generator: torch.Generator, like: Tensor) -> Tensor:
    """Standard normal noise of ``shape`` from ``generator``, with ``like``'s dtype and device."""
    return torch.randn(shape, generator=generator, dtype=like.dtype).to(like.device)


def output_width(model: nn.Module) -> int | None:
    """A bottom model's embedding width: ``out_features`` of its last Linear layer (zoo models end in one)."""
    layers = linear_layers(model)
    return layers[-1].out_features if layers and isinstance(layers[-1], nn.Linear) else None


def needs_width(model: nn.Module, defense: str) -> int:
    """:func:`output_width`, or a clear error naming ``defense`` when the model does not end in a Linear layer."""
    width = output_width(model)
    if width is None:
        raise CompatibilityError(
            f"{defense} needs a bottom model that ends in a Linear layer (to know its "
            f"embedding width); {type(model).__name__} does not."
        )
    return width
