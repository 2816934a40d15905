"""Variational bottlenecks: MID (on every embedding, at the active party) and PRECODE (after each
passive bottom model).

Every random draw inside them (reparameterisation noise) comes from the defense's bound generator,
so that a run is a function of its seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.defenses import DEFENSES
from vflbench.defenses.building import (
    StoresLoss,
    gaussian_kl,
    needs_width,
    normal_like,
)
from vflbench.errors import CompatibilityError
from vflbench.models.base import init_parameters, linear_layers
from vflbench.models.top import Identity
from vflbench.protocol.hooks import BindContext, Defense, StepState
from vflbench.protocol.messages import ACTIVE
from vflbench.registry import Param


class _MIDLayer(nn.Module):
    """VFLAIR's MID bottleneck on one embedding: variational encoder, sample, decoder (all ReLU'd)."""

    def __init__(self, width: int, *, bottleneck_scale: float, std_shift: float, generator: torch.Generator) -> None:
        super().__init__()
        k = max(1, int(round(width * bottleneck_scale)))
        self.k = k
        self.std_shift = std_shift
        self.enlarge = nn.Linear(width, 2 * k)
        self.decoder = nn.Sequential(nn.Linear(k, 5 * k), nn.ReLU(), nn.Linear(5 * k, width), nn.ReLU())
        self.generator = generator
        init_parameters(self, generator)

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        e = F.relu(self.enlarge(h))
        mu, sigma = e[:, : self.k], F.softplus(e[:, self.k :] - self.std_shift)
        z = mu + sigma * normal_like(mu.shape, self.generator, mu)  # sampled in evaluation too (VFLAIR)
        return self.decoder(z), gaussian_kl(mu, sigma)


class _MIDTop(StoresLoss):
    """The top model behind one MID layer per passive slice of the concatenated input."""

    def __init__(self, top: nn.Module, slices: list[tuple[int, int, _MIDLayer | None]]) -> None:
        super().__init__()
        self.top = top
        self.bounds = [(s, e) for s, e, _ in slices]
        self.mids = nn.ModuleList([m for _, _, m in slices if m is not None])
        self.which = [m is not None for _, _, m in slices]
        self.loss_ = None

    def forward(self, z: Tensor) -> Tensor:
        parts, kls = [], []
        mids = iter(self.mids)
        for (s, e), through in zip(self.bounds, self.which, strict=True):
            part = z[:, s:e]
            if through:
                part, kl = next(mids)(part)
                kls.append(kl)
            parts.append(part)
        self.loss_ = torch.stack(kls).sum() if self.training and kls else None
        return self.top(torch.cat(parts, 1))


@DEFENSES.register(
    summary="Mutual Information regularization Defense: a variational bottleneck per "
    "passive embedding at the active party (concat aggregation)"
)
class MutualInformationDefense(Defense):
    """MID (Zou et al., 2023), as in the authors' VFLAIR code.

    The active party passes each received passive embedding (its slice of the concatenated
    top-model input) through its own bottleneck: ``h = ReLU(Linear(d -> 2*d*s)(x))`` split into
    mu and raw sigma, ``sigma = softplus(raw - std_shift)``, ``z = mu + sigma*eps`` (eps from
    the bound generator, resampled in evaluation too), decoder
    ``Linear(d*s -> 5*d*s) -> ReLU -> Linear(-> d) -> ReLU``; its own slice is left as it is.
    ``loss += weight * sum_k mean_batch(sum_dim KL(N(mu, sigma) || N(0, 1)))``. The MID layers
    belong to the active party (its optimizer trains them).

    Needs concatenation with a real top model: not VLR (identity top) and not sum/mean
    aggregation (the slices are lost). ``std_shift`` is 0.5 by default; VFLAIR uses 5 for its
    image datasets (MNIST, CIFAR, NUS-WIDE). Weight 1e-3 is VFLAIR's default (VMask used 5e-5).
    """

    name = "mid"
    side = "active"
    paper = "Zou et al., Mutual Information Regularization for Vertical Federated Learning (2023)"
    protects = ("labels",)
    threat = "label inference from passive embeddings, cut gradients or bottom models"
    strength_param = "weight"
    constraints: ClassVar[Mapping[str, Param]] = {
        "weight": Param("the KL term's weight", ge=0),
        "std_shift": Param("shift of the bottleneck's standard deviation"),
        "bottleneck_scale": Param("the bottleneck's width, as a share of the embedding's", gt=0),
    }
    strength_direction = "larger is stronger"

    def __init__(self, *, weight: float = 1e-3, std_shift: float = 0.5, bottleneck_scale: float = 1.0) -> None:
        self.weight = weight
        self.std_shift = std_shift
        self.bottleneck_scale = bottleneck_scale

    def bind(self, context: BindContext) -> None:  # noqa: D102
        super().bind(context)
        if context.algorithm == "vlr":
            raise CompatibilityError(
                "mid needs a top model on concatenated embeddings; VLR has none "
                "(its identity top sums the bottoms' logits). Use vhnn or vsnn."
            )
        aggregation = context.aggregation
        if aggregation not in (None, "concat"):
            raise CompatibilityError(f"mid needs train.aggregation: concat, not {aggregation!r}")
        self.top_: _MIDTop | None = None

    def wrap_top(self, model: nn.Module) -> nn.Module:
        """The top model behind a MID layer on each passive party's slice of its input (the slices of the top
        model's input layout, ``BindContext.top_layout``); the active party's own slice passes as it is."""
        layers = linear_layers(model)
        if isinstance(model, Identity) or not layers or not isinstance(layers[0], nn.Linear):
            raise CompatibilityError(
                "mid needs a top model that starts with a Linear layer on the concatenated "
                "embeddings; the identity top (VLR) has none."
            )
        layout = self.context_.top_layout
        if layout is None:
            raise CompatibilityError(
                "mid needs the top model's input layout (BindContext.top_layout, given to the active party's "
                "instance by Defense.bind_top before its models are built)"
            )
        if layout.how != "concat":
            raise CompatibilityError(
                "mid needs train.aggregation: concat; with sum or mean the per-party "
                "embeddings cannot be separated at the top model."
            )
        in_dim = layers[0].in_features
        if layout.width != in_dim:
            widths = {p.party: p.width for p in layout.parts}
            raise CompatibilityError(
                f"mid cannot split the top model's input of width {in_dim} into the parties' "
                f"embeddings (widths {widths})."
            )
        slices = [
            (
                p.start,
                p.end,
                None
                if p.party == ACTIVE
                else _MIDLayer(
                    p.width,
                    bottleneck_scale=self.bottleneck_scale,
                    std_shift=self.std_shift,
                    generator=self.context_.generator,
                ),
            )
            for p in layout.parts
        ]
        self.top_ = _MIDTop(model, slices)
        return self.top_

    def regularizer(self, state: StepState) -> Tensor | None:  # noqa: D102
        kl = self.top_.take_loss() if self.top_ is not None else None
        if kl is None or self.weight == 0:
            return None
        return self.weight * kl


class VariationalBottleneck(StoresLoss):
    """PRECODE's variational bottleneck behind a bottom model.

    ``Linear(d -> 2K)``: mu = first K, ``sigma = softplus(rest)``; ``z = mu + sigma*eps`` in
    training (eps from the bound generator), ``z = mu`` in evaluation; ``Linear(K -> d)``. Keeps
    ``KL(N(mu, sigma) || N(0, 1)) / ln 2`` (bits, averaged over the batch) of each training forward.
    """

    def __init__(self, bottom: nn.Module, width: int, *, bottleneck_dim: int, generator: torch.Generator) -> None:
        super().__init__()
        self.bottom = bottom
        self.k = bottleneck_dim
        self.encoder = nn.Linear(width, 2 * bottleneck_dim)
        self.decoder = nn.Linear(bottleneck_dim, width)
        self.generator = generator
        init_parameters(self.encoder, generator)
        init_parameters(self.decoder, generator)
        self.loss_ = None

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        h = self.bottom(x)
        s = self.encoder(h.flatten(1))
        mu, sigma = s[:, : self.k], F.softplus(s[:, self.k :])
        z = mu + sigma * normal_like(mu.shape, self.generator, mu) if self.training else mu
        self.loss_ = gaussian_kl(mu, sigma) / math.log(2) if self.training else None
        return self.decoder(z).view_as(h)


@DEFENSES.register(summary="PRECODE: a variational bottleneck after each passive bottom model")
class Precode(Defense):
    """PRECODE (Scheliga et al., WACV 2022) at each passive party, as Kang et al. evaluate it.

    A :class:`VariationalBottleneck` (K = ``bottleneck_dim``, default 256 as in the authors'
    code) is appended to the passive party's bottom model and trained by it, with
    ``beta * KL / ln 2`` (beta 1e-3, the code's default) added to its backward.
    Parameter-free in Kang et al. (no strength knob).
    """

    name = "precode"
    side = "passive"
    paper = (
        "Scheliga, Maeder, Seeland, PRECODE - A Generic Model Extension to Prevent Deep Gradient Leakage (WACV 2022)"
    )
    protects = ("features",)
    threat = "feature reconstruction (model inversion) from a passive party's embeddings"
    strength_param = None

    constraints: ClassVar[Mapping[str, Param]] = {
        "beta": Param("the KL term's weight", ge=0),
        "bottleneck_dim": Param("the bottleneck's width", ge=1),
    }

    def __init__(self, *, beta: float = 1e-3, bottleneck_dim: int = 256) -> None:
        self.beta = beta
        self.bottleneck_dim = bottleneck_dim

    def bind(self, context: BindContext) -> None:  # noqa: D102
        super().bind(context)
        self.bottleneck_: VariationalBottleneck | None = None

    def wrap_bottom(self, model: nn.Module, party: str) -> nn.Module:  # noqa: D102
        if party != self.context_.party:
            return model
        self.bottleneck_ = VariationalBottleneck(
            model, needs_width(model, "precode"), bottleneck_dim=self.bottleneck_dim, generator=self.context_.generator
        )
        return self.bottleneck_

    def regularizer(self, state: StepState) -> Tensor | None:  # noqa: D102
        kl = self.bottleneck_.take_loss() if self.bottleneck_ is not None else None
        if kl is None or self.beta == 0:
            return None
        return self.beta * kl
