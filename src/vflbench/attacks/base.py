"""The attack API: what an attacker sees (:class:`PartyView`) and what it returns.

An attack receives the view of ONE party, the attacker: its own features, its own trained
models, its own transcript and per-batch observations, and the auxiliary knowledge its threat
model grants (e.g. ``n`` known labels per class, or an auxiliary set of labelled rows with the
victim's features, :class:`AuxData`). Ground truth stays with the runner, which scores what the
attack returns (:class:`LabelInference` or :class:`FeatureInference`). An attack never sees
another party's data, labels or models.
"""

from __future__ import annotations

import copy
import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from vflbench.data.base import PartySlice
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.protocol.channel import Transcript
from vflbench.protocol.hooks import PartyHook
from vflbench.protocol.party import Party
from vflbench.registry import Params

Target = Literal["labels", "features"]
Phase = Literal["observer", "post_training", "malicious"]
Prior = Literal["random", "scratch", "local"]
LabelMetric = Literal["auto", "accuracy", "balanced_accuracy", "auc"]
LABEL_METRICS: tuple[str, ...] = ("auto", "accuracy", "balanced_accuracy", "auc")
Selection = Literal["last", "validation", "test_oracle"]
"""How the runner picks one of a trained attack's per-epoch inferences: ``"last"``, the last epoch;
``"validation"``, the epoch with the best score on a validation split of the attacker's own known labels
(``val_per_class`` per class, held out of its fine-tuning); ``"test_oracle"``, the epoch with the best
*test* score, an oracle no attacker has (the protocol of Fu et al.'s and VMask's code), kept only to
reproduce those papers' numbers and flagged wherever it is reported."""


@dataclass(frozen=True)
class Scale:
    """A value of an attack's :attr:`~Attack.search_space` relative to the configured one: ``factor`` times
    the attack's own setting (rounded, at least 1, for an integer setting). Cost knobs (epochs, iterations)
    are searched this way, so that a grid follows the budget the config gives the attack instead of replacing
    a small test budget by a paper-scale one."""

    factor: float

    def of(self, value: Any) -> Any:
        """The grid value for a configured ``value``."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"a relative search value (x{self.factor:g}) needs a numeric setting, got {value!r}")
        if isinstance(value, int):
            return max(1, round(value * self.factor))
        return value * self.factor

    def __str__(self) -> str:
        return f"x{self.factor:g}"


@dataclass(frozen=True)
class Scenario:
    """Public facts of the protocol that every party knows."""

    algorithm: str
    aggregation: str
    num_classes: int
    num_parties: int
    bottom: str
    top: str
    embed_dim: int
    single_logit: bool
    epochs: int = 0
    """VFL training epochs (``train.epochs``; 0: not known)."""
    steps_per_epoch: int = 0
    """Training batches per epoch (the rows the parties train on over ``train.batch_size``; 0: not known)."""


@dataclass(frozen=True)
class KnownLabels:
    """Training rows whose labels the attacker's threat model grants it."""

    ids: Tensor
    labels: Tensor


@dataclass(frozen=True)
class AuxData:
    """Auxiliary labelled rows the threat model grants a feature attacker (DMAVFL §3.2, D_aux).

    Rows ``ids`` of the training set for which the attacker knows its own slice (``own``;
    ``None`` when it holds no features), the victim party's slice (``victim``, in the slice's
    shape) and the labels. Drawn by the runner (``aux_size``/``aux_fraction``, restricted to
    ``classes`` for an out-of-distribution set, DMAVFL Table 5) and disjoint from the rows the
    attack is scored on. With several target parties (DMAVFL Table 6) ``victim`` is their
    slices concatenated along the last axis, ``victim_party`` their names joined by ``+`` and
    ``victim_widths`` each slice's size along that axis.
    """

    ids: Tensor
    own: Tensor | None
    victim: Tensor
    labels: Tensor
    victim_party: str
    classes: tuple[int, ...] | None = None
    victim_widths: tuple[int, ...] = ()


