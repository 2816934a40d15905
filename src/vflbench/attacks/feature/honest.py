"""Shared machinery of the honest-but-curious active-party feature attacks (PCAT, SDAR, GRNA, GIA, MI).

The attacker is the active party, honest but curious (DMAVFL §6.2's HBC baselines; Kang et al.
threat model T2): it runs the protocol exactly as specified (the same messages, cut gradients
and model updates) and on the side computes whatever it can from what it holds: its own slice
and models, its labels, the embeddings the victim sends it, and the auxiliary rows its threat
model grants (:class:`~vflbench.attacks.base.AuxData`: its own slice, the victim's slice and
the labels of some training rows).

**Work during training.** PCAT and SDAR train their models while the federation trains, and
GIA, GRNA and black-box model inversion keep the victim embeddings of the auxiliary rows that
arrive during training. They install a *step observer* in :meth:`Attack.corrupt` (the runner's
only hook on the attacker's own party before training; nothing is corrupted): the party's
``step`` is wrapped by an instance attribute that runs the honest step unchanged, returns its
cut gradients as they are, and then runs the attack's side computation
(:meth:`CuriousActiveAttack.on_step`). The side computation never touches the party's
optimizer, its parameters' ``.grad`` or its random generators: it takes gradients with
:func:`torch.autograd.grad` with respect to the attack's own models only, runs the party's models
in evaluation mode (so BatchNorm statistics and MixUp draws are untouched) and draws from the
attack's own generator. A run with such an attack therefore trains exactly as a run without it.
The attack's own models are added to what the party's ``models()`` returns under
``<attack name>.<role>`` keys (as the malicious attacks add theirs), so they are checkpointed and
reach the attacker's view after training.

**Embeddings of auxiliary rows.** The aux rows are training rows, so the victim sends their
embeddings during training; the observer keeps the last one received for every aux row (from
the last epoch, after the victim's own defenses: exactly the message). If the view also holds
inference-time embeddings of exactly the aux rows (a :class:`ReceivedEmbeddings` of split
``train`` with the aux ids), those are used instead.

**Scope.** Attacks that run the active party's top model on a simulated victim embedding need
exactly one passive party (the victim), since the other passive parties' embeddings of the
auxiliary rows are unknown. Victim features must be real-valued (not token ids or codes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.attacks.base import (
    AuxData,
    FeatureAttack,
    PartyView,
    Phase,
    ReceivedEmbeddings,
    Scenario,
    ThreatGrant,
    require,
    require_training,
)
from vflbench.attacks.feature.common import AUX_CONSTRAINTS, EVAL_CHUNK, class_indices, received_from
from vflbench.data.base import PartySlice
from vflbench.errors import CompatibilityError
from vflbench.models import build_bottom
from vflbench.protocol import ActiveParty
from vflbench.protocol.hooks import PartyHook, StepFn
from vflbench.protocol.party import Party, aggregate
from vflbench.registry import Param

THREAT = (
    "honest-but-curious active party with auxiliary labelled samples of the victim's feature space; "
    "it follows the protocol and only computes on what it holds and receives"
)

StepCallback = Callable[[ActiveParty, Tensor, Tensor, int, int], None]


# ----------------------------------------------------------------------------- small helpers


@contextmanager
def evaluating(*modules: nn.Module | None) -> Iterator[None]:
    """Put ``modules`` in evaluation mode for the block, then restore each one's mode."""
    flags = [(m, m.training) for m in modules if m is not None]
    for m, _ in flags:
        m.eval()
    try:
        yield
    finally:
        for m, was in flags:
            m.train(was)


def apply_gradients(loss: Tensor, params: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer) -> None:
    """One optimizer step on ``params`` from ``loss``, without touching any other tensor's ``.grad``."""
    grads = torch.autograd.grad(loss, list(params), allow_unused=True)
    for p, g in zip(params, grads, strict=True):
        p.grad = g if g is not None else torch.zeros_like(p)
    optimizer.step()
    for p in params:
        p.grad = None


