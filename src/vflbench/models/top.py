"""Top models (on the aggregated embedding) and the attacker's inference head."""

from __future__ import annotations

from torch import Tensor, nn

from vflbench.models.registry import TOP_MODELS
from vflbench.registry import WIDTH


@TOP_MODELS.register(
    "mlp2", constraints={"hidden": WIDTH}, summary="Linear -> ReLU -> Linear (VMask's top model and inference head)"
)
def top_mlp2(*, in_dim: int, num_classes: int, hidden: int = 64) -> nn.Module:
    """Two fully connected layers."""
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


@TOP_MODELS.register("linear", summary="one fully connected layer")
def top_linear(*, in_dim: int, num_classes: int) -> nn.Module:
    """One Linear layer."""
    return nn.Linear(in_dim, num_classes)


class Identity(nn.Module):
    """Passes the aggregated logits through: VLR's top (the sigmoid/softmax is in the loss)."""

    def forward(self, z: Tensor) -> Tensor:  # noqa: D102
        return z


@TOP_MODELS.register("identity", summary="no top model: the summed bottom outputs are the logits (VLR)")
def top_identity(*, in_dim: int, num_classes: int) -> nn.Module:
    """Identity top model; needs sum aggregation and bottom outputs of the logit width."""
    return Identity()


def inference_head(in_dim: int, num_classes: int, hidden: int = 64) -> nn.Module:
    """The model-completion attacker's head: MLP2 on the bottom model's output (VMask)."""
    return top_mlp2(in_dim=in_dim, num_classes=num_classes, hidden=hidden)
