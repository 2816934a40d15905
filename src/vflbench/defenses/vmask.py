"""VMask (Tan et al., NDSS 2025): secret-shared layer masking of the passive parties' bottom
models, with a shadow model and a tunable privacy budget, against model completion.

Per passive party P_k (Algorithm 4): the first linear layer is masked before training
(initialisation); every epoch runs the secure model update (Algorithm 5: masked layers forward and
backward on shares, :mod:`vflbench.mpc`), then the active party trains a shadow copy of P_k's
bottom model on its auxiliary set with the top model frozen (Algorithm 6), adds the shadow's
per-layer L1 gradient norms to the accumulated norms G, and selects the layers to mask next epoch
(Algorithm 2): in decreasing order of G it masks layers until a model completion attack simulated
on the shadow model (with those layers re-randomised, Algorithm 3) falls to the privacy budget.
Layer masking (Algorithm 1) then shares newly selected layers (the active party adds N(0, sigma^2)
to its share) and reconstructs deselected ones to P_k (after fresh noise from the active party).

Variants: ``vmask_as`` selects accumulatively (masked layers stay masked), ``vmask_rs`` masks as
many layers as VMask would, chosen at random, ``vmask_alls`` masks every eligible layer throughout.

Simulation notes (also in docs/decisions/vmask.md):

* One class per role under one registered name and one parameter set (:meth:`VMask.halves`), and only the
  local party's half is built; the halves share no Python objects: P_k's half (:class:`VMaskPassive`) masks its
  own bottom model (:mod:`vflbench.mpc.masking`) and runs every protocol step as a ``vmask.<step>`` request to
  the active party; the active half (:class:`VMaskActive`) answers with its shares
  (:class:`~vflbench.mpc.parties.ActiveShares`), keeps a shadow of each P_k's bottom model (its architecture is
  public; its initial values come in P_k's ``vmask.setup`` message, Algorithm 4 line 2) and sends each mask
  decision as a ``vmask.select`` request. Beaver triples come from the dealer (:class:`VMaskDealer`), a third
  party of the channel (``dealer.*``). All of it is counted by the channel.
* Each masked layer keeps the same parameter objects throughout (the plaintext weight while
  unmasked, a zero offset that carries P_k's update while masked), so P_k's optimizer, including
  its momentum, is unaffected by (un)masking. A torch optimizer's weight decay does not reach a
  masked weight (it decays the zero offset).
* The shadow model's top-model input for the active party's own embedding is zero (Algorithm 6:
  the active party's bottom model takes no part); the shadow's "gradient norm at this epoch" is the
  L1 norm summed over the epoch's shadow steps; the simulated attack trains on ``known_per_class``
  labels per class of the auxiliary set and is scored on the rest of it (its best epoch).
* The attacker's copy of its model (``attacker_copy``, an :class:`AttackerBottom`) carries, for
  each layer masked at the end, a fresh initialisation (``attacker_view="reinit"``, the attacker the
  paper evaluates and Algorithm 2 simulates) or P_k's decoded share (``"share"``, Algorithm 1 line 7).
  Neither is what P_k can know: every masked layer has a declared observation point
  (:class:`~vflbench.mpc.observation.ObservationPoint`) through which P_k's own code sees its weight
  before masking and every value reconstructed to it, from which the attack ``vmask_weight_recovery``
  solves for the effective weights (the ``recovered`` view; docs/decisions/vmask.md). Its own record alone (weight
  before masking plus its own updates, no solve) is the attack ``vmask_own_record``.
* Before training, the paper's own preconditions (§IV-D: ``B < n_in`` for FC layers,
  ``n > (h+2p+s)/(s+1)`` for conv layers) are checked for every eligible layer; violations are
  logged as a warning and reported (with the recovery channels that apply to each layer) in
  ``details()``, which goes into result.json's defense entry. The check needs only the shape of one
  row of P_k's slice, which P_k sends in its ``vmask.setup`` message (its own slice's shape, public as
  the configuration), so it runs without auxiliary rows.
* ``vmask_alls`` runs no shadow model and no selection, so it takes no auxiliary set (``uses_aux``
  false): a run with it holds out only what ``data.aux_pool`` says, and it refuses ``aux_size``.
"""

from __future__ import annotations

import copy
import logging
import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.data.base import PartySlice
from vflbench.defenses import DEFENSES
from vflbench.errors import CompatibilityError
from vflbench.models import init_parameters
from vflbench.models.finetune import complete, complete_stacked, stackable
from vflbench.mpc.dealer import Dealer, DealerService
from vflbench.mpc.layers import Truncation
from vflbench.mpc.masking import VMaskBottom, make_maskable
from vflbench.mpc.parties import (
    PROTOCOL_KINDS,
    ActiveShareHolder,
    ActiveShares,
    Protocol,
    resolve_protocol,
    resolve_row_blocks,
)
from vflbench.protocol.channel import Endpoint
from vflbench.protocol.hooks import BindContext, Defense, DefenseAux, TrainSettings
from vflbench.protocol.messages import ACTIVE, DEALER, PASSIVE, Message, Phase, Scalar
from vflbench.protocol.party import aggregate
from vflbench.protocol.surface import requests
from vflbench.registry import Param
from vflbench.rng import derive_seed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerCondition:
    """The paper's precondition (§IV-D) for one masked-eligible layer, and the recovery channels.

    ``paper_secure``: whether the layer meets the paper's condition (FC: ``B < n_in``; conv:
    ``n > (h+2p+s)/(s+1)`` on every spatial axis). ``forward_batches``: the number of batches of
    one masking episode after which the forward openings alone give as many equations as unknowns
    (``ceil((n_in+1)/B)`` for FC); ``backward_batches``: the same for the input-gradient openings
    (``ceil(n_out/B)`` for FC), ``None`` when P_k receives no input gradient (the layer's input is
    the data). Either channel solves the layer when its inputs are not degenerate, whatever the
    paper's condition says (docs/decisions/vmask.md).
    """

    layer: int
    name: str
    kind: Literal["linear", "conv"]
    paper_condition: str
    paper_secure: bool
    forward_batches: int
    backward_batches: int | None