def supervised_loss(outputs: Tensor, y: Tensor) -> Tensor:
    """Logistic loss for one logit, cross-entropy otherwise (the honest task's loss)."""
    if outputs.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(outputs.squeeze(1), y.float())
    return F.cross_entropy(outputs, y)


def predicted_class(outputs: Tensor) -> Tensor:
    """The class a model output predicts (one logit: positive when > 0)."""
    return (outputs.squeeze(1) > 0).long() if outputs.shape[1] == 1 else outputs.argmax(1)


def total_variation(x: Tensor) -> Tensor:
    """Per-sample total variation of images (He et al. 2019, ``utils.TV``): mean squared
    differences between vertical neighbours plus between horizontal neighbours; 0 for tabular rows."""
    if x.dim() != 4:
        return x.new_zeros(len(x))
    tv = x.new_zeros(len(x))
    if x.shape[2] > 1:
        tv = tv + (x[:, :, 1:, :] - x[:, :, :-1, :]).pow(2).flatten(1).mean(1)
    if x.shape[3] > 1:
        tv = tv + (x[:, :, :, 1:] - x[:, :, :, :-1]).pow(2).flatten(1).mean(1)
    return tv


@torch.no_grad()
def apply_in_chunks(fn: Callable[..., Tensor], *inputs: Tensor | None) -> Tensor:
    """``fn`` on aligned chunks of ``inputs`` (``None`` passes through), concatenated."""
    n = next(len(x) for x in inputs if x is not None)
    chunks = [fn(*(x[i : i + EVAL_CHUNK] if x is not None else None for x in inputs)) for i in range(0, n, EVAL_CHUNK)]
    return torch.cat(chunks) if chunks else torch.empty(0)


def permutation_batches(n: int, size: int, generator: torch.Generator) -> list[Tensor]:
    """One pass over ``n`` rows in shuffled batches of ``size``."""
    order = torch.randperm(n, generator=generator)
    return [order[i : i + size] for i in range(0, n, size)]


def adam(modules: Sequence[nn.Module], lr: float, **kwargs: Any) -> torch.optim.Adam:
    """Adam over the parameters of ``modules``."""
    return torch.optim.Adam([p for m in modules for p in m.parameters()], lr=lr, **kwargs)


def fit_regression(
    model: nn.Module,
    x: Tensor,
    target: Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    generator: torch.Generator,
    eps: float = 1e-8,
    amsgrad: bool = False,
    halve_every: int | None = None,
) -> list[float]:
    """Fit ``model(x) ~ target`` with MSE and Adam; the mean loss of each epoch.

    ``halve_every``: halve the learning rate every that many epochs (He et al.'s schedule).
    """
    opt = torch.optim.Adam(model.parameters(), lr=lr, eps=eps, amsgrad=amsgrad)
    params = [p for p in model.parameters() if p.requires_grad]
    losses = []
    model.train()
    for epoch in range(epochs):
        total = []
        for rows in permutation_batches(len(x), batch_size, generator):
            loss = F.mse_loss(model(x[rows]), target[rows])
            apply_gradients(loss, params, opt)
            total.append(float(loss.detach()))
        losses.append(sum(total) / len(total))
        if halve_every and (epoch + 1) % halve_every == 0:
            for group in opt.param_groups:
                group["lr"] /= 2
    model.eval()
    return losses


