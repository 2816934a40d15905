"""Shared machinery of the malicious active-party feature attacks (DMAVFL, AGN, FSHA).

A malicious active party (DMAVFL §3.2) replaces the honest training task: :meth:`install`
returns a :class:`Takeover` hook that replaces the party's ``step`` (and, where the attack has a
classifier, ``predict``) by the attack's own, so the training loop itself is unchanged and the
victim applies whatever cut gradient the attack sends. The attack's models
(shadow model, decoder, discriminator) are added to what the party's ``models()`` returns, so
that they are checkpointed and reach the attacker's :class:`PartyView` (deep copies) after
training. The adversary's own bottom model f_a is the active party's bottom model.

Models (DMAVFL Appendix B, Table 10, adapted to our flat embeddings):

* shadow model / encoder f_e: the scenario's bottom architecture (``shadow_model``, default
  the config's ``model.bottom``, which every party knows) built for the victim's slice shape
  with the attacker's own random initialisation (DMAVFL §6.1: "configured identically to the
  passive clients' bottom model"); ``shadow_options`` are its model options;
* decoder f_d: for image strips a small CNN ("CNN layer * 3"): Linear to a 64-channel map of
  a quarter of the strip's height and width, two (2x nearest upsampling, 3x3 conv, BatchNorm,
  ReLU) stages with 32 and 16 channels, a 3x3 conv to the strip's channels and a sigmoid
  (images are in [0, 1]; DMAVFL: URVFL's tanh, mapped onto [0, 1]), cropped to the strip; for
  pixel-aligned embedding maps (``conv_map``) URVFL's three-convolution :class:`MapDecoder`; for
  tabular slices an MLP with two hidden layers of ``hidden`` units and a linear output
  ("MLP layer * 3");
* discriminators: MLPs on the (flat) embeddings with two hidden layers of ``hidden`` units and
  LeakyReLU(0.2) (URVFL's CNN discriminators act on spatial feature maps, which our bottoms do
  not output); DMAVFL's DAC can be a CNN on the embedding viewed as a map (:class:`ConvDAC`).

All attack models are initialised from the generator the runner grants to ``install`` (the
attack's own stream); auxiliary batches are drawn from the same generator.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.attacks.base import (
    AuxData,
    FeatureAttack,
    FeatureInference,
    PartyView,
    Phase,
    ReceivedEmbeddings,
    Scenario,
    ThreatGrant,
    require,
    require_training,
    victims_of,
)
from vflbench.data.base import PartySlice
from vflbench.errors import ConfigError
from vflbench.models import build_bottom, init_parameters
from vflbench.protocol import ActiveParty
from vflbench.protocol.hooks import PartyHook, PredictFn, StepFn
from vflbench.protocol.party import Party
from vflbench.registry import BATCH, LEARNING_RATE, MAX_WIDTH, WIDTH, Param

THREAT = "malicious active party with auxiliary labelled samples of the victim's feature space"
DMAVFL_PAPER = (
    "Yao et al., Leveraging Label Information for Stealthy Data Stealing in Vertical Federated Learning "
    "(DMAVFL, arXiv 2404.19582; URVFL, NDSS 2025); duanyiyao/URVFL"
)
EVAL_CHUNK = 1024


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, *, leaky: bool = False) -> nn.Sequential:
    """Linear layers with ReLU (or LeakyReLU(0.2)) between them; a linear output."""
    layers: list[nn.Module] = []
    width = in_dim
    for h in hidden:
        layers += [nn.Linear(width, h), nn.LeakyReLU(0.2) if leaky else nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


class ImageDecoder(nn.Module):
    """Flat vector -> image strip (C, H, W): Linear, two upsampling conv stages, conv, output.

    ``output``: ``"sigmoid"`` onto the pixel range [0, 1], or ``"tanh"``, URVFL's ``fullDecoder``
    output for pixels normalised to [-1, 1], mapped affinely onto our [0, 1] pixels as
    ``(1 + tanh(z)) / 2``: the same reconstruction, in the data's own units.
    """

    def __init__(
        self, in_dim: int, shape: Sequence[int], width: int = 64, output: Literal["sigmoid", "tanh"] = "sigmoid"
    ) -> None:
        super().__init__()
        if output not in ("sigmoid", "tanh"):
            raise ValueError(f"decoder output must be 'sigmoid' or 'tanh', got {output!r}")
        c, h, w = (int(s) for s in shape)
        self.shape = (c, h, w)
        self.output = output
        self.h0, self.w0 = math.ceil(h / 4), math.ceil(w / 4)
        self.width = width
        half, quarter = max(1, width // 2), max(1, width // 4)
        self.fc = nn.Linear(in_dim, width * self.h0 * self.w0)
        self.net = nn.Sequential(
            nn.ReLU(),
            nn.Upsample(scale_factor=2, mode="nearest"),
            nn.Conv2d(width, half, 3, padding=1),
            nn.BatchNorm2d(half),
            nn.ReLU(),
            nn.Upsample(scale_factor=2, mode="nearest"),
            nn.Conv2d(half, quarter, 3, padding=1),
            nn.BatchNorm2d(quarter),
            nn.ReLU(),
            nn.Conv2d(quarter, c, 3, padding=1),
        )

    def forward(self, z: Tensor) -> Tensor:  # noqa: D102
        c, h, w = self.shape
        out = self.net(self.fc(z).view(-1, self.width, self.h0, self.w0))[:, :, :h, :w]
        return torch.sigmoid(out) if self.output == "sigmoid" else (1 + torch.tanh(out)) / 2


class ConvDAC(nn.Module):
    """A CNN discriminator with auxiliary classifier on embeddings viewed as maps (C, H, W).

    DMAVFL Table 10's "CNN layer * 2" for MNIST, shaped like URVFL's ``CLSDiscriminator``: 3x3
    convolutions with stride 2 (``channels``, ReLU) on the embedding reshaped to ``shape``, then a
    Linear layer to ``out_dim`` logits.
    """

    def __init__(self, shape: Sequence[int], out_dim: int, channels: Sequence[int] = (32, 64)) -> None:
        super().__init__()
        c, h, w = (int(s) for s in shape)
        self.shape = (c, h, w)
        layers: list[nn.Module] = []
        width = c
        for ch in channels:
            layers += [nn.Conv2d(width, int(ch), 3, stride=2, padding=1), nn.ReLU()]
            width = int(ch)
            h, w = (h + 1) // 2, (w + 1) // 2
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(width * h * w, out_dim)

    def forward(self, z: Tensor) -> Tensor:  # noqa: D102
        return self.fc(self.features(z.view(-1, *self.shape)).flatten(1))


class BNConvDAC(nn.Module):
    """URVFL's ``CLSDiscriminator2`` (its detection runs' DAC) on embeddings viewed as maps (C, H, W).

    3x3 convolutions with ``channels`` (64, 128, 64) and ``strides`` (2, 2, 1), each followed by
    BatchNorm and ReLU, an adaptive average pool to ``pool`` (4 x 8), then a Linear layer to
    ``out_dim`` logits. In training mode the BatchNorm layers normalise each forward pass with its
    own batch's statistics (URVFL passes the victim's and the shadow's batches separately).
    """

    def __init__(
        self,
        shape: Sequence[int],
        out_dim: int,
        channels: Sequence[int] = (64, 128, 64),
        strides: Sequence[int] = (2, 2, 1),
        pool: Sequence[int] = (4, 8),
    ) -> None:
        super().__init__()
        if len(channels) != len(strides) or len(pool) != 2:
            raise ValueError(f"one stride per channel count and a 2-d pool, got {channels}, {strides}, {pool}")
        c, h, w = (int(s) for s in shape)
        self.shape = (c, h, w)
        layers: list[nn.Module] = []
        width = c
        for ch, stride in zip(channels, strides, strict=True):
            layers += [nn.Conv2d(width, int(ch), 3, stride=int(stride), padding=1), nn.BatchNorm2d(int(ch)), nn.ReLU()]
            width = int(ch)
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d((int(pool[0]), int(pool[1]))))
        self.fc = nn.Linear(width * int(pool[0]) * int(pool[1]), out_dim)

    def forward(self, z: Tensor) -> Tensor:  # noqa: D102
        return self.fc(self.features(z.view(-1, *self.shape)).flatten(1))


class MapDecoder(nn.Module):
    """Pixel-aligned embedding maps -> the victim's image strip, URVFL's ``fullDecoder``.

    For bottoms whose embedding is a (C, H, W) map aligned with the strip's pixels (``conv_map``,
    URVFL's ``ClientNet``). The decoder input ``f_a(x_a) || h`` is split back into the adversary's
    map (its first ``own_width`` values, ``own_width / (C * H)`` columns wide) and the victim's map
    ``victim_map``; the two are joined along the width, the victim's on the left (as the MNIST
    halves lie), and go through URVFL's three 3x3 convolutions (stride 1, padding 1): C ->
    ``width`` and ``width`` -> ``width // 2`` with BatchNorm and ReLU, then -> the strip's channels,
    and the output (``"tanh"`` mapped onto [0, 1] as ``(1 + tanh z) / 2``, or ``"sigmoid"``). The
    victim's columns are returned: Eq. (1) scores the target features only (URVFL decodes the full
    image and scores the target half).
    """

    def __init__(
        self,
        victim_map: Sequence[int],
        own_width: int,
        shape: Sequence[int],
        width: int = 32,
        output: Literal["sigmoid", "tanh"] = "tanh",
    ) -> None:
        super().__init__()
        if output not in ("sigmoid", "tanh"):
            raise ValueError(f"decoder output must be 'sigmoid' or 'tanh', got {output!r}")
        cm, hm, wm = (int(s) for s in victim_map)
        c, h, w = (int(s) for s in shape)
        if (hm, wm) != (h, w):
            raise ValueError(
                f"a map decoder needs an embedding map aligned with the victim's {h}x{w} strip, "
                f"got a {hm}x{wm} map (use a pixel-aligned bottom such as conv_map)"
            )
        if own_width % (cm * hm):
            raise ValueError(f"the adversary's embedding ({own_width} values) is not a {cm} x {hm} x W map")
        self.victim_map = (cm, hm, wm)
        self.own_width = own_width
        self.own_columns = own_width // (cm * hm)
        self.output = output
        half = max(1, width // 2)
        self.net = nn.Sequential(
            nn.Conv2d(cm, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, half, 3, padding=1),
            nn.BatchNorm2d(half),
            nn.ReLU(),
            nn.Conv2d(half, c, 3, padding=1),
        )

    def forward(self, z: Tensor) -> Tensor:  # noqa: D102
        cm, hm, wm = self.victim_map
        maps = [z[:, self.own_width :].reshape(-1, cm, hm, wm)]
        if self.own_width:
            maps.append(z[:, : self.own_width].reshape(-1, cm, hm, self.own_columns))
        out = self.net(torch.cat(maps, 3))[:, :, :, :wm]
        return torch.sigmoid(out) if self.output == "sigmoid" else (1 + torch.tanh(out)) / 2


def decoder_for(
    in_dim: int,
    sample: Tensor,
    *,
    hidden: int,
    width: int,
    output: Literal["sigmoid", "tanh"] = "sigmoid",
    victim_map: Sequence[int] | None = None,
    own_width: int = 0,
) -> nn.Module:
    """The decoder f_d from ``in_dim`` values to one sample shaped like ``sample`` (one row);
    ``output`` is the image decoder's output (tabular decoders are linear). With ``victim_map``
    (the (C, H, W) map the victim's embedding is) an image decoder is a :class:`MapDecoder` whose
    input starts with the adversary's ``own_width`` embedding values."""
    if sample.dim() == 3 and victim_map is not None:
        return MapDecoder(victim_map, own_width, tuple(sample.shape), width, output)
    if sample.dim() == 3:
        return ImageDecoder(in_dim, tuple(sample.shape), width, output)
    out = int(math.prod(sample.shape))
    return nn.Sequential(mlp(in_dim, (hidden, hidden), out), nn.Unflatten(1, tuple(sample.shape)))


def class_indices(targets: Tensor) -> Tensor:
    """Class indices of a batch of targets (soft rows decoded by argmax, one logit by rounding)."""
    if targets.dtype == torch.long:
        return targets
    if targets.dim() == 2:
        return targets.argmax(1)
    return targets.round().long()


class AuxBatches:
    """Batches of auxiliary row positions: a fresh permutation from ``generator`` each pass."""

    def __init__(self, n: int, generator: torch.Generator) -> None:
        self.n = n
        self.generator = generator
        self._order = torch.empty(0, dtype=torch.long)

    def next(self, size: int) -> Tensor:
        """The next ``size`` positions (``min(size, n)``), wrapping into a new permutation."""
        size = min(size, self.n)
        if len(self._order) < size:
            self._order = torch.cat([self._order, torch.randperm(self.n, generator=self.generator)])
        out, self._order = self._order[:size], self._order[size:]
        return out

    def epoch(self, size: int) -> list[Tensor]:
        """One pass over all rows in batches of ``size`` (a fresh permutation)."""
        order = torch.randperm(self.n, generator=self.generator)
        return [order[i : i + size] for i in range(0, self.n, size)]


class Takeover(PartyHook):
    """A malicious active party's own step (and maybe prediction and models) in place of the protocol's."""

    replaces_step = True
    prefix_models = False

    def __init__(
        self,
        name: str,
        *,
        step: StepFn,
        predict: PredictFn | None = None,
        models: dict[str, nn.Module] | None = None,
        honest_epochs: int = 0,
    ) -> None:
        super().__init__(name)
        if honest_epochs < 0:
            raise ValueError(f"honest_epochs must be >= 0, got {honest_epochs}")
        self._step = step
        self._predict = predict
        self._models = dict(models or {})
        self.honest_epochs = honest_epochs
        self._honest = honest_epochs > 0

    def step(
        self, ids: Tensor, received: Sequence[Tensor], *, epoch: int, step: int, senders: Sequence[str], proceed: StepFn
    ) -> list[Tensor]:
        """The attacker's step instead of the protocol's; the protocol's (honest) step during the first
        ``honest_epochs`` epochs."""
        self._honest = epoch < self.honest_epochs
        if self._honest:
            return proceed(ids, received, epoch=epoch, step=step, senders=senders)
        return self._step(ids, received, epoch=epoch, step=step, senders=senders)

    def predict(self, ids: Tensor, received: Sequence[Tensor], split: str, *, proceed: PredictFn) -> Tensor:  # noqa: D102
        return proceed(ids, received, split) if self._honest else (self._predict or proceed)(ids, received, split)

    def models(self) -> dict[str, nn.Module]:  # noqa: D102
        return self._models


def takeover_by(party: ActiveParty) -> str | None:
    """The name of the malicious attack that runs ``party``'s step, if any."""
    return next((hook.name for _, hook in party.hooks if hook.replaces_step), None)


def received_from(view: PartyView, sender: str) -> ReceivedEmbeddings:
    """The inference-time embeddings the view holds from ``sender``."""
    for r in view.received:
        if r.sender == sender:
            return r
    raise ConfigError(f"the attacker's view holds no embeddings from {sender!r}")


class SplitShadow(nn.Module):
    """One shadow model per target party (DMAVFL Table 6): splits the concatenated slices along
    the last axis by ``widths``, applies each party's shadow, concatenates the embeddings."""

    def __init__(self, shadows: Sequence[nn.Module], widths: Sequence[int]) -> None:
        super().__init__()
        self.shadows = nn.ModuleList(shadows)
        self.widths = tuple(int(w) for w in widths)

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return torch.cat([f(part) for f, part in zip(self.shadows, x.split(self.widths, -1), strict=True)], 1)


@dataclass
class Adversary:
    """The live state of one malicious active party during training."""

    party: ActiveParty
    aux: AuxData
    batches: AuxBatches
    generator: torch.Generator
    own: nn.Module | None
    shadow: nn.Module | None
    decoder: nn.Module
    discriminator: nn.Module
    optimizers: dict[str, torch.optim.Optimizer]


#: The parameters every feature attack takes: its auxiliary set and its targets.
AUX_CONSTRAINTS: Mapping[str, Param] = {
    "victim": Param("the passive party whose features are reconstructed"),
    "aux_size": Param("auxiliary rows, a count (takes precedence over aux_fraction)", ge=1),
    "aux_fraction": Param("auxiliary rows, a share of the training split", gt=0),
    "aux_classes": Param("the classes the auxiliary rows are drawn from (null: all)"),
    "target_split": Param("the split whose rows are reconstructed"),
    "n_targets": Param("rows of target_split reconstructed and scored (null: all)", ge=1),
    "shadow_model": Param("the attacker's model of the victim's bottom model (null: the victim's architecture)"),
    "shadow_options": Param("options of shadow_model"),
}
#: The decoder's sizes, where an attack trains one.
DECODER_CONSTRAINTS: Mapping[str, Param] = {
    "hidden": WIDTH,
    "decoder_width": Param("channels of the image decoder (units of a tabular one)", ge=4, le=MAX_WIDTH),
}


class MaliciousActiveAttack(FeatureAttack):
    """Base of the malicious active-party feature attacks (target ``features``, phase ``malicious``).

    Subclasses build their models in :meth:`build` and implement :meth:`attack_step`; the
    default reconstruction is ``f_d(cat(f_a(x_a), h_victim))`` with the embeddings the victim
    sends at inference time. Their auxiliary set is disjoint from the training set (``aux_disjoint``):
    the pool of held-out rows (``data.aux_pool``), all of it by default; ``aux_size`` (a count, which
    takes precedence) or ``aux_fraction`` (a share of the training split) take that many rows of it.
    """

    phase: ClassVar[Phase] = "malicious"
    aux_disjoint: ClassVar[bool] = True
    repeatable = False  # the reconstruction is the decoder trained during training
    reads = ("embedding",)
    threat = THREAT
    party = "active"
    has_shadow: ClassVar[bool] = True
    constraints: ClassVar[Mapping[str, Param]] = {
        **AUX_CONSTRAINTS,
        "aux_batch_size": BATCH,
        "lr": LEARNING_RATE,
        "disc_lr": Param("the discriminator's (or DAC's) learning rate", gt=0),
        **DECODER_CONSTRAINTS,
    }
    #: epochs of honest training (the protocol's step) before the attack takes over; a subclass may take it as
    #: a parameter
    honest_epochs: int = 0

    def __init__(
        self,
        *,
        victim: str | Sequence[str] = "passive_1",
        aux_size: int | None = None,
        aux_fraction: float | None = None,
        aux_classes: Sequence[int] | None = None,
        target_split: Literal["train", "test"] = "test",
        n_targets: int | None = None,
        aux_batch_size: int = 128,
        lr: float = 1e-4,
        shadow_model: str | None = None,
        shadow_options: dict[str, Any] | None = None,
        hidden: int = 256,
        decoder_width: int = 64,
    ) -> None:
        self.victim = victim
        self.aux_size = aux_size
        self.aux_fraction = aux_fraction
        self.aux_classes = aux_classes
        self.target_split = target_split
        self.n_targets = n_targets
        self.aux_batch_size = aux_batch_size
        self.lr = lr
        self.shadow_model = shadow_model
        self.shadow_options = shadow_options
        self.hidden = hidden
        self.decoder_width = decoder_width

    # -- threat model --------------------------------------------------------------------

    def check(self, scenario: Scenario) -> None:
        """Remember the public scenario (bottom architecture, embedding width, classes); refuse a training too short
        for the attack (:func:`~vflbench.attacks.base.require_training`)."""
        require(scenario.num_parties >= 2, self.name, "it needs at least one passive party")
        require_training(self, scenario, before=self.honest_epochs)
        self.scenario_ = scenario

    def install(self, party: Party, grant: ThreatGrant) -> Sequence[PartyHook]:
        """Build the adversary's models on the granted auxiliary set, run its pretraining; the hook takes over the
        party's ``step``."""
        require(isinstance(party, ActiveParty), self.name, "the attacker must be the active party")
        aux, generator = grant.aux, grant.generator
        require(aux is not None and generator is not None, self.name, "it needs its auxiliary set (data.aux_pool)")
        assert isinstance(party, ActiveParty) and aux is not None and generator is not None
        require(len(aux.ids) >= 2, self.name, "its auxiliary set needs at least 2 rows")
        require(
            takeover_by(party) is None,
            self.name,
            f"the active party is already run by malicious attack {takeover_by(party)!r}; "
            "configure one malicious active-party attack per run",
        )
        self.state_ = self.build(party, aux, generator)
        self.pretrain(self.state_)
        s = self.state_
        models: dict[str, nn.Module] = {"decoder": s.decoder, "discriminator": s.discriminator}
        if s.shadow is not None:
            models["shadow"] = s.shadow
        return (
            Takeover(
                self.name, step=self._step, predict=self.predictor(s), models=models, honest_epochs=self.honest_epochs
            ),
        )

    # -- building blocks ----------------------------------------------------------------

    def make_shadow(self, aux: AuxData, generator: torch.Generator) -> nn.Module:
        """f_e: the scenario's bottom architecture for the victim's slice, our own initialisation
        (with several target parties one per party, in a :class:`SplitShadow`)."""
        name = self.shadow_model or self.scenario_.bottom
        kind: Literal["image", "tabular"] = "image" if aux.victim.dim() == 4 else "tabular"

        def one(x: Tensor) -> nn.Module:
            part = PartySlice(x, x[:0], kind)
            return build_bottom(name, part, self.scenario_.embed_dim, generator, **(self.shadow_options or {}))

        if not aux.victim_widths:
            return one(aux.victim)
        return SplitShadow([one(x) for x in aux.victim.split(aux.victim_widths, -1)], aux.victim_widths)

    def victim_width(self) -> int:
        """Width of the (concatenated) embedding the victims send."""
        return self.scenario_.embed_dim * len(victims_of(self))

    def own_width(self, party: ActiveParty, aux: AuxData) -> int:
        """Width of the adversary's own embedding f_a(x_a) (0 when it holds no features)."""
        if party.bottom is None or aux.own is None:
            return 0
        with torch.no_grad():
            return int(party.bottom.eval()(aux.own[:2]).shape[1])

    def adam(self, modules: Sequence[nn.Module | None], lr: float, **kwargs: Any) -> torch.optim.Optimizer:
        """Adam over the parameters of ``modules``."""
        params = [p for m in modules if m is not None for p in m.parameters()]
        return torch.optim.Adam(params, lr=lr, **kwargs)

    @abstractmethod
    def build(self, party: ActiveParty, aux: AuxData, generator: torch.Generator) -> Adversary:
        """Create the adversary's models and optimizers."""

    def pretrain(self, state: Adversary) -> None:
        """Training before the VFL run starts (none by default)."""

    def predictor(self, state: Adversary) -> Callable[..., Tensor] | None:
        """A replacement for the party's ``predict`` (``None``: keep the honest one)."""
        return None

    @abstractmethod
    def attack_step(self, state: Adversary, ids: Tensor, h: Tensor, y: Tensor) -> tuple[Tensor, float]:
        """The malicious gradient for the victim's embedding ``h`` (a leaf) and the attack loss."""

    def _step(
        self, ids: Tensor, received: Sequence[Tensor], *, epoch: int, step: int, senders: Sequence[str]
    ) -> list[Tensor]:
        s = self.state_
        ks = [list(senders).index(v) for v in victims_of(self)]
        h = torch.cat([received[k] for k in ks], 1).detach().requires_grad_()
        y = class_indices(s.party.objective.targets[ids])
        g, loss = self.attack_step(s, ids, h, y)
        s.party.last_loss = loss
        # Only the victims are attacked (each gets its part of g); other passive parties receive zero gradients.
        grads = [torch.zeros_like(r) for r in received]
        for k, part in zip(ks, g.detach().split([received[k].shape[1] for k in ks], 1), strict=True):
            grads[k] = part
        return grads

    def reconstruction_loss(self, state: Adversary, rows: Tensor) -> Tensor:
        """Eq. (1): MSE(f_d(f_a(x_a) || f_e(x_p)), x_p) on auxiliary rows ``rows``."""
        aux = state.aux
        assert state.shadow is not None
        parts = []
        if state.own is not None and aux.own is not None:
            parts.append(state.own(aux.own[rows]))
        parts.append(state.shadow(aux.victim[rows]))
        return F.mse_loss(state.decoder(torch.cat(parts, 1)), aux.victim[rows])

    # -- reconstruction -----------------------------------------------------------------

    def decode(self, models: dict[str, nn.Module], own_x: Tensor | None, h: Tensor) -> Tensor:
        """x_t = f_d(f_a(x_a) || h) (DMAVFL §5.4)."""
        parts = []
        if own_x is not None and "bottom" in models:
            parts.append(models["bottom"](own_x))
        parts.append(h)
        return models["decoder"](torch.cat(parts, 1))

    @torch.no_grad()
    def infer(self, view: PartyView) -> FeatureInference:
        """Reconstruct the victim's slice of the target rows from what the victim sent (several
        victims: their slices, concatenated, from their embeddings, concatenated)."""
        parts = [received_from(view, v) for v in victims_of(self)]
        r = parts[0] if len(parts) == 1 else replace(parts[0], embeddings=torch.cat([p.embeddings for p in parts], 1))
        for m in view.models.values():
            m.eval()
        own_all = None
        if view.data is not None:
            own_all = view.data.x_test if r.split == "test" else view.data.x_train
        chunks = []
        for i in range(0, len(r.ids), EVAL_CHUNK):
            ids = r.ids[i : i + EVAL_CHUNK]
            own_x = own_all[ids] if own_all is not None else None
            chunks.append(self.decode(view.models, own_x, r.embeddings[i : i + EVAL_CHUNK]))
        features = torch.cat(chunks) if chunks else torch.empty(0)
        shadow = view.models.get("shadow") if self.has_shadow else None
        return FeatureInference(
            r.ids,
            features,
            r.split,
            shadow=shadow,
            details={"aux_rows": len(view.aux.ids) if view.aux is not None else 0},
        )


def seeded(module: nn.Module, generator: torch.Generator, like: Tensor) -> nn.Module:
    """Initialise ``module`` from ``generator`` (the attack's own stream, drawn on the CPU) and move it to the
    device of ``like`` (the data it will run on)."""
    return init_parameters(module, generator).to(like.device)