@dataclass(frozen=True)
class ThreatGrant:
    """What the threat model grants an attack before training, handed to :meth:`Attack.install`: the labels it
    knows (``known``, the same rows its view will hold), and, for attacks granted an auxiliary set, those rows
    (``aux``, the same as ``view.aux``) and ``generator``, its own random stream for everything it does during
    training (``None`` for the others)."""

    known: KnownLabels | None
    aux: AuxData | None = None
    generator: torch.Generator | None = None


@dataclass(frozen=True)
class ReceivedEmbeddings:
    """Embeddings the attacker received from ``sender`` through the inference protocol.

    When the active party asks for predictions on rows ``ids`` of ``split``, every passive party
    sends its embedding of those rows (after its own defenses); this is that message.
    """

    sender: str
    split: Literal["train", "test"]
    ids: Tensor
    embeddings: Tensor


@dataclass
class BatchRecord:
    """What the attacker observed on its own side for one training batch."""

    epoch: int
    step: int
    ids: Tensor
    embedding: Tensor
    gradient: Tensor
    param_grads: list[Tensor] | None = None


@dataclass
class PartyView:
    """Everything one attacking party holds; nothing else."""

    party: str
    scenario: Scenario
    data: PartySlice
    models: dict[str, nn.Module]
    transcript: Transcript
    records: list[BatchRecord]
    known: KnownLabels | None
    generator: torch.Generator
    aux: AuxData | None = None
    received: list[ReceivedEmbeddings] = field(default_factory=list)
    holdout: KnownLabels | None = None
    """Known labels the runner holds out of the attack's fine-tuning to score its settings on (the attacker
    search, ``evaluation.attacker_search``): an attack that fine-tunes on known labels leaves these rows out
    and returns its scores of them as ``validation`` (:func:`split_validation`); ``None`` otherwise."""

    def with_models(self, models: dict[str, nn.Module]) -> PartyView:
        """The same view with other models (e.g. randomly initialised for the scratch prior)."""
        return replace(self, models=models)

    def bottom(self) -> nn.Module:
        """A private copy of the attacker's bottom model (attacks may fine-tune it)."""
        return copy.deepcopy(self.models["bottom"])


@dataclass
class Scores:
    """Class scores for some rows: (n, C) scores, or (n,) scores of the positive class."""

    ids: Tensor
    scores: Tensor
    split: Literal["train", "test"] = "train"