def invert_embeddings(
    model: nn.Module,
    u: Tensor,
    shape: Sequence[int],
    *,
    steps: int,
    lr: float,
    tv_weight: float,
    l2_weight: float,
    bounds: tuple[float, float] | None,
    init: Tensor | None = None,
    eps: float = 1e-8,
    amsgrad: bool = False,
) -> Tensor:
    """Optimise inputs x~ so that ``model(x~) ~ u`` (He et al.'s rMLE; Kang eq. 12).

    x~ starts at ``init`` (one sample, broadcast to every row; zeros when ``None``, as He et al.).

    Per sample: ``mean((model(x~) - u)^2) + tv_weight * TV(x~) + l2_weight * mean(x~^2)``; the
    samples are independent (the summed loss is optimised by Adam, per coordinate). ``bounds``:
    clip x~ into the data range after every step (``None``: no clipping).
    """
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    out = []
    for i in range(0, len(u), EVAL_CHUNK):
        target = u[i : i + EVAL_CHUNK]
        x = torch.zeros((len(target), *shape), device=u.device)
        if init is not None:
            x = x + init.to(x.device, x.dtype)
        x.requires_grad_(True)
        opt = torch.optim.Adam([x], lr=lr, eps=eps, amsgrad=amsgrad)
        for _ in range(steps):
            per_sample = (model(x) - target).pow(2).flatten(1).mean(1)
            if tv_weight:
                per_sample = per_sample + tv_weight * total_variation(x)
            if l2_weight:
                per_sample = per_sample + l2_weight * x.pow(2).flatten(1).mean(1)
            opt.zero_grad(set_to_none=True)
            per_sample.sum().backward()
            opt.step()
            if bounds is not None:
                with torch.no_grad():
                    x.clamp_(*bounds)
        out.append(x.detach())
    return torch.cat(out) if out else torch.empty((0, *shape), device=u.device)


class Conditional(nn.Module):
    """``net(cat(flatten(z), embed(y)))``: a label-conditioned network (SDAR's conditional models)."""

    def __init__(self, net: nn.Module, num_classes: int, label_dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_classes, label_dim)
        self.net = net

    def forward(self, z: Tensor, y: Tensor) -> Tensor:  # noqa: D102
        return self.net(torch.cat([z.flatten(1), self.embed(y)], 1))


# ------------------------------------------------------------------------- the step observer


class StepObserver(PartyHook):
    """Runs ``callback(party, ids, h_victim, epoch, step)`` after every step of the active party.

    The step (honest, or whatever another hook runs) runs first and its cut gradients are returned
    unchanged; ``h_victim`` is the (detached) embedding the victim sent for ``ids``. ``models``: the
    attacker's own models (listed in the party's models as ``<tag>.<role>``).
    """

    def __init__(
        self,
        name: str,
        party: ActiveParty,
        *,
        victim: str,
        callback: StepCallback | None = None,
        models: dict[str, nn.Module] | None = None,
    ) -> None:
        super().__init__(name)
        self.party = party
        self.victim = victim
        self.callback = callback
        self._models = dict(models or {})

    def step(
        self, ids: Tensor, received: Sequence[Tensor], *, epoch: int, step: int, senders: Sequence[str], proceed: StepFn
    ) -> list[Tensor]:
        """The step as it would run, then the attacker's side computation on what it received."""
        gradients = proceed(ids, received, epoch=epoch, step=step, senders=senders)
        if self.callback is not None:
            self.callback(self.party, ids, received[list(senders).index(self.victim)].detach(), epoch, step)
        return gradients

    def models(self) -> dict[str, nn.Module]:  # noqa: D102
        return self._models


def expose_models(party: ActiveParty, prefix: str, models: dict[str, nn.Module]) -> dict[str, str]:
    """Add the attack's models to what the party's ``models()`` returns (checkpoints, the view).

    Keys are ``<prefix>.<role>`` (``<prefix>#2.<role>`` ... when another hook on the same party
    already uses the prefix); returns the key of each role.
    """
    tag = party.attach(StepObserver(prefix, party, victim="", models=models))
    return {role: f"{tag}.{role}" for role in models}


# ------------------------------------------------------------------------------ the base class