def layer_conditions(model: nn.Module, x: Tensor, batch_size: int) -> list[LayerCondition]:
    """Check the paper's §IV-D preconditions for every Linear/Conv2d of ``model`` (plaintext) on
    inputs shaped like ``x`` (a few rows) with training batches of ``batch_size``."""
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    seen: dict[str, tuple[torch.Size, bool, torch.Size]] = {}

    def hook(name: str) -> Any:
        def record(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
            seen.setdefault(name, (inputs[0].shape, inputs[0].requires_grad, output.shape))

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in layers]
    was = model.training
    model.eval()
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was)
    out = []
    rows = len(x)
    for i, (name, m) in enumerate(layers):
        if name not in seen:
            continue
        in_shape, needs_grad, out_shape = seen[name]
        if isinstance(m, nn.Linear):
            per_row = max(1, in_shape.numel() // (rows * m.in_features))
            eq = batch_size * per_row
            out.append(
                LayerCondition(
                    i,
                    name,
                    "linear",
                    f"B < n_in ({batch_size} < {m.in_features})",
                    batch_size < m.in_features,
                    math.ceil((m.in_features + 1) / eq),
                    math.ceil(m.out_features / eq) if needs_grad else None,
                )
            )
            continue
        kh, kw = m.kernel_size
        ph, pw = m.padding if isinstance(m.padding, tuple) else (0, 0)
        sh, sw = m.stride
        h, w = int(in_shape[2]), int(in_shape[3])
        secure = all(n > (size + 2 * p + s) / (s + 1) for n, size, p, s in ((kh, h, ph, sh), (kw, w, pw, sw)))
        fwd_rows = batch_size * int(out_shape[2]) * int(out_shape[3])
        bwd_rows = batch_size * h * w
        out.append(
            LayerCondition(
                i,
                name,
                "conv",
                f"n > (h+2p+s)/(s+1) on both axes (n={kh}x{kw}, h={h}x{w}, p={ph},{pw}, s={sh},{sw})",
                secure,
                math.ceil((m.in_channels * kh * kw + 1) / fwd_rows),
                math.ceil(m.out_channels * kh * kw / bwd_rows) if needs_grad else None,
            )
        )
    return out


@dataclass
class PartyState:
    """The active party's VMask state for one passive party: its shadow of P_k's bottom model, the
    layers it told P_k to mask (``masked``, every decision in ``history``) and the accumulated norms."""

    shadow: nn.Module
    shadow_opt: torch.optim.Optimizer
    masked: set[int]
    grad_norm: Tensor
    history: list[list[int]] = field(default_factory=list)
    estimates: list[float] = field(default_factory=list)
    steps: int = 1
    """How many layers the last selection's loop added (a forecast of the next; 1 before the first)."""


def _on(t: Tensor | None, device: torch.device | None) -> Tensor | None:
    """``t`` on ``device`` (unchanged when either is ``None``)."""
    return t if t is None or device is None else t.to(device)


def _layer_list(text: object) -> set[int]:
    return {int(i) for i in str(text).split(",") if i}


def _input_shape(party: str, text: object) -> tuple[int, ...]:
    """The shape of one row of ``party``'s slice from its ``vmask.setup`` header (``"1,28,14"``), checked."""
    try:
        shape = tuple(int(i) for i in str(text).split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1 or math.prod(shape) > 1 << 31:
        raise CompatibilityError(
            f"vmask: {party!r} sent input_shape {text!r} in vmask.setup; expected the shape of "
            "one row of its slice as positive integers joined by commas (e.g. '1,28,14')"
        )
    return shape


def start_dealer(
    link: Endpoint, active_generator: torch.Generator, *, device: torch.device | None = None
) -> DealerService:
    """Run VMask's trusted dealer at ``link`` (its own party, :data:`~vflbench.protocol.messages.DEALER`).

    Seeded as before the parties were split (from the first draw of the active VMask instance's
    generator ``active_generator``, a fresh generator on the same seed path), so that runs repeat
    their earlier numbers; the dealer keeps no other tie to either party (docs/decisions/vmask.md). ``device``:
    where it computes and delivers its triples (drawn on the CPU: the same triples on every device).
    """
    seed = int(torch.randint(0, 2**62, (1,), generator=active_generator))
    return DealerService(
        Dealer(torch.Generator().manual_seed(derive_seed(seed, "dealer")), name="vmask-dealer", device=device), link
    )


@DEFENSES.register(summary="secret-shared layer masking with shadow-model layer selection under a privacy budget")
class VMask(Defense):
    """VMask (Tan et al., NDSS 2025), Algorithm 4 with layer selection with replacement.

    The simulated model completion of Algorithms 2-3 fine-tunes for ``mc_epochs`` epochs (T') with
    ``mc_optimizer``, ``mc_lr``, ``mc_batch_size`` (``"full"``: full batch) and ``mc_momentum``.
    Algorithm 3 names no optimiser or batching, and the estimate is only useful if it simulates
    the attack the defender fears, so each of these left ``None`` (the default) is taken from the
    configured ``model_completion`` attack, else from model completion's defaults (Adam lr 1e-3,
    batch 16; docs/decisions/vmask.md). The auxiliary set is disjoint from the rows the federation trains on
    (§IV-A): the pool of held-out rows (``data.aux_pool``, which every run of the config holds out, defended or
    not), all of it, or ``aux_size`` rows of it.
    ``shadow_epochs`` (default 1, as Algorithm 6) passes over the auxiliary set per VFL epoch let
    a run shortened to fewer VFL epochs give the shadow model the paper's number of steps.
    ``protocol``: how the masked layers' products are computed (:func:`~vflbench.mpc.parties.resolve_protocol`;
    ``None``: ``fixed_mask`` with ``truncation: reveal``, ``beaver`` with ``secureml``); ``fixed_mask`` and
    ``beaver`` give the same numbers with ``reveal`` and differ only in their traffic (docs/decisions/vmask.md,
    issue 26). ``row_blocks``: the row blocks each ``fixed_mask`` product's operand travels in, P_K answering each
    as it arrives so that the link and P_K's product overlap (``None``: 4; ``beaver`` sends operands whole); the
    numbers are the same for every value (docs/performance.md).

    This class holds the parameters; every party runs its role's half (:meth:`halves`), and the halves talk only
    through the channel: :class:`VMaskPassive` at each P_k (masks its own bottom model, sends its initial
    parameters in ``vmask.setup``, follows the active party's decisions), :class:`VMaskActive` at the active party
    (answers P_k's ``vmask.*`` requests, trains the shadows, selects the layers, reports) and :class:`VMaskDealer`,
    the dealer of Beaver triples, a third party. A variant (VMask-AS, -RS, -ALLS) changes the active party's
    selection only; its passive half is VMask's under the variant's name.
    """

    name = "vmask"
    side = "both"
    paper = "Tan et al., VMask: Tunable Label Privacy Protection for VFL via Layer Masking (NDSS 2025)"
    protects = ("labels",)
    adaptive_attacks = ("vmask_own_record", "vmask_weight_recovery")
    threat = "honest-but-curious passive parties running model completion on their bottom models"
    strength_param = "budget"
    strength_direction = "smaller is stronger"
    extra_parties = (DEALER,)
    surface = (
        *requests(
            (
                "vmask.setup",
                "vmask.share",
                "vmask.forward",
                "vmask.backward",
                "vmask.decay",
                "vmask.renormalize",
                "vmask.release",
            ),
            PASSIVE,
            ACTIVE,
        ),
        *requests(("vmask.select",), ACTIVE, PASSIVE),
        *requests(("dealer.triple", "dealer.mask"), PASSIVE, DEALER),  # the dealer answers, never asks
        *requests(("dealer.take", "dealer.checkpoint", "dealer.resume", "dealer.take_mask"), ACTIVE, DEALER),
    )
    selection: ClassVar[str] = "greedy"
    uses_aux: ClassVar[bool] = True  # its shadow models train on rows of the held-out pool (data.aux_pool)
    summary_metrics = ("mask_ratio",)  # the share of masked layers over the whole training (its Fig. 8)
    constraints: ClassVar[Mapping[str, Param]] = {
        "budget": Param("the privacy budget: the largest model completion accuracy gain allowed over the prior"),
        "sigma": Param("standard deviation of the noise the active party adds to a masked layer", ge=0),
        "aux_size": Param("held-out rows the shadow models train on (null: the whole pool)", ge=1),
        "known_per_class": Param("labelled rows per class of the simulated model completion", ge=1),
        "mc_epochs": Param("epochs of the simulated model completion", ge=1),
        "mc_optimizer": Param("its optimizer (null: model_completion's)"),
        "mc_lr": Param("its learning rate (null: model_completion's)", gt=0),
        "mc_batch_size": Param("its batch size: rows, 'full' or null (model_completion's)", ge=1),
        "mc_momentum": Param("its SGD momentum (null: model_completion's)", ge=0),
        "shadow_epochs": Param("epochs of each shadow model", ge=1),
        "frac_bits": Param("fractional bits of the secret-shared fixed-point encoding"),
        "truncation": Param("how products are truncated in the secure layers"),
        "layers": Param("the layers to mask (null: chosen by the budget)"),
        "attacker_view": Param(
            "what a passive attacker's bottom model holds for a masked layer: reinit or its "
            "share (the recovered view is the attack vmask_weight_recovery)"
        ),
        "protocol": Param("the masked layers' protocol (null: fixed_mask with truncation reveal, else beaver)"),
        "row_blocks": Param(
            "row blocks each fixed_mask product's operand travels in, answered one by one (null: 4; beaver: 1)", ge=1
        ),
    }

    def __init__(
        self,
        *,
        budget: float = 0.25,
        sigma: float = 0.01,
        aux_size: int | None = None,
        known_per_class: int = 4,
        mc_epochs: int = 20,
        mc_optimizer: Literal["sgd", "adam"] | None = None,
        mc_lr: float | None = None,
        mc_batch_size: int | Literal["full"] | None = None,
        mc_momentum: float | None = None,
        shadow_epochs: int = 1,
        frac_bits: int = 16,
        truncation: Truncation = "reveal",
        layers: list[int] | None = None,
        attacker_view: Literal["reinit", "share"] = "reinit",
        protocol: Protocol | None = None,
        row_blocks: int | None = None,
    ) -> None:
        self.budget = budget
        self.sigma = sigma
        self.aux_size = aux_size
        self.known_per_class = known_per_class
        self.mc_epochs = mc_epochs
        self.mc_optimizer = mc_optimizer
        self.mc_lr = mc_lr
        self.mc_batch_size = mc_batch_size
        self.mc_momentum = mc_momentum
        self.shadow_epochs = shadow_epochs
        self.frac_bits = frac_bits
        self.truncation = truncation
        self.layers = layers
        self.attacker_view = attacker_view
        self.protocol = protocol
        self.row_blocks = row_blocks
        resolve_row_blocks(row_blocks, resolve_protocol(protocol, truncation))  # refuses an unknown protocol,
        # fixed_mask with secureml, and row blocks with beaver
        if aux_size is not None and not self.uses_aux:
            raise ValueError(
                f"{self.name} trains no shadow model, so it takes no auxiliary set; remove aux_size (got {aux_size})"
            )

    @classmethod
    def halves(cls) -> Mapping[str, type[Defense]]:  # noqa: D102
        return {ACTIVE: VMaskActive, PASSIVE: VMaskPassive, DEALER: VMaskDealer}

    resumable = True

    def bind(self, context: BindContext) -> None:
        """Checks every half makes: a neural bottom model and an endpoint; the half's own seed."""
        super().bind(context)
        if context.algorithm == "vlr":
            raise CompatibilityError("vmask masks layers of neural bottom models; use vhnn or vsnn, not vlr")
        if context.link is None:
            raise CompatibilityError(
                "vmask's halves talk through the channel: bind it with an endpoint "
                "(BindContext.link; build_federation gives it)"
            )
        self.seed_ = int(torch.randint(0, 2**62, (1,), generator=context.generator))

    def _link(self) -> Endpoint:
        assert self.context_.link is not None
        return self.context_.link

    def _train(self) -> TrainSettings:
        if self.context_.train is None:
            raise CompatibilityError(
                "vmask needs the training settings (BindContext.train); build_federation gives them"
            )
        return self.context_.train

    def _gen(self, *names: str | int) -> torch.Generator:
        return torch.Generator().manual_seed(derive_seed(self.seed_, *names))

    def _eligible(self, n: int) -> list[int]:
        chosen = list(range(n)) if self.layers is None else list(self.layers)
        bad = [i for i in chosen if not 0 <= i < n]
        if bad:
            raise CompatibilityError(
                f"vmask: layers {bad} do not exist; the bottom model has {n} linear layers (0..{n - 1})"
            )
        return chosen


class VMaskDealer(VMask):
    """VMask's trusted dealer of Beaver triples, a party of its own (:data:`~vflbench.protocol.messages.DEALER`):
    the same for every variant."""

    def start_party(
        self, name: str, link: Endpoint, generator: torch.Generator, *, device: torch.device | None = None
    ) -> None:
        """Run the dealer (:func:`start_dealer`) at ``link``, computing on ``device``."""
        if name != DEALER:
            super().start_party(name, link, generator, device=device)
        self.dealer_service_ = start_dealer(link, generator, device=device)


class VMaskPassive(VMask):
    """VMask's half at a passive party P_k: it masks its own bottom model (:mod:`vflbench.mpc.masking`), runs every
    protocol step of a masked layer as a ``vmask.<step>`` request to the active party, and masks and unmasks layers
    as the active party's decisions say (the ``vmask.setup`` reply, then ``vmask.select`` requests)."""

    def bind(self, context: BindContext) -> None:  # noqa: D102
        super().bind(context)
        self.bottom_: VMaskBottom | None = None
        self.input_shape_: tuple[int, ...] | None = None
        self.masked_: set[int] = set()
        self.decisions_ = 0
        assert context.link is not None
        context.link.serve("vmask", self._serve)

    def augment_features(self, part: PartySlice) -> PartySlice:
        """At P_k: note the shape of one row of its own slice (sent in ``vmask.setup`` for the paper's
        precondition check); the slice is unchanged."""
        self.input_shape_ = part.sample_shape
        return part

    def wrap_bottom(self, model: nn.Module, party: str) -> nn.Module:
        """Make P_k's own bottom model maskable, send the active party its initial parameters and the shape of one
        row of its slice (``vmask.setup``) and mask the layers the reply names (Algorithm 4 lines 2-3)."""
        initial = [t.detach().clone() for t in model.state_dict().values()]
        layers = make_maskable(model)
        if not layers:
            raise CompatibilityError("vmask needs a bottom model with Linear or Conv2d layers")
        self.bottom_ = VMaskBottom(model, layers)
        if self.input_shape_ is None:
            raise CompatibilityError(
                "vmask: P_k's half saw no slice of its own before its bottom model was built "
                "(augment_features); build the party with build_federation or build_passive"
            )
        meta: dict[str, Scalar] = {"layers": len(layers), "input_shape": ",".join(map(str, self.input_shape_))}
        reply = self._link().call("vmask.setup", ACTIVE, *initial, meta=meta, phase="setup")
        self._apply_mask(reply.meta, phase="setup")
        return self.bottom_

    def _serve(self, request: Message) -> Message:
        if request.kind != "vmask.select" or request.sender != ACTIVE:
            raise ValueError(
                f"a passive party's VMask half answers vmask.select from the active party only, "
                f"got {request.kind!r} from {request.sender!r}"
            )
        self._apply_mask(request.meta, phase=request.phase)
        return request.reply()

    def state_dict(self) -> dict[str, Any]:
        """P_k's state at an epoch boundary: the layers it holds masked, its decision count and, per masked layer,
        its input-share generator, attacker view and momentum (the shares are in its model's state dict, with a
        ``fixed_mask`` layer's opening and mask)."""
        assert self.bottom_ is not None
        layers = self.bottom_.layers()
        own: dict[str, Any] = {}
        for i in sorted(self.masked_):
            shared = layers[i].shared
            assert shared is not None
            p = shared.passive
            own[str(i)] = {
                "randomness": shared.randomness.generator.get_state(),
                "attacker_view": layers[i].attacker_view,
                "reinit_seed": layers[i].reinit_seed,
                "momentum_weight": p.momentum_weight,
                "momentum_bias": p.momentum_bias,
            }
        return {"masked": sorted(self.masked_), "decisions": self.decisions_, "layers": own}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """P_k's layers masked as at the checkpoint (rebuilt without messages; the model's state dict, loaded next,
        fills the shares), its generators and counters."""
        assert self.bottom_ is not None
        target = {int(i) for i in state["masked"]}
        for i, layer in enumerate(self.bottom_.layers()):
            if i not in target:
                layer.shared = None  # its plaintext weight comes with the model's state dict
                continue
            saved = state["layers"][str(i)]
            generator = torch.Generator()
            generator.set_state(saved["randomness"])
            layer.restore_masked(
                link=self._link(),
                generator_passive=generator,
                sigma=self.sigma,
                frac_bits=self.frac_bits,
                truncation=self.truncation,
                name=f"layer{i}",
                protocol=self.protocol,
                row_blocks=self.row_blocks,
            )
            layer.attacker_view, layer.reinit_seed = str(saved["attacker_view"]), int(saved["reinit_seed"])
            assert layer.shared is not None
            device = layer.shared.passive.weight_share.device  # checkpoints load on the CPU
            layer.shared.passive.momentum_weight = _on(saved["momentum_weight"], device)
            layer.shared.passive.momentum_bias = _on(saved["momentum_bias"], device)
        self.masked_ = target
        self.decisions_ = int(state["decisions"])

    def on_epoch_end(self, epoch: int) -> dict[str, Any]:
        """Nothing P_k's layers asked the dealer for ahead crosses the epoch (each layer settles); P_k reports
        nothing."""
        for layer in self.bottom_.layers() if self.bottom_ is not None else ():
            layer.settle()
        return {}

    def _apply_mask(self, meta: Mapping[str, Scalar], *, phase: Phase) -> None:
        """At P_k: mask the layers the active party's decision names that are not masked, unmask the
        others (Algorithm 1), each through its own messages to the active party."""
        assert self.bottom_ is not None
        target = _layer_list(meta["mask"])
        layers = self.bottom_.layers()
        for i in sorted(target - self.masked_):
            layers[i].attacker_view = self.attacker_view
            layers[i].reinit_seed = int(meta[f"reinit_{i}"])  # type: ignore[arg-type]
            layers[i].mask(
                link=self._link(),
                generator_passive=self._gen("share", i, self.decisions_),
                sigma=self.sigma,
                frac_bits=self.frac_bits,
                truncation=self.truncation,
                name=f"layer{i}",
                phase=phase,
                protocol=self.protocol,
                row_blocks=self.row_blocks,
            )
        for i in sorted(self.masked_ - target):
            layers[i].unmask(self.sigma, phase=phase)
        self.masked_ = target
        self.decisions_ += 1


class VMaskActive(VMask):
    """VMask's half at the active party: it answers P_k's ``vmask.*`` requests with its shares
    (:class:`~vflbench.mpc.parties.ActiveShares`), keeps a shadow of each P_k's bottom model (initial values from
    P_k's ``vmask.setup`` message, Algorithm 4 line 2), trains the shadows, selects the layers to mask (Algorithms
    2, 3 and 6) and sends each decision as a ``vmask.select`` request."""

    def bind(self, context: BindContext) -> None:  # noqa: D102
        super().bind(context)
        self.parties_: dict[str, PartyState] = {}
        self.architectures_: dict[str, nn.Module] = {}
        self.top_: nn.Module | None = None
        self.ratios_: list[float] = []
        self.recipe_ = self._recipe(dict(context.model_completion or {}))
        self.conditions_: dict[str, list[LayerCondition]] = {}
        assert context.link is not None
        self.shares_ = ActiveShares(context.link, noise=self._noise, sigma=self.sigma)
        context.link.serve("vmask", self._serve)

    def _aux(self) -> DefenseAux:
        if self.context_.aux is None:
            raise CompatibilityError("vmask needs an auxiliary set granted by the scenario (data.aux_pool)")
        return self.context_.aux

    def _recipe(self, attack: dict[str, Any]) -> dict[str, Any]:
        """The simulated attack's fine-tuning recipe: the ``mc_*`` given, else the configured model
        completion attack's, else (keys left out) :func:`complete`'s defaults, which are model
        completion's."""
        recipe: dict[str, Any] = {
            k: attack[k] for k in ("optimizer", "lr", "batch_size", "momentum", "head_hidden") if k in attack
        }
        for key, value in (("optimizer", self.mc_optimizer), ("lr", self.mc_lr), ("momentum", self.mc_momentum)):
            if value is not None:
                recipe[key] = value
        if self.mc_batch_size is not None:
            recipe["batch_size"] = None if self.mc_batch_size == "full" else self.mc_batch_size
        return recipe

    def details(self) -> dict[str, Any]:
        """For result.json: the simulated attack's recipe and the paper's preconditions per layer (a passive
        party's half reports nothing)."""
        return {
            "simulated_attack_recipe": dict(self.recipe_),
            "preconditions": {p: [asdict(c) for c in cs] for p, cs in self.conditions_.items()},
            "paper_precondition_violations": {
                p: [c.name for c in cs if not c.paper_secure] for p, cs in self.conditions_.items()
            },
        }

    def wrap_bottom(self, model: nn.Module, party: str) -> nn.Module:
        """Keep only the architecture of P_k's bottom model (public, as the configuration; the active party is shown
        one built from P_k's layout, never P_k's model), values cleared, for the shadow: they arrive in P_k's
        ``vmask.setup`` message. The active party's own bottom model is left as it is."""
        if party != ACTIVE:
            architecture = copy.deepcopy(model)
            with torch.no_grad():
                for t in architecture.state_dict().values():
                    t.zero_()
            self.architectures_[party] = architecture
        return model

    def _setup(self, request: Message) -> Message:
        """The active party's side of ``vmask.setup``: the shadow of P_k's bottom model with the initial
        parameters P_k sent (Algorithm 4 line 2), the paper's preconditions, and the first mask."""
        party = request.sender
        if party not in self.architectures_:
            raise CompatibilityError(
                f"vmask: {party!r} sent its initial parameters, but the active party knows no bottom model of it"
            )
        shadow = self.architectures_.pop(party)
        keys = list(shadow.state_dict())
        if len(keys) != len(request.tensors):
            raise CompatibilityError(
                f"vmask: {party!r} sent {len(request.tensors)} initial tensors for a bottom model with {len(keys)}"
            )
        shadow.load_state_dict(dict(zip(keys, request.tensors, strict=True)))
        n = sum(isinstance(m, (nn.Linear, nn.Conv2d)) for m in shadow.modules())
        if int(request.meta["layers"]) != n:  # type: ignore[arg-type]
            raise CompatibilityError(f"vmask: {party!r} has {request.meta['layers']} maskable layers, its shadow {n}")
        train = self._train()
        self._check_conditions(party, shadow, n, train.batch_size, _input_shape(party, request.meta.get("input_shape")))
        state = PartyState(
            shadow=shadow,
            shadow_opt=torch.optim.SGD(shadow.parameters(), lr=train.lr, momentum=train.momentum),
            masked=set(),
            grad_norm=torch.zeros(n, dtype=torch.float64),
        )
        self.parties_[party] = state
        return request.reply(meta=self._decide(party, state, self._initial(n)))

    def _serve(self, request: Message) -> Message:
        if request.kind == "vmask.setup":
            return self._setup(request)
        if request.sender not in self.parties_:  # another party's set-up may still be on its way
            raise CompatibilityError(
                f"vmask: {request.sender!r} sent {request.kind!r} before its initial parameters (vmask.setup)"
            )
        return self.shares_.handle(request)

    def _check_conditions(
        self, party: str, plain: nn.Module, n: int, batch_size: int, input_shape: tuple[int, ...]
    ) -> None:
        """The paper's §IV-D preconditions for the eligible layers (on a copy of P_k's initial model,
        which the active party holds as the shadow, run on two zero rows of the shape P_k sent), with a
        warning naming the violations."""
        eligible = set(self._eligible(n))
        probe = copy.deepcopy(plain)
        device = next((t.device for t in probe.parameters()), None)
        conditions = [
            c
            for c in layer_conditions(probe, torch.zeros((2, *input_shape), device=device), batch_size)
            if c.layer in eligible
        ]
        self.conditions_[party] = conditions
        bad = [c for c in conditions if not c.paper_secure]
        if bad:
            log.warning(
                "vmask: %s's layers %s violate the paper's own precondition (§IV-D: %s), so the paper "
                "itself calls them recoverable from one batch",
                party,
                [c.name for c in bad],
                "; ".join(c.paper_condition for c in bad),
            )
        log.warning(
            "vmask: recovery channels for %s (batches of one masking episode that determine the layer, "
            "forward / backward; None: no input gradient is opened): %s",
            party,
            ", ".join(f"{c.name}: {c.forward_batches}/{c.backward_batches}" for c in conditions),
        )

    def _initial(self, n: int) -> set[int]:
        """Layers masked in the first epoch: the first eligible layer (Algorithm 4 line 3)."""
        return {self._eligible(n)[0]}

    def wrap_top(self, model: nn.Module) -> nn.Module:  # noqa: D102
        self.top_ = model
        return model

    def _check_set_up(self) -> None:
        """Every passive party's half has sent its initial parameters (``vmask.setup``). Checked at each epoch's
        end, not when the top model is built: with the parties in separate processes the setups arrive after the
        active party has built its models, each party's before its own other ``vmask.*`` requests (checked per
        request), but in no order between parties."""
        if self.architectures_:
            raise CompatibilityError(
                f"vmask: {', '.join(sorted(self.architectures_))} sent no initial parameters: "
                "every passive party needs its own VMask half (side 'both')"
            )

    def state_dict(self) -> dict[str, Any]:
        """The active party's state at an epoch boundary: per P_k its shadow model, the shadow's optimizer, the
        masks, norms and estimates; its own share of every masked layer with its noise generator (and, with
        ``fixed_mask``, its weight mask's id and seed and the last triple it used); the mask ratios and the triples it
        took."""
        holders = [
            {
                "party": party,
                "layer": layer,
                "geometry": dict(h.geometry),
                "frac_bits": h.frac_bits,
                "truncation": h.truncation,
                "generator": h.generator.get_state(),
                "weight_share": h.weight_share,
                "bias_share": h.bias_share,
                "scale": h.scale,
                "mask_id": h.mask_id,
                "mask_seed": h.mask_seed,
                "last_triple": h.last_triple,
            }
            for (party, layer), h in self.shares_.holders.items()
        ]
        parties = {
            party: {
                "shadow": s.shadow.state_dict(),
                "shadow_opt": s.shadow_opt.state_dict(),
                "masked": sorted(s.masked),
                "grad_norm": s.grad_norm,
                "history": [list(h) for h in s.history],
                "estimates": list(s.estimates),
                "steps": s.steps,
            }
            for party, s in self.parties_.items()
        }
        return {"parties": parties, "holders": holders, "ratios": list(self.ratios_), "triples": self.shares_.triples}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        if set(state["parties"]) != set(self.parties_):
            raise CompatibilityError(
                f"vmask: the checkpoint holds shadows of {sorted(state['parties'])}, this run "
                f"set up {sorted(self.parties_)}"
            )
        for party, saved in state["parties"].items():
            s = self.parties_[party]
            s.shadow.load_state_dict(saved["shadow"])
            s.shadow_opt.load_state_dict(saved["shadow_opt"])
            s.masked = {int(i) for i in saved["masked"]}
            s.grad_norm = saved["grad_norm"].clone()
            s.history = [[int(i) for i in h] for h in saved["history"]]
            s.estimates = [float(e) for e in saved["estimates"]]
            s.steps = int(saved["steps"])
        self.shares_.holders = {}
        for h in state["holders"]:
            generator = torch.Generator()
            generator.set_state(h["generator"])
            holder = ActiveShareHolder(
                name=f"{h['party']}.{h['layer']}",
                geometry=h["geometry"],
                frac_bits=int(h["frac_bits"]),
                truncation=str(h["truncation"]),
                generator=generator,
                record_received=self.shares_.record_received,
            )
            holder.weight_share, holder.bias_share, holder.scale = (
                _on(h["weight_share"], self.context_.device),
                _on(h["bias_share"], self.context_.device),
                float(h["scale"]),
            )
            holder.mask_id, holder.mask_seed = h.get("mask_id"), h.get("mask_seed")
            holder.last_triple = int(h.get("last_triple", -1))
            self.shares_.holders[(str(h["party"]), str(h["layer"]))] = holder
        self.ratios_ = [float(r) for r in state["ratios"]]
        self.shares_.triples = int(state["triples"])

    def _decide(self, party: str, state: PartyState, target: set[int]) -> dict[str, Scalar]:
        """Record the active party's decision to mask ``target`` next and the message header telling P_k."""
        state.history.append(sorted(target))
        state.masked = set(target)
        meta: dict[str, Scalar] = {"mask": ",".join(str(i) for i in sorted(target))}
        meta.update({f"reinit_{i}": derive_seed(self.seed_, party, "attacker-reinit", i) for i in sorted(target)})
        return meta

    def _noise(self, party: str, layer: str) -> torch.Generator:
        """The active party's noise generator for ``party``'s layer being masked under its latest decision."""
        return self._gen(
            ACTIVE, "noise", party, int(layer.removeprefix("layer")), len(self.parties_[party].history) - 1
        )

    # -- Algorithm 6: shadow model update -------------------------------------------------------------
    def _shadow_update(self) -> dict[str, Tensor]:
        """``shadow_epochs`` passes (Algorithm 6: one) of every shadow model over the auxiliary set
        through the frozen top model; the gradient norms are summed over all steps."""
        aux = self._aux()
        assert self.top_ is not None
        names = list(self.parties_)
        x_aux, y_aux = aux.x, aux.y
        batch = self._train().batch_size
        top = self.top_
        was_training = top.training
        top.eval()
        frozen = [p for p in top.parameters() if p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        norms = {n: torch.zeros(len(self.parties_[n].grad_norm), dtype=torch.float64) for n in names}
        generator = self._gen("shadow", len(self.ratios_))
        orders = [torch.randperm(len(y_aux), generator=generator) for _ in range(self.shadow_epochs)]
        try:
            for order, start in ((o, s) for o in orders for s in range(0, len(y_aux), batch)):
                ids = order[start : start + batch]
                embeddings = []
                for n in names:
                    self.parties_[n].shadow.train()
                    embeddings.append(self.parties_[n].shadow(x_aux[n][ids]))
                if self.context_.active_has_features:
                    embeddings.insert(0, torch.zeros_like(embeddings[0]))
                loss = F.cross_entropy(top(aggregate(embeddings, self.context_.aggregation or "concat")), y_aux[ids])
                for n in names:
                    self.parties_[n].shadow_opt.zero_grad()
                loss.backward()
                for n in names:
                    state = self.parties_[n]
                    layers = (m for m in state.shadow.modules() if isinstance(m, (nn.Linear, nn.Conv2d)))
                    for i, layer in enumerate(layers):
                        norms[n][i] += sum(float(p.grad.abs().sum()) for p in layer.parameters() if p.grad is not None)
                    state.shadow_opt.step()
        finally:
            for p in frozen:
                p.requires_grad_(True)
            top.train(was_training)
        return norms

    # -- Algorithms 2 and 3: layer selection by simulated model completion ------------------------
    def _attack_set(self, party: str) -> Tensor:
        """D_A (Algorithm 2 line 7): ``known_per_class`` rows per class of the auxiliary set, drawn
        once per selection and shared by every candidate mask set."""
        y = self._aux().y.cpu()  # row ids are CPU tensors
        g = self._gen("attack-set", party, len(self.ratios_))
        return torch.cat(
            [
                torch.nonzero(y == c).flatten()[torch.randperm(int((y == c).sum()), generator=g)][
                    : self.known_per_class
                ]
                for c in torch.unique(y)
            ]
        )

    def _simulated_attacks(
        self, party: str, shadow: nn.Module, candidates: list[set[int]], known: Tensor
    ) -> list[float]:
        """For each candidate mask set: the best accuracy of model completion trained on D_A (``known``)
        on the shadow with those layers re-randomised, scored on the rest of the auxiliary set. The
        candidates are independent (each has its own generator); several are trained side by side as
        one stacked model (:func:`complete_stacked`: what one :func:`complete` each gives, up to float32
        rounding)."""
        aux = self._aux()
        x, y = aux.x[party], aux.y
        rest = torch.ones(len(y), dtype=torch.bool)
        rest[known] = False
        models, generators = [], []
        for masked in candidates:
            g = self._gen("attack", party, len(self.ratios_), tuple(sorted(masked)).__repr__())
            model = copy.deepcopy(shadow)
            linear = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
            for i in masked:
                init_parameters(linear[i], g)
            models.append(model)
            generators.append(g)
        embed_dim = next(m for m in reversed(linear)).weight.shape[0]
        kwargs = {
            "num_classes": self.context_.num_classes,
            "embed_dim": embed_dim,
            "epochs": self.mc_epochs,
            **self.recipe_,
        }
        runs = (
            complete_stacked(models, x[known], y[known], x[rest], generators=generators, **kwargs)
            if len(models) > 1
            else [complete(models[0], x[known], y[known], x[rest], generator=generators[0], **kwargs)]
        )
        return [max(float((o.argmax(1) == y[rest]).float().mean()) for o in outputs) for outputs in runs]

    def _greedy(self, party: str, state: PartyState, masked: set[int], queue: list[int]) -> set[int]:
        """Algorithm 2's loop from ``masked``: add the next layer of ``queue`` while the simulated attack's
        estimate exceeds the budget.

        The candidates are simulated in rounds, each round as one stacked model for a bottom of linear
        layers (:func:`stackable`; one candidate a round otherwise): first as many as the last selection's
        loop needed (``state.steps`` + 1), then, if the loop goes further, all the rest. Stacking saves
        the per-step overhead of small models (digits MLP3: 1.7x for 4 candidates); the rounds keep it
        from simulating candidates the loop will not reach (on larger models a stacked run costs as
        much per candidate as one alone). The estimates and the decision do not depend on the rounds.
        """
        candidates = [set(masked)]
        for layer in queue:
            candidates.append(candidates[-1] | {layer})
        known = self._attack_set(party)
        at_once = stackable(state.shadow)
        estimates: list[float] = []
        k = 0
        while True:
            if k == len(estimates):
                size = (state.steps + 1 if not estimates else len(candidates) - k) if at_once else 1
                estimates += self._simulated_attacks(party, state.shadow, candidates[k : k + size], known)
            if k == len(queue) or estimates[k] <= self.budget:
                break
            k += 1
        state.steps = k
        state.estimates.append(estimates[k])
        return candidates[k]

    def _select(self, party: str, state: PartyState) -> set[int]:
        """Algorithm 2 (with replacement: VMask)."""
        eligible = self._eligible(len(state.grad_norm))
        return self._greedy(party, state, set(), sorted(eligible, key=lambda i: -float(state.grad_norm[i])))

    # -- per epoch ------------------------------------------------------------------------------------
    def on_epoch_end(self, epoch: int) -> dict[str, Any]:  # noqa: D102
        self._check_set_up()
        if not self.parties_:
            return {}
        ratios = [len(s.masked) / len(s.grad_norm) for s in self.parties_.values()]
        self.ratios_.append(sum(ratios) / len(ratios))
        report: dict[str, Any] = {
            "mask_ratio_epoch": self.ratios_[-1],
            "mask_ratio": sum(self.ratios_) / len(self.ratios_),
        }
        if self._train().epochs == epoch + 1:
            report.update(self._comm_report())
            return report  # no next epoch to mask for
        norms = self._shadow_update() if self.selection != "all" else {}
        for party, state in self.parties_.items():
            if party in norms:
                state.grad_norm += norms[party]
            target = self._next_mask(party, state)
            self._link().call("vmask.select", party, meta=self._decide(party, state, target), epoch=epoch)
            report[f"{party}.masked"] = sorted(target)
            if state.estimates:
                report[f"{party}.estimated_attack"] = state.estimates[-1]
        report.update(self._comm_report())
        return report

    def _next_mask(self, party: str, state: PartyState) -> set[int]:
        return self._select(party, state)

    def _comm_report(self) -> dict[str, Any]:
        """Bytes of the secret-sharing protocol (all phases, read from the channel's counter) and the
        Beaver triples the active party took."""
        stats = self._link().stats
        total = sum(
            s.bytes for phase in stats.values() for kind in PROTOCOL_KINDS for s in phase.by_kind.get(kind, {}).values()
        )
        return {"mpc_bytes": total, "triples": self.shares_.triples}


@DEFENSES.register(summary="VMask with accumulative layer selection (masked layers stay masked)")
class VMaskAS(VMask):
    """VMask-AS: Algorithm 2 without replacement (Q <- Q - U, U <- U)."""

    name = "vmask_as"
    selection = "accumulative"

    @classmethod
    def halves(cls) -> Mapping[str, type[Defense]]:  # noqa: D102
        return {ACTIVE: VMaskASActive, PASSIVE: VMaskASPassive, DEALER: VMaskDealer}


class VMaskASActive(VMaskActive, VMaskAS):
    """VMask-AS at the active party: the greedy loop starts from the layers masked already."""

    def _select(self, party: str, state: PartyState) -> set[int]:
        eligible = self._eligible(len(state.grad_norm))
        queue = [i for i in sorted(eligible, key=lambda i: -float(state.grad_norm[i])) if i not in state.masked]
        return self._greedy(party, state, set(state.masked), queue)


class VMaskASPassive(VMaskPassive, VMaskAS):
    """VMask-AS at a passive party (VMask's passive half)."""


@DEFENSES.register(summary="VMask masking as many layers as VMask would, chosen at random")
class VMaskRS(VMask):
    """VMask-RS: the same number of layers as VMask's selection, picked uniformly at random."""

    name = "vmask_rs"
    selection = "random"

    @classmethod
    def halves(cls) -> Mapping[str, type[Defense]]:  # noqa: D102
        return {ACTIVE: VMaskRSActive, PASSIVE: VMaskRSPassive, DEALER: VMaskDealer}


class VMaskRSActive(VMaskActive, VMaskRS):
    """VMask-RS at the active party: VMask's count of layers, drawn at random."""

    def _next_mask(self, party: str, state: PartyState) -> set[int]:
        count = len(self._select(party, state))
        rng = random.Random(derive_seed(self.seed_, "random-selection", party, len(state.history)))
        return set(rng.sample(self._eligible(len(state.grad_norm)), count))


class VMaskRSPassive(VMaskPassive, VMaskRS):
    """VMask-RS at a passive party (VMask's passive half)."""


@DEFENSES.register(summary="VMask masking every eligible layer in every epoch")
class VMaskALLS(VMask):
    """VMask-ALLS: all eligible layers masked throughout (no selection). It trains no shadow model and
    simulates no attack, so it takes no auxiliary set: no row is held out for it (``uses_aux`` false), and
    ``aux_size`` is refused."""

    name = "vmask_alls"
    selection = "all"
    uses_aux: ClassVar[bool] = False

    @classmethod
    def halves(cls) -> Mapping[str, type[Defense]]:  # noqa: D102
        return {ACTIVE: VMaskALLSActive, PASSIVE: VMaskALLSPassive, DEALER: VMaskDealer}


class VMaskALLSActive(VMaskActive, VMaskALLS):
    """VMask-ALLS at the active party: every eligible layer, from the first epoch on."""

    def _initial(self, n: int) -> set[int]:
        return set(self._eligible(n))

    def _next_mask(self, party: str, state: PartyState) -> set[int]:
        return set(self._eligible(len(state.grad_norm)))


class VMaskALLSPassive(VMaskPassive, VMaskALLS):
    """VMask-ALLS at a passive party (VMask's passive half)."""