@dataclass
class LabelInference:
    """What a label attack infers. The runner scores it against ground truth.

    ``train``/``test``: scores for training/test rows; ``batches``: one :class:`Scores` per
    training batch, scored per batch and averaged (Li et al.'s protocol for gradient attacks);
    ``per_epoch``: one inference per fine-tuning epoch, of which the runner reports one by the
    attack's selection rule (:data:`Selection`); ``validation``: scores for the attacker's own
    validation rows (training rows whose labels it knows and did not fine-tune on), which the
    ``"validation"`` rule selects on; ``details``: attack-specific diagnostics.
    """

    train: Scores | None = None
    test: Scores | None = None
    batches: list[Scores] | None = None
    per_epoch: list[LabelInference] | None = None
    validation: Scores | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class FeatureInference:
    """What a feature attack reconstructs. The runner scores it against the victim's features.

    ``features``: the reconstruction of the victim party's slice for rows ``ids`` of ``split``,
    in the slice's shape. ``shadow``: optionally the attacker's model of the victim's bottom
    model (DMAVFL's encoder f_e); the runner applies it to the victim's true features of the
    target rows and reports the embedding MSE and cosine distance to the victim's real
    embeddings (DMAVFL Table 1, "Emb MSE"/"Emb Cos"). ``details``: diagnostics.
    """

    ids: Tensor
    features: Tensor
    split: Literal["train", "test"] = "test"
    shadow: nn.Module | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Attack(Params, ABC):
    """Base class of attacks: declare the threat model, implement :meth:`infer`.

    Parameters are keyword-only constructor arguments stored unmodified. Class attributes
    declare the target, what the attack reads, its phase, its requirements and its paper;
    :meth:`check` enforces requirements before any training; attacks that act during training
    override :meth:`install`. Only what every attack needs lives here: an attack derives from
    :class:`LabelAttack` or :class:`FeatureAttack`, which hold what one kind of attack needs.
    """

    name: ClassVar[str] = ""
    target: ClassVar[Target]
    """What the attack infers: set by :class:`LabelAttack` and :class:`FeatureAttack`."""
    reads: ClassVar[tuple[str, ...]] = ()
    phase: ClassVar[Phase] = "post_training"
    requirements: ClassVar[tuple[str, ...]] = ()
    paper: ClassVar[str] = ""
    threat: ClassVar[str] = ""
    party: str = "passive_1"
    repeatable: ClassVar[bool] = True
    """Whether :meth:`infer` draws anything (its random stream or known labels) after training, so that
    ``evaluation.repeats`` independent repeats on one trained model measure the attack's own randomness;
    attacks whose inference is fixed by training (e.g. norm scoring, a trained decoder) run once."""
    shares_draws_with: ClassVar[str | None] = None
    """Another attack whose known labels and random stream this one uses (None: its own, by name),
    so that two attacks that differ only in the model they start from are compared on equal terms."""
    search_space: ClassVar[Mapping[str, tuple[Any, ...]]] = {}
    """The attacker search's grid (``evaluation.attacker_search``): a small set of values for some of the
    attack's own parameters, all within its threat model, that the runner tries on the trained model and
    selects among on the attacker's own validation rows (never the test rows). Values are absolute, or
    :class:`Scale` factors of the configured value (for cost knobs). Only settings that act after training
    can be searched on one trained model: attacks whose settings act during training (malicious attacks,
    observers whose inference is fixed by what they kept) declare an empty grid and are reported as "default
    attacker only". What the threat model grants (the known-label budget, the auxiliary set) is never
    searched. Subclasses inherit their parent's grid; :meth:`search_grid` may narrow it per instance."""
    min_epochs: ClassVar[int] = 0
    """The fewest VFL epochs under attack that the attack needs (0: no minimum); with fewer, :func:`require_training`
    refuses the run before training unless it has at least ``min_steps`` training steps under attack."""
    min_steps: ClassVar[int] = 0
    """Training steps under attack that also suffice (0: only ``min_epochs`` counts)."""
    min_epochs_reason: ClassVar[str] = ""
    """Why (for the refusal's message)."""

    def check(self, scenario: Scenario) -> None:
        """Raise :class:`CompatibilityError` if the scenario does not meet the requirements."""

    def search_grid(self, scenario: Scenario) -> Mapping[str, tuple[Any, ...]]:
        """The grid the attacker search tries for this instance in ``scenario`` (:attr:`search_space` by
        default; an attack whose settings do nothing in some mode or scenario returns less, or nothing)."""
        return self.search_space

    def extra_embedding_dims(self) -> int:
        """Dimensions a malicious passive attacker appends to its uploaded embedding (0: none)."""
        return 0

    def install(self, party: Party, grant: ThreatGrant) -> Sequence[PartyHook]:
        """Install the attack on its own ``party`` before training, with what the threat model grants it; return
        the hooks (:class:`~vflbench.protocol.hooks.PartyHook`) the runner attaches to that party, in order.

        The one way an attack acts during training. Honest-but-curious attacks return observers (their party's
        behaviour does not change) or attach recorders to their own party's layers (VMask's masked layers);
        malicious attacks may also change their own party (its optimizer, its bottom model) or return a hook
        that replaces its step. Attacks that act only after training return nothing (the default)."""
        return ()

    @abstractmethod
    def infer(self, view: PartyView) -> LabelInference | FeatureInference:
        """Run the attack on the attacker's view."""