class CuriousActiveAttack(FeatureAttack):
    """Base of the honest-but-curious active-party feature attacks.

    Subclasses build their training-time state in :meth:`setup` (called from :meth:`install`),
    do their per-step side computation in :meth:`on_step` (when ``observes_steps``), and
    reconstruct in :meth:`infer`. ``records_aux()`` says whether the observer keeps the victim
    embeddings of the aux rows; ``uses_top()`` whether the attack runs the top model (which needs
    exactly one passive party). ``aux_size`` (a count) takes precedence over ``aux_fraction``.
    """

    phase: ClassVar[Phase] = "post_training"
    reads: ClassVar[tuple[str, ...]] = ("embedding", "bottom_model", "top_model")
    threat = THREAT
    party = "active"
    observes_steps: ClassVar[bool] = False
    victim: str
    constraints: ClassVar[Mapping[str, Param]] = AUX_CONSTRAINTS

    def __init__(
        self,
        *,
        victim: str,
        aux_size: int | None,
        aux_fraction: float | None,
        aux_classes: Sequence[int] | None,
        target_split: Literal["train", "test"],
        n_targets: int | None,
        shadow_model: str | None,
        shadow_options: dict[str, Any] | None,
    ) -> None:
        if aux_size is None and aux_fraction is None and not self.aux_disjoint:
            raise ValueError(
                "a feature attack whose auxiliary rows are trained on needs an auxiliary set: give "
                "aux_size or aux_fraction"
            )
        self.victim = victim
        self.aux_size = aux_size
        self.aux_fraction = aux_fraction
        self.aux_classes = aux_classes
        self.target_split = target_split
        self.n_targets = n_targets
        self.shadow_model = shadow_model
        self.shadow_options = shadow_options

    # -- threat model ------------------------------------------------------------------------

    def records_aux(self) -> bool:
        """Whether the observer keeps the victim's training-time embeddings of the aux rows."""
        return False

    def uses_top(self) -> bool:
        """Whether the attack runs the active party's top model on a simulated victim embedding."""
        return True

    def check(self, scenario: Scenario) -> None:
        """Remember the public scenario; the top model can only be run with one passive party; refuse a training too
        short for the attack (:func:`~vflbench.attacks.base.require_training`)."""
        require(scenario.num_parties >= 2, self.name, "it needs a passive party to attack")
        require_training(self, scenario)
        if self.uses_top():
            require(
                scenario.num_parties == 2,
                self.name,
                f"it runs the active party's top model on a simulated embedding of the victim, which needs "
                f"exactly one passive party (the other parties' embeddings of the auxiliary rows are unknown), "
                f"but the scenario has {scenario.num_parties - 1}",
            )
        self.scenario_ = scenario

    def install(self, party: Party, grant: ThreatGrant) -> Sequence[PartyHook]:
        """Install the attacker's honest side computation on its own party (nothing it sends changes): its
        training-time state, and an observer of the steps when it needs one."""
        require(isinstance(party, ActiveParty), self.name, "the attacker must be the active party")
        aux, generator = grant.aux, grant.generator
        require(
            aux is not None and generator is not None,
            self.name,
            "it needs its auxiliary set (aux_size or aux_fraction)",
        )
        assert isinstance(party, ActiveParty) and aux is not None and generator is not None
        require(len(aux.ids) >= 2, self.name, "its auxiliary set needs at least 2 rows")
        require(
            torch.is_floating_point(aux.victim),
            self.name,
            "the victim's features are integer codes (tokens or categories), which it cannot reconstruct",
        )
        self.aux_ = aux
        self.aux_h_: Tensor | None = None
        self.aux_seen_ = torch.zeros(len(aux.ids), dtype=torch.bool)
        self.setup(party, aux, generator)
        if self.observes_steps or self.records_aux():
            return (StepObserver(self.name, party, victim=self.victim, callback=self._observe(aux)),)
        return ()

    def setup(self, party: ActiveParty, aux: AuxData, generator: torch.Generator) -> None:
        """Build the training-time state (nothing by default)."""

    def on_step(self, party: ActiveParty, ids: Tensor, h: Tensor, epoch: int, step: int) -> None:
        """The side computation after an honest step on rows ``ids`` (victim embedding ``h``)."""

    def _observe(self, aux: AuxData) -> StepCallback:
        record = self.records_aux()

        def callback(party: ActiveParty, ids: Tensor, h: Tensor, epoch: int, step: int) -> None:
            if record:
                pos = torch.searchsorted(aux.ids, ids).clamp(max=len(aux.ids) - 1)
                hit = aux.ids[pos] == ids
                if hit.any():
                    if self.aux_h_ is None:
                        self.aux_h_ = torch.zeros((len(aux.ids), *h.shape[1:]), dtype=h.dtype, device=h.device)
                    self.aux_h_[pos[hit]] = h[hit].clone()
                    self.aux_seen_[pos[hit]] = True
            if self.observes_steps:
                self.on_step(party, ids, h, epoch, step)

        return callback

    # -- building blocks ---------------------------------------------------------------------

    def build_shadow(self, aux: AuxData, generator: torch.Generator) -> nn.Module:
        """A shadow of the victim's bottom model: ``shadow_model`` (default the scenario's public bottom
        architecture) for the victim's slice shape, with the attacker's own initialisation."""
        name = self.shadow_model or self.scenario_.bottom
        part = PartySlice(aux.victim, aux.victim[:0], "image" if aux.victim.dim() == 4 else "tabular")
        return build_bottom(name, part, self.scenario_.embed_dim, generator, **(self.shadow_options or {}))

    def joint_outputs(self, top: nn.Module, own_h: Tensor | None, victim_h: Tensor) -> Tensor:
        """The top model's output on the attacker's own embedding and a victim embedding."""
        parts = [victim_h] if own_h is None else [own_h, victim_h]
        return top(aggregate(parts, self.scenario_.aggregation))  # type: ignore[arg-type]

    @staticmethod
    def own_bottom(models: dict[str, nn.Module], own_x: Tensor | None) -> nn.Module | None:
        """The attacker's bottom model, when it holds features."""
        return models.get("bottom") if own_x is not None else None

    def aux_embeddings(self, view: PartyView) -> tuple[Tensor, Tensor]:
        """Positions in the aux set with a victim embedding, and those embeddings.

        Inference-time embeddings of the aux rows when the view holds them, else the last ones
        received during training (see the module docstring).
        """
        aux = view.aux
        assert aux is not None
        for r in view.received:
            if r.sender == self.victim and r.split == "train" and torch.equal(r.ids, aux.ids):
                return torch.arange(len(aux.ids)), r.embeddings
        seen, h = getattr(self, "aux_seen_", None), getattr(self, "aux_h_", None)
        if seen is None or h is None or not seen.any():
            raise CompatibilityError(
                f"attack {self.name!r}: no embedding of an auxiliary row was received during training"
            )
        kept = torch.nonzero(seen).flatten()  # positions in the auxiliary set the attack trained with
        ids = self.aux_.ids[kept].cpu()
        # positions of those rows in the view's auxiliary set (the same set, or a part of it: the attacker search
        # holds some of its rows out to score its settings on)
        order = torch.argsort(aux.ids.cpu())
        sorted_ids = aux.ids.cpu()[order]
        at = torch.searchsorted(sorted_ids, ids).clamp(max=len(sorted_ids) - 1)
        hit = sorted_ids[at] == ids
        if not hit.any():
            raise CompatibilityError(
                f"attack {self.name!r}: no embedding of an auxiliary row was received during training"
            )
        return order[at[hit]].to(aux.ids.device), h[kept[hit.to(kept.device)]]

    def targets(self, view: PartyView) -> tuple[ReceivedEmbeddings, Tensor | None]:
        """The victim's inference-time embeddings of the target rows and the attacker's own slice of them."""
        r = received_from(view, self.victim)
        own = None
        if view.data is not None:
            own = (view.data.x_test if r.split == "test" else view.data.x_train)[r.ids]
        return r, own

    @staticmethod
    def labels_of(party: ActiveParty, ids: Tensor) -> Tensor:
        """The active party's own labels of training rows ``ids`` (class indices)."""
        return class_indices(party.objective.targets[ids])


def flat_dim(sample: Tensor) -> int:
    """Number of values in one sample."""
    return int(math.prod(sample.shape))
