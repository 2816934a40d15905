"""The base class of defenses and the hook points of the training loop.

A defense attaches at named hook points of the one training loop, never by editing it.
Every hook is a no-op here; a defense overrides the ones it uses. Its parameters are
keyword-only constructor arguments stored unmodified (as in scikit-learn); its state and
randomness come from :meth:`Defense.bind`, called once before training.

| hook | side | called |
|---|---|---|
| ``augment_features`` | each party, its own slice | once, before models are built |
| ``transform_labels`` | active | once, before training |
| ``bind_top`` | active | once, after ``transform_labels``, before any model is wrapped |
| ``wrap_bottom`` / ``wrap_top`` | either | once, when models are built |
| ``attach_optimizer`` | either | once, when the party's optimizer is built |
| ``regularizer`` | either | every batch, extra loss |
| ``transform_embedding`` | passive | every batch, before sending |
| ``transform_cut_gradient`` | active | every batch, before sending |
| ``on_received_gradient`` | passive | every batch; return ``None`` to refuse the update |
| ``on_epoch_end`` | either | after every epoch |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from vflbench.data.base import PartySlice
from vflbench.protocol.channel import Endpoint
from vflbench.protocol.objective import Objective
from vflbench.protocol.surface import Rule
from vflbench.registry import Params

Side = Literal["active", "passive", "both"]
Aggregation = Literal["concat", "sum", "mean"]


@dataclass(frozen=True)
class TrainSettings:
    """The configured training recipe, as a defense may need it (e.g. VMask's shadow training)."""

    lr: float
    batch_size: int
    momentum: float
    weight_decay: float
    epochs: int


@dataclass(frozen=True)
class DefenseAux:
    """The auxiliary labelled rows a defense's threat model grants the active party (a defense that declares
    ``uses_aux``: rows of the held-out pool, ``data.aux_pool``).

    They are held out of the rows the parties train on. ``x``: each passive party's slice of them.
    """

    ids: Tensor
    y: Tensor
    x: Mapping[str, Tensor]


@dataclass(frozen=True)
class TopPart:
    """One party's embedding in the top model's input: columns ``start:start + width`` under ``concat``; the whole
    input (``start`` 0) under ``sum`` and ``mean``."""

    party: str
    start: int
    width: int

    @property
    def end(self) -> int:
        """The column after this party's last one."""
        return self.start + self.width


@dataclass(frozen=True)
class TopLayout:
    """The top model's input: which party's embedding fills which columns, in the order the active party aggregates
    them (its own bottom's first, if it has one, then what it receives, in the order the passive parties send), and
    how they are aggregated. Computed once where the federation is built (from public widths, never from another
    party's model); the active party aggregates by it and its defenses read it (``BindContext.top_layout``)."""

    parts: tuple[TopPart, ...]
    how: Aggregation

    @classmethod
    def of(cls, widths: Sequence[tuple[str, int]], how: Aggregation) -> TopLayout:
        """The layout of embeddings of ``widths`` (``(party, width)`` in aggregation order) aggregated by ``how``."""
        if how != "concat" and len({w for _, w in widths}) > 1:
            raise ValueError(f"{how} aggregation needs embeddings of one width, not {dict(widths)}")
        parts, start = [], 0
        for party, width in widths:
            parts.append(TopPart(party, start if how == "concat" else 0, width))
            start += width
        return cls(tuple(parts), how)

    @property
    def width(self) -> int:
        """The top model's input width: the sum of the embeddings' under ``concat``, else their common width."""
        if self.how == "concat":
            return sum(p.width for p in self.parts)
        return self.parts[0].width if self.parts else 0

    @property
    def parties(self) -> tuple[str, ...]:
        """The parties whose embeddings are aggregated, in order."""
        return tuple(p.party for p in self.parts)


@dataclass(frozen=True)
class BindContext:
    """What a defense learns about the run when it is bound (no other party's data).

    ``generator`` is private to this party's instance; ``shared_generator`` produces the same
    stream in every party's instance of the same defense (coordinated randomness agreed on in
    advance, e.g. MixUp's permutation and mixing weight). ``link``: this party's endpoint of the
    channel, through which the instance talks to its halves at other parties (only messages).
    ``model_completion``: the parameters of a configured ``model_completion`` attack (the attacker
    a defense may simulate), if any. ``device``: where the party's models and data live (``train.device``); a
    defense that makes tensors before it sees any of the party's puts them there (its generators stay on the CPU:
    draws are made there and moved). ``top_layout``: the top model's input layout (:class:`TopLayout`), at the
    active party's instances only, and only from :meth:`Defense.bind_top` on (the bottoms' width is known once the
    label transforms ran): ``None`` until then and at a passive party.
    """

    party: str
    algorithm: str
    num_classes: int
    num_parties: int
    generator: torch.Generator
    shared_generator: torch.Generator
    link: Endpoint | None = None
    train: TrainSettings | None = None
    aggregation: Aggregation | None = None
    active_has_features: bool = True
    model_completion: Mapping[str, Any] | None = None
    aux: DefenseAux | None = None
    device: torch.device | None = None
    top_layout: TopLayout | None = None


@dataclass
class StepState:
    """The current batch as seen by the party running the hook.

    At the active side ``targets`` and ``outputs`` are set; ``receiver`` names the passive
    party a cut gradient is for. At a passive side ``inputs`` and ``embedding`` are its own.
    """

    epoch: int
    step: int
    ids: Tensor
    party: str
    receiver: str | None = None
    inputs: Tensor | None = None
    embedding: Tensor | None = None
    embeddings: list[Tensor] | None = None
    outputs: Tensor | None = None
    targets: Tensor | None = None


class Defense(Params):
    """A protection attached at hook points (see the module docstring).

    Subclasses set ``name`` and ``side`` (``"active"``, ``"passive"``: one instance per passive
    party, or ``"both"``: one instance at every party; with :meth:`halves`, each party's instance is its role's
    class), take their parameters as keyword-only arguments,
    and override the hooks they need. ``strength`` aliases the main knob so that sweeps
    treat all defenses alike; ``strength_direction`` says whether larger is stronger.
    ``protects``: the attack targets it defends (``"labels"``, ``"features"``);
    ``adaptive_attacks``: names of attacks built against this defense (they need not be
    registered); ``adaptive_settings``: ``(parameter, value)`` pairs of this defense that model an
    adaptive or misbehaving party (e.g. LabObf's false-attribute client). ``uses_aux``: the active party's
    instance is granted an auxiliary labelled set disjoint from the training rows (:class:`DefenseAux`: the
    held-out pool, all of it or ``aux_size`` rows of it).
    """

    name: ClassVar[str] = ""
    side: ClassVar[Side] = "active"
    paper: ClassVar[str] = ""
    threat: ClassVar[str] = ""
    strength_param: ClassVar[str | None] = None
    strength_direction: ClassVar[str] = "larger is stronger"
    protects: ClassVar[tuple[str, ...]] = ()
    adaptive_attacks: ClassVar[tuple[str, ...]] = ()
    adaptive_settings: ClassVar[tuple[tuple[str, Any], ...]] = ()
    uses_aux: ClassVar[bool] = False
    #: Parties beside the federation's that this defense needs (VMask's trusted dealer: ``"dealer"``);
    #: the experiment runs each with :meth:`start_party` at its own endpoint, in one process or as its own.
    extra_parties: ClassVar[tuple[str, ...]] = ()
    #: Every message kind this defense's halves exchange (:func:`~vflbench.protocol.surface.requests`,
    #: :func:`~vflbench.protocol.surface.sends`, by role): with the parties in separate processes every frame is
    #: checked against the loop's kinds plus those of the run's defenses, so a kind left out is refused.
    surface: ClassVar[tuple[Rule, ...]] = ()
    #: Keys of :meth:`on_epoch_end` whose value after the last epoch summarises the run (a sweep's summary.csv
    #: gets a column of each: VMask's ``mask_ratio``).
    summary_metrics: ClassVar[tuple[str, ...]] = ()

    #: Whether :meth:`state_dict` / :meth:`load_state_dict` hold everything this party's instance needs to continue
    #: a run from an epoch checkpoint (``--resume`` of parties in separate processes).
    resumable: ClassVar[bool] = False

    @classmethod
    def halves(cls) -> Mapping[str, type[Defense]]:
        """One class per role (``"active"``, ``"passive"``, an extra party's name), for a defense whose parties run
        different code under one registered name and one parameter set (VMask: active, passive, dealer); each half
        subclasses the registered class, so it takes its parameters and constraints. Empty (the default): this
        class runs at every party of its :attr:`side`."""
        return {}

    def for_role(self, role: str) -> Defense:
        """The instance that runs at a party of ``role`` (:data:`~vflbench.protocol.messages.ACTIVE`,
        :data:`~vflbench.protocol.messages.PASSIVE` or an extra party's name): this one, or, for a defense with
        :meth:`halves`, that role's half built with the same parameters (only the local party's half is built)."""
        halves = self.halves()
        if not halves:
            return self
        if role not in halves:
            raise ValueError(f"defense {self.name!r} has no half for the role {role!r}; its roles: {', '.join(halves)}")
        return halves[role](**self.get_params())

    def state_dict(self) -> dict[str, Any]:
        """This party's instance's state at an epoch boundary (tensors and plain values only), for a checkpoint."""
        raise NotImplementedError(f"defense {self.name!r} keeps no checkpointable state; --resume refuses it")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s ``state``, on an instance bound and set up as at the run's start
        (called before the party's models are loaded)."""
        raise NotImplementedError(f"defense {self.name!r} keeps no checkpointable state; --resume refuses it")

    def start_party(
        self, name: str, link: Endpoint, generator: torch.Generator, *, device: torch.device | None = None
    ) -> None:
        """Run the extra party ``name`` (one of :attr:`extra_parties`) at ``link``, before any instance is
        bound; ``generator`` is a fresh generator on the active instance's seed path (a CPU generator);
        ``device``: where the party computes (``train.device``; ``None``: the CPU)."""
        raise NotImplementedError(f"{self.name} declares no extra party {name!r}")

    def bind(self, context: BindContext) -> None:
        """Receive the run context before training (store the generator here)."""
        self.context_ = context

    def bind_top(self, layout: TopLayout) -> None:
        """Receive the top model's input layout (active side: after the label transforms set the bottoms' width,
        before any model is wrapped); it joins the context as ``context_.top_layout``."""
        self.context_ = replace(self.context_, top_layout=layout)

    def augment_features(self, part: PartySlice) -> PartySlice:
        """Change this party's own feature slice before training (e.g. add an attribute column)."""
        return part

    def transform_labels(self, objective: Objective) -> Objective:
        """Change targets, loss, output width or decoding (active side)."""
        return objective

    def wrap_bottom(self, model: nn.Module, party: str) -> nn.Module:
        """Wrap or replace a bottom model (either side)."""
        return model

    def wrap_top(self, model: nn.Module) -> nn.Module:
        """Wrap or replace the top model (active side)."""
        return model

    def attach_optimizer(self, optimizer: torch.optim.Optimizer, party: str) -> None:
        """See the optimizer of a party this instance is bound to, once it is built (e.g. to hook its steps)."""

    def regularizer(self, state: StepState) -> Tensor | None:
        """An extra loss term for this batch, or ``None``."""
        return None

    def transform_embedding(self, embedding: Tensor, state: StepState) -> Tensor:
        """Change an embedding before the passive party sends it."""
        return embedding

    def transform_cut_gradient(self, gradient: Tensor, state: StepState) -> Tensor:
        """Change a cut-layer gradient before the active party sends it."""
        return gradient

    def on_received_gradient(self, gradient: Tensor, state: StepState) -> Tensor | None:
        """Observe (or change) a received gradient; ``None`` refuses the update."""
        return gradient

    def on_epoch_end(self, epoch: int) -> dict[str, Any]:
        """Called after every epoch; returned values go into the per-epoch metrics."""
        return {}

    def details(self) -> dict[str, Any]:
        """Facts this defense reports once, after training, in result.json's defense entry."""
        return {}


StepFn = Callable[..., list[Tensor]]
PredictFn = Callable[..., Tensor]


class PartyHook:
    """A party's own extra code at its declared protocol points (an attacker's code at its own party).

    An attack attaches one to the party it controls before training (:meth:`Party.attach`); the
    loop calls the party and the party calls its hooks, so nothing of the party is replaced by
    assignment. Every point is a no-op here; a hook overrides the ones it uses.

    | point | side | called |
    |---|---|---|
    | ``step`` | active | every training batch; returns the cut gradients (see below) |
    | ``predict`` | active | inference; ``proceed`` is the rest of the chain |
    | ``after_backward`` | passive | after a received gradient set the bottom's parameter gradients |
    | ``models`` | either | the hook's own models (in the party's checkpoints and its attacker's view) |
    | ``on_epoch_end`` | either | after every epoch; values go into the per-epoch metrics |

    ``step``'s ``proceed`` runs the rest of the chain (the honest step last): a hook calls it to
    observe, and skips it to replace the step (a malicious party). ``after_backward`` runs before
    the optimizer step. ``name``: who attached it (an attack's name). ``replaces_step``: the hook
    does not call ``proceed`` in :meth:`step` (at most one such hook per party).
    """

    replaces_step: ClassVar[bool] = False
    #: List the hook's models as ``<tag>.<role>`` (``False``: as ``<role>``, e.g. a malicious party's
    #: decoder, which is then simply one of the party's models).
    prefix_models: ClassVar[bool] = True

    def __init__(self, name: str) -> None:
        self.name = name

    def step(
        self, ids: Tensor, received: Sequence[Tensor], *, epoch: int, step: int, senders: Sequence[str], proceed: StepFn
    ) -> list[Tensor]:
        """One training step of the active party (default: the rest of the chain)."""
        return proceed(ids, received, epoch=epoch, step=step, senders=senders)

    def predict(self, ids: Tensor, received: Sequence[Tensor], split: str, *, proceed: PredictFn) -> Tensor:
        """The active party's outputs at inference (default: the rest of the chain)."""
        return proceed(ids, received, split)

    def after_backward(self, state: StepState, gradient: Tensor) -> None:
        """See a passive party's step after its parameter gradients are set (``gradient``: the cut gradient)."""

    def models(self) -> dict[str, nn.Module]:
        """The hook's own models by role."""
        return {}

    def on_epoch_end(self, epoch: int) -> dict[str, Any]:
        """Called after every epoch; returned values go into the per-epoch metrics."""
        return {}