class LabelAttack(Attack):
    """Base class of label attacks (``target = "labels"``): they infer the active party's labels.

    The threat model may grant ``known_per_class`` known labels of every class (drawn by the runner, seeded by
    the attack's name, :func:`draws_of`). The attack is scored under ``metric``: ``"auto"`` (AUC for binary
    tasks, top-1 accuracy otherwise), ``"accuracy"`` or ``"auc"``; its leakage is measured against ``prior``
    (``"random"``, ``"scratch"``: the attack run on freshly initialised models, or ``"local"``: :meth:`local`),
    scored under the same metric. Label attacks that let the user choose the metric take it as a keyword
    parameter (:func:`check_metric`). ``every_epoch``: the runner snapshots the attacker's models after every
    epoch and reports the attack on each (``per_epoch``). ``select``: how the runner picks one of a trained
    attack's per-epoch inferences (:data:`Selection`), with ``val_per_class`` known labels of every class held
    out for ``"validation"`` (:func:`split_validation`); attacks that fine-tune take both as keyword parameters.
    """

    target: ClassVar[Target] = "labels"
    known_per_class: int = 0
    prior: Prior = "random"
    metric: LabelMetric = "auto"
    every_epoch: bool = False
    select: Selection = "last"
    val_per_class: int = 1

    def local(self, view: PartyView) -> LabelInference:
        """The attacker's prior J_loc: its model trained on its known labels only.

        ``view.models`` are freshly initialised models of the attacker's architecture.
        """
        raise CompatibilityError(f"attack {self.name!r} has no 'local' prior; use prior: random or scratch")


class FeatureAttack(Attack):
    """Base class of feature attacks (``target = "features"``): they reconstruct a passive party's features.

    A feature attack names its ``victim`` passive party (a list of parties where ``multi_victim`` is set:
    DMAVFL's several target clients), may ask for an auxiliary set (``aux_size`` or ``aux_fraction``, optionally
    ``aux_classes``), and is scored on ``n_targets`` rows (all when ``None``) of ``target_split``; its prior is
    the auxiliary set's mean. ``aux_disjoint`` declares that the threat model's auxiliary set is disjoint from
    the training set (DMAVFL §3.2: D_aux ∩ D_train = ∅): the runner then holds those rows out of every party's
    training.
    """

    target: ClassVar[Target] = "features"
    victim: str | Sequence[str] = "passive_1"
    multi_victim: ClassVar[bool] = False
    aux_size: int | None = None
    aux_fraction: float | None = None
    aux_classes: Sequence[int] | None = None
    aux_disjoint: ClassVar[bool] = False
    target_split: Literal["train", "test"] = "test"
    n_targets: int | None = None


def split_validation(
    known: KnownLabels, select: str, val_per_class: int, generator: torch.Generator, holdout: KnownLabels | None = None
) -> tuple[KnownLabels, KnownLabels | None]:
    """The known labels an attack fine-tunes on and, with ``select == "validation"``, the validation split
    it selects its epoch on: ``val_per_class`` rows of every class, drawn from ``generator`` (the attack's
    own stream) and held out of the fine-tuning. Other rules keep every known label for fine-tuning.

    ``holdout`` (the view's :attr:`PartyView.holdout`, set by the attacker search): the runner's own
    validation rows, held out whatever the rule, with no draw from ``generator`` (so that every setting the
    search tries fine-tunes on the same rows with the same stream)."""
    if holdout is not None:
        held = torch.isin(known.ids.cpu(), holdout.ids.cpu()).to(known.ids.device)
        return KnownLabels(known.ids[~held], known.labels[~held]), holdout
    if select != "validation":
        return known, None
    order = torch.randperm(len(known.ids), generator=generator)
    held = torch.zeros(len(known.ids), dtype=torch.bool)
    labels = known.labels.cpu()  # row bookkeeping on the CPU, whatever device the labels are on
    for c in torch.unique(labels).tolist():
        rows = order[labels[order] == c]
        if len(rows) <= val_per_class:
            raise CompatibilityError(
                f"select: validation holds out {val_per_class} of the known labels of every "
                f"class, but class {c} has only {len(rows)}; raise known_per_class or lower "
                "val_per_class"
            )
        held[rows[:val_per_class]] = True
    return KnownLabels(known.ids[~held], known.labels[~held]), KnownLabels(known.ids[held], known.labels[held])


