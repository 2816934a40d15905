"""Defenses on the embedding path of a passive party: Gaussian embedding noise and FedPass's private
passport layers (keys drawn from the defense's bound generator).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from vflbench.defenses import DEFENSES
from vflbench.defenses.building import needs_width, normal_like
from vflbench.errors import CompatibilityError
from vflbench.models.base import init_parameters, linear_layers
from vflbench.protocol.hooks import Defense, StepState
from vflbench.protocol.messages import ACTIVE
from vflbench.registry import WIDTH, Param


@DEFENSES.register(summary="Gaussian noise N(0, sigma^2) on every embedding a passive party sends")
class EmbeddingNoise(Defense):
    """Obfuscation with random noise (He, Zhang, Lee 2020; DMAVFL Table 8): ``h + N(0, sigma^2 I)``.

    Added by each passive party to every embedding it sends, in training and in evaluation (the
    noise is part of the party's protocol, so test-time queries are protected too). DMAVFL sweeps
    sigma over 0.1 ... 0.7; the default 0.5 is the middle of its stated 0.2 ... 0.8 range.
    ``sigma=0`` is the identity.
    """

    name = "embedding_noise"
    side = "passive"
    paper = "He, Zhang, Lee, Attacking and Protecting Data Privacy in Edge-Cloud Collaborative Inference Systems (2020)"
    protects = ("features", "labels")
    threat = "feature reconstruction or label inference from a passive party's embeddings"
    strength_param = "sigma"
    constraints: ClassVar[Mapping[str, Param]] = {"sigma": Param("the Gaussian noise's standard deviation", ge=0)}
    strength_direction = "larger is stronger"

    def __init__(self, *, sigma: float = 0.5) -> None:
        self.sigma = sigma

    def transform_embedding(self, embedding: Tensor, state: StepState) -> Tensor:  # noqa: D102
        if self.sigma == 0:
            return embedding
        return embedding + self.sigma * normal_like(embedding.shape, self.context_.generator, embedding)


class PassportLayer(nn.Module):
    """FATE's ``LinearPassportBlock``: ``tanh(gamma) * W2 W1 x + tanh(beta)``.

    gamma and beta come from the private passport keys (fixed buffers): each key goes through
    the same two linear layers, is averaged over the passports, and through an autoencoder
    ``Linear(d -> d/4, no bias) -> LeakyReLU -> Linear(d/4 -> d, no bias)``.
    """

    skey: Tensor
    bkey: Tensor

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        hidden: int,
        key_loc: float,
        key_scale: float,
        num_passport: int,
        generator: torch.Generator,
    ) -> None:
        super().__init__()
        self.linear1 = nn.Linear(in_dim, hidden)
        self.linear2 = nn.Linear(hidden, out_dim)
        code = max(1, out_dim // 4)
        self.encode = nn.Linear(out_dim, code, bias=False)
        self.act = nn.LeakyReLU()
        self.decode = nn.Linear(code, out_dim, bias=False)
        init_parameters(self, generator)
        shape = (num_passport, in_dim)
        self.register_buffer("skey", torch.randn(shape, generator=generator) * key_scale + key_loc)
        self.register_buffer("bkey", torch.randn(shape, generator=generator) * key_scale + key_loc)

    def _from_key(self, key: Tensor) -> Tensor:
        k = self.linear2(self.linear1(key)).mean(0, keepdim=True)
        return self.decode(self.act(self.encode(k)))

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        out = self.linear2(self.linear1(x.flatten(1)))
        return torch.tanh(self._from_key(self.skey)) * out + torch.tanh(self._from_key(self.bkey))


@DEFENSES.register(summary="FedPass: private passport layers after each bottom model (and at the active party)")
class FedPass(Defense):
    """FedPass (Gu et al., IJCAI 2023), after FATE's passport blocks.

    Every passive party appends a :class:`PassportLayer` (d -> hidden -> d) to its bottom model,
    with private keys drawn from ``N(key_loc, key_scale^2)`` (FATE defaults: loc -1, scale 1,
    one passport, hidden 128) by its own bound generator. The active party adds one too:
    ``active_passport="bottom"`` on its own bottom output (FATE's guest aggregation layer; no
    effect in VSNN, where it has no bottom), ``"top"`` in front of the top model (on the whole
    aggregated input), or ``"none"``. The new layers are trained end to end by their owner.
    Strength = ``key_scale``: FedPass's obfuscation grows with the passports' spread (VMask used
    loc -1, variance 0.5).
    """

    name = "fedpass"
    side = "both"
    paper = (
        "Gu et al., FedPass: Privacy-Preserving Vertical Federated Deep Learning with Adaptive Obfuscation (IJCAI 2023)"
    )
    protects = ("features", "labels")
    threat = "feature reconstruction and label inference from embeddings, gradients or bottom models"
    strength_param = "key_scale"
    constraints: ClassVar[Mapping[str, Param]] = {
        "key_scale": Param("standard deviation of the passport keys", ge=0),
        "key_loc": Param("mean of the passport keys"),
        "hidden": WIDTH,
        "num_passport": Param("passport layers", ge=1),
        "active_passport": Param("where the active party's passport sits: bottom, top or none"),
    }
    strength_direction = "larger is stronger"

    def __init__(
        self,
        *,
        key_scale: float = 1.0,
        key_loc: float = -1.0,
        hidden: int = 128,
        num_passport: int = 1,
        active_passport: Literal["bottom", "top", "none"] = "bottom",
    ) -> None:
        self.key_scale = key_scale
        self.key_loc = key_loc
        self.hidden = hidden
        self.num_passport = num_passport
        self.active_passport = active_passport

    def _passport(self, in_dim: int, out_dim: int) -> PassportLayer:
        return PassportLayer(
            in_dim,
            out_dim,
            hidden=self.hidden,
            key_loc=self.key_loc,
            key_scale=self.key_scale,
            num_passport=self.num_passport,
            generator=self.context_.generator,
        )

    def wrap_bottom(self, model: nn.Module, party: str) -> nn.Module:  # noqa: D102
        if party != self.context_.party or (party == ACTIVE and self.active_passport != "bottom"):
            return model  # the active instance also sees the passive bottoms: leave them to their owners
        width = needs_width(model, "fedpass")
        return nn.Sequential(model, self._passport(width, width))

    def wrap_top(self, model: nn.Module) -> nn.Module:  # noqa: D102
        if self.active_passport != "top":
            return model
        layers = linear_layers(model)
        if not layers or not isinstance(layers[0], nn.Linear):
            raise CompatibilityError(
                "fedpass with active_passport: top needs a top model that starts with a "
                "Linear layer (to know its input width); use active_passport: bottom."
            )
        width = layers[0].in_features
        return nn.Sequential(self._passport(width, width), model)