def check_selection(attack: str, select: str, val_per_class: int, known_per_class: int) -> None:
    """Raise a :class:`ConfigError` unless, for ``select: validation``, ``val_per_class`` leaves at least one
    known label per class to fine-tune on (each parameter alone is checked by its constraints)."""
    if select == "validation" and val_per_class >= known_per_class:
        raise ConfigError(
            f"attack {attack!r}: select: validation holds out val_per_class ({val_per_class}) of the "
            f"known_per_class ({known_per_class}) labels of every class, which leaves none to fine-tune "
            "on; raise known_per_class or use select: last"
        )


#: Parameters that say what an attack targets (which party, which rows it is given or scored on), not how it
#: computes: an attack whose other parameters are all at their defaults runs its default recipe.
TARGETING = ("party", "victim", "aux_size", "aux_fraction", "aux_classes", "target_split", "n_targets", "metric")


def default_recipe(attack: Attack) -> bool:
    """Whether every parameter of ``attack`` other than :data:`TARGETING` ones has its constructor's default value."""
    for name, param in inspect.signature(type(attack).__init__).parameters.items():
        if name in TARGETING or param.default is inspect.Parameter.empty:
            continue
        if name in vars(attack) and getattr(attack, name) != param.default:
            return False
    return True


def require_training(attack: Attack, scenario: Scenario, *, before: int = 0) -> None:
    """Refuse (:class:`CompatibilityError`, before training) a run shorter than the attack's default recipe needs:
    fewer than its ``min_epochs`` VFL epochs under attack (``train.epochs`` less the ``before`` epochs of honest
    training first) and fewer than its ``min_steps`` training steps under attack. The minimum is what the default
    recipe was measured to need, so an attack given a recipe of its own (any parameter other than what it targets,
    :func:`default_recipe`) is run as configured; scenarios that do not know the training length (``epochs`` 0)
    are not checked."""
    if not attack.min_epochs or not scenario.epochs or not default_recipe(attack):
        return
    epochs = scenario.epochs - before
    steps = epochs * scenario.steps_per_epoch
    if epochs >= attack.min_epochs or (attack.min_steps and steps >= attack.min_steps):
        return
    honest = f" (train.epochs {scenario.epochs} less {before} honest epochs)" if before else ""
    steps_text = f", or at least {attack.min_steps} training steps under attack" if attack.min_steps else ""
    raise CompatibilityError(
        f"{attack.name} needs train.epochs >= {attack.min_epochs + before}{steps_text} with its default settings; "
        f"this run attacks for {epochs} epochs{honest} of {scenario.steps_per_epoch} steps ({steps} steps). "
        f"{attack.min_epochs_reason} Train longer, or give the attack settings of your own (e.g. its learning "
        "rates), which are then run as given and flagged if they reconstruct out of the data's range"
    )


def require(condition: bool, attack: str, message: str) -> None:
    """Raise a :class:`CompatibilityError` naming the attack when ``condition`` fails."""
    if not condition:
        raise CompatibilityError(f"attack {attack!r} cannot run here: {message}")


def check_metric(attack: str, metric: str, scenario: Scenario) -> None:
    """Raise a :class:`CompatibilityError` for AUC on a task with more than two classes (the annotation
    :data:`LabelMetric` lists the metrics)."""
    require(
        metric != "auc" or scenario.num_classes == 2,
        attack,
        f"metric 'auc' needs binary labels, but the task has {scenario.num_classes} classes; "
        "use metric: accuracy or auto",
    )


def binary_only(attack: str, scenario: Scenario) -> None:
    """Norm/direction scoring and friends need a binary task."""
    require(
        scenario.num_classes == 2, attack, f"it needs binary labels, but the task has {scenario.num_classes} classes"
    )


def stack_ids(parts: Sequence[Scores]) -> Tensor:
    """All ids of several score sets, concatenated."""
    return torch.cat([p.ids for p in parts])


def draws_of(attack: Attack) -> str:
    """The name under which the runner seeds the attack's known labels and random stream."""
    return attack.shares_draws_with or attack.name


def victims_of(attack: FeatureAttack) -> tuple[str, ...]:
    """The passive parties a feature attack targets (its ``victim``: one name or a list)."""
    return (attack.victim,) if isinstance(attack.victim, str) else tuple(attack.victim)
