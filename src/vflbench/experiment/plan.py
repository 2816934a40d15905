"""Planning attacks before training: compatibility with the scenario, auxiliary sets, what transcripts keep.

The experiment layer is the only place that holds ground truth; attacks receive only their party's view."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

import torch
from torch import Tensor, nn

from vflbench.attacks.base import (
    Attack,
    AuxData,
    BatchRecord,
    FeatureAttack,
    KnownLabels,
    LabelAttack,
    Scenario,
    ThreatGrant,
    draws_of,
    victims_of,
)
from vflbench.attacks.registry import create_attack
from vflbench.data import VerticalData, known_label_indices
from vflbench.data.sampling import aux_indices
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.experiment.config import ExperimentConfig
from vflbench.experiment.scenario import DEFAULT_EMBED_DIM, pool_rows, pool_size
from vflbench.protocol import Federation, PassiveParty, StepState
from vflbench.protocol.grants import Grant
from vflbench.protocol.hooks import PartyHook
from vflbench.protocol.messages import ACTIVE, passive_index, passive_names
from vflbench.protocol.party import Party
from vflbench.rng import generator

log = logging.getLogger(__name__)


def scenario_of(cfg: ExperimentConfig, vd: VerticalData) -> Scenario:
    """The public protocol facts of a config."""
    cfg = cfg.resolved()
    single = cfg.train.algorithm == "vlr" and vd.num_classes == 2
    out = 1 if single else vd.num_classes
    embed = out if cfg.train.algorithm == "vlr" else (cfg.model.embed_dim or DEFAULT_EMBED_DIM)
    assert cfg.train.aggregation and cfg.model.bottom and cfg.model.top
    trained = len(vd.y_train) - min(pool_size(cfg, len(vd.y_train)), len(vd.y_train))
    return Scenario(
        cfg.train.algorithm,
        cfg.train.aggregation,
        vd.num_classes,
        vd.num_parties,
        cfg.model.bottom,
        cfg.model.top,
        embed,
        single,
        epochs=cfg.train.epochs,
        steps_per_epoch=math.ceil(trained / cfg.train.batch_size),
    )


@dataclass
class PlannedAttack:
    """One configured attack and the state the runner keeps for it."""

    attack: Attack
    spec_params: dict[str, Any]
    records: list[BatchRecord] = field(default_factory=list)
    snapshots: list[dict[str, nn.Module]] = field(default_factory=list)
    aux: AuxData | None = None


def _trained(y_train: Tensor, pool: Tensor | None) -> Tensor | None:
    """The complement of the pool (rows the parties train on) as an exclusion list for the pool's draws."""
    if pool is None:
        return None
    keep = torch.ones(len(y_train), dtype=torch.bool)
    keep[pool] = False
    return torch.nonzero(keep).flatten()


def known_labels(
    attack: Attack, y_train: Tensor, seed: int, pool: Tensor | None = None, repeat: int = 0
) -> KnownLabels | None:
    """The labelled rows the attack's threat model grants (seeded per attack and repeat; never rows of the pool,
    which no party trains on)."""
    if not isinstance(attack, LabelAttack) or not attack.known_per_class:
        return None
    stream = ("known",) if repeat == 0 else ("known", repeat)
    ids = known_label_indices(
        y_train,
        per_class=attack.known_per_class,
        exclude=pool,
        generator=generator(seed, "attack", draws_of(attack), *stream),
    )
    return KnownLabels(ids, y_train[ids])


def wants_aux(attack: Attack) -> TypeGuard[FeatureAttack]:
    """Whether the attack's threat model grants an auxiliary set (only feature attacks ask for one; an attack whose
    set is disjoint from the training set always has one: the pool, or a draw from it)."""
    return isinstance(attack, FeatureAttack) and (
        attack.aux_disjoint or attack.aux_size is not None or attack.aux_fraction is not None
    )


def aux_data(
    attack: Attack, vd: VerticalData, own: Tensor | None, seed: int, pool: Tensor | None = None
) -> AuxData | None:
    """The auxiliary rows the attack's threat model grants (:func:`aux_ids`), or ``None``.

    ``own`` is the attacker's own training slice (``None`` when it holds no features); the
    victim's slice and the labels come from ``vd`` (the runner's ground truth).
    """
    if not wants_aux(attack):
        return None
    ids = aux_ids(attack, vd.y_train, seed, pool)
    names = victims_of(attack)
    victim, widths = victim_features(vd, names, "train", ids)
    classes = tuple(int(c) for c in attack.aux_classes) if attack.aux_classes is not None else None
    return AuxData(
        ids,
        None if own is None else own[ids].clone(),
        victim.clone(),
        vd.y_train[ids].clone(),
        "+".join(names),
        classes,
        widths if len(names) > 1 else (),
    )


def aux_ids(attack: FeatureAttack, y_train: Tensor, seed: int, pool: Tensor | None = None) -> Tensor:
    """The training rows of the attack's auxiliary set (sorted; the same draw for a seed, an attack and a pool).

    An attack whose set is disjoint from the training set (``aux_disjoint``) draws from the pool
    (:func:`pool_rows`): all of it (of ``aux_classes``) when it gives neither ``aux_size`` nor ``aux_fraction``,
    else that many rows of it (``aux_fraction`` is a share of the training split). Any other attack draws from the
    rows the parties train on (its threat model has them trained on, e.g. GRNA, GIA).
    """
    size, fraction = attack.aux_size, attack.aux_fraction if attack.aux_size is None else None  # a count first
    classes = attack.aux_classes
    y_train = y_train.cpu()  # row ids are drawn on the CPU, whatever device the labels are on
    if not attack.aux_disjoint:
        return aux_indices(
            y_train,
            generator=generator(seed, "attack", attack.name, "aux"),
            size=size,
            fraction=fraction,
            classes=classes,
            exclude=pool,
        )
    return _aux_from_pool(attack, y_train, seed, pool, size, fraction)


def _aux_from_pool(
    attack: FeatureAttack, y_train: Tensor, seed: int, pool: Tensor | None, size: int | None, fraction: float | None
) -> Tensor:
    """The auxiliary rows of an ``aux_disjoint`` attack, drawn from the held-out ``pool`` (see :func:`aux_ids`)."""
    classes = attack.aux_classes
    if pool is None or not len(pool):
        raise ConfigError(
            f"attack {attack.name!r} keeps its auxiliary set disjoint from the training set (its threat "
            "model), so it draws it from a pool of held-out rows: set data.aux_pool (a share of the "
            "training rows, e.g. 0.0909 for DMAVFL's |D_aux| : |D_train| = 1 : 10, or a row count); the "
            "pool is held out of training for every attack and defense of the config alike"
        )
    candidates = (
        pool
        if classes is None
        else pool[torch.isin(y_train[pool], torch.as_tensor(list(classes), dtype=y_train.dtype))]
    )
    if fraction is not None:
        reference = (
            len(y_train)
            if classes is None
            else int(torch.isin(y_train, torch.as_tensor(list(classes), dtype=y_train.dtype)).sum())
        )
        size = max(1, round(fraction * reference))
    if size is None:
        if not len(candidates):
            raise ConfigError(
                f"attack {attack.name!r}: the auxiliary pool holds no rows of aux_classes {list(classes or [])}"
            )
        return candidates.sort().values
    if size > len(candidates):
        raise ConfigError(
            f"attack {attack.name!r} asks for an auxiliary set of {size} rows, but the pool "
            f"(data.aux_pool) holds {len(candidates)}"
            + (" of its aux_classes" if classes else "")
            + "; raise data.aux_pool or ask for fewer rows (leave aux_size and aux_fraction unset to "
            "take the whole pool)"
        )
    return aux_indices(
        y_train,
        generator=generator(seed, "attack", attack.name, "aux"),
        size=size,
        classes=classes,
        exclude=_trained(y_train, pool),
    )


def victim_features(
    vd: VerticalData, victims: Sequence[str], split: str, ids: Tensor | None = None
) -> tuple[Tensor, tuple[int, ...]]:
    """The victims' slices of ``split`` (rows ``ids``, all when ``None``) concatenated along the last
    axis, and each one's width there."""
    parts = [getattr(vd.passive[passive_index(v)], "x_test" if split == "test" else "x_train") for v in victims]
    if ids is not None:
        parts = [x[ids] for x in parts]
    return (parts[0] if len(parts) == 1 else torch.cat(parts, -1)), tuple(int(x.shape[-1]) for x in parts)


def _check_victims(name: str, attack: FeatureAttack, victims: tuple[str, ...], vd: VerticalData) -> None:
    """A list of target parties: an attack built for them, distinct parties, slices that concatenate."""
    if not attack.multi_victim:
        raise ConfigError(
            f"attack {name!r} targets one passive party; give victim as one name (several target "
            "parties are supported by dmavfl and dmavfl_sync, DMAVFL Table 6)"
        )
    if len(set(victims)) != len(victims):
        raise ConfigError(f"attack {name!r}: the victims {list(victims)} name a party twice")
    shapes = [tuple(vd.passive[passive_index(v)].x_train.shape[1:]) for v in victims]
    if len({shape[:-1] for shape in shapes}) != 1:
        raise ConfigError(
            f"attack {name!r}: the victims' slices must agree in every axis but the last to be "
            f"reconstructed together; their shapes are {shapes}"
        )


@dataclass
class AttackPlan:
    """Validated attacks of a config and what each party's transcript must retain."""

    scenario: Scenario | None = None
    attacks: list[PlannedAttack] = field(default_factory=list)
    keep: dict[str, set[str]] = field(default_factory=dict)
    seed: int = 0
    y_train: Tensor | None = None
    data: VerticalData | None = None
    pool: Tensor | None = None

    def held_out(self) -> Tensor | None:
        """Training rows no party may train on: the auxiliary pool (:func:`pool_rows`), a function of the data,
        its split options and the seed only, so that every config of one seed trains on the same rows."""
        return self.pool

    def extra_dims(self) -> dict[str, int]:
        """Embedding dimensions malicious passive attackers append, by party."""
        out: dict[str, int] = {}
        for planned in self.attacks:
            extra = planned.attack.extra_embedding_dims()
            if extra:
                out[planned.attack.party] = out.get(planned.attack.party, 0) + extra
        return out

    def grants(self) -> list[Grant]:
        """The evaluation-only queries the scoring of these attacks needs between parties in separate processes
        (:mod:`vflbench.protocol.grants`): the victims' real bottom models for a feature attack of the active party
        (its shadow's embedding errors), the active party's VMask shares for VMask weight recovery (its
        reconstruction errors). Nothing else is granted."""
        from vflbench.attacks.label.vmask_recovery import VMaskWeightRecovery

        wanted: dict[tuple[str, str, str], list[str]] = {}
        for planned in self.attacks:
            attack = planned.attack
            if isinstance(attack, FeatureAttack) and attack.party == ACTIVE:
                for victim in victims_of(attack):
                    wanted.setdefault(("passive.oracle_bottom", victim, ACTIVE), []).append(attack.name)
            if isinstance(attack, VMaskWeightRecovery) and attack.party != ACTIVE:
                wanted.setdefault(("vmask.oracle", ACTIVE, attack.party), []).append(attack.name)
        return [
            Grant(kind, server, client, tuple(dict.fromkeys(names))) for (kind, server, client), names in wanted.items()
        ]

    def prepare(self, fed: Federation) -> None:
        """Install each attack on its own party before training (:meth:`Attack.install`, with what its threat model
        grants), attaching the hooks it returns, after the runner's own recorder of what the party sees."""
        parties = {p.name: p for p in fed.parties()}
        for planned in self.attacks:
            attack = planned.attack
            party = parties[attack.party]
            if {"model_gradient", "cut_gradient"} & set(attack.reads) and isinstance(party, PassiveParty):
                party.attach(_Recorder(planned, party, with_params="model_gradient" in attack.reads))
            assert self.y_train is not None
            grant = ThreatGrant(known_labels(attack, self.y_train, self.seed, self.pool))
            if wants_aux(attack):
                assert self.data is not None
                own = party.data.x_train if party.data is not None else None
                planned.aux = aux_data(attack, self.data, own, self.seed, self.pool)
                grant = replace(
                    grant, aux=planned.aux, generator=generator(self.seed, "attack", attack.name, "corrupt")
                )
            for hook in attack.install(party, grant):
                party.attach(hook)
            if isinstance(attack, LabelAttack) and attack.every_epoch:
                party.attach(_Snapshots(planned, party))


class _Snapshots(PartyHook):
    """The attacker's copy of its party's models at the end of every epoch (an attack scored at every epoch),
    taken at its own party's end of the epoch, after its defenses and the attack's own hooks, in one process or
    in the party's own."""

    def __init__(self, planned: PlannedAttack, party: Party) -> None:
        super().__init__(f"{planned.attack.name}.snapshots")
        self.planned = planned
        self.party = party

    def on_epoch_end(self, epoch: int) -> dict[str, Any]:
        self.planned.snapshots.append({k: attacker_copy(m) for k, m in self.party.models().items()})
        return {}


class _Recorder(PartyHook):
    """The attacker's record of what its passive party sees in each step: the batch's embedding, the
    cut gradient received and (``with_params``) its bottom's parameter gradients."""

    def __init__(self, planned: PlannedAttack, party: PassiveParty, *, with_params: bool) -> None:
        super().__init__(f"{planned.attack.name}.record")
        self.planned = planned
        self.party = party
        self.with_params = with_params

    def after_backward(self, state: StepState, gradient: Tensor) -> None:
        grads = None
        if self.with_params:
            assert self.party.bottom is not None
            grads = [
                p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                for p in self.party.bottom.parameters()
            ]
        assert state.embedding is not None
        self.planned.records.append(
            BatchRecord(state.epoch, state.step, state.ids, state.embedding.detach(), gradient.detach(), grads)
        )


def validate_attacks(cfg: ExperimentConfig, vd: VerticalData) -> AttackPlan:
    """Check every configured attack against the scenario before any training."""
    scenario = scenario_of(cfg, vd)
    plan = AttackPlan(scenario, seed=cfg.seed, y_train=vd.y_train, data=vd, pool=pool_rows(cfg, vd.y_train))
    valid_parties = [*passive_names(len(vd.passive)), ACTIVE]
    for spec in cfg.attacks:
        attack = create_attack(spec.name, **spec.params())
        if attack.party not in valid_parties:
            raise ConfigError(
                f"attack {spec.name!r}: party {attack.party!r} does not exist; "
                f"valid parties are: {', '.join(valid_parties)}"
            )
        if isinstance(attack, FeatureAttack):
            passives = valid_parties[:-1]
            victims = victims_of(attack)
            for victim in victims:
                if victim not in passives or victim == attack.party:
                    raise ConfigError(
                        f"attack {spec.name!r}: victim {victim!r} must be a passive party other than "
                        f"the attacker; valid victims are: {', '.join(passives)}"
                    )
            if not isinstance(attack.victim, str):
                _check_victims(spec.name, attack, victims, vd)
        attack.check(scenario)
        if isinstance(attack, LabelAttack) and attack.prior == "local" and type(attack).local is LabelAttack.local:
            raise CompatibilityError(f"attack {spec.name!r} has no 'local' prior; use prior: random or scratch")
        plan.attacks.append(PlannedAttack(attack, spec.params()))
        kinds = {"cut_gradient"} & set(attack.reads)
        if kinds:
            plan.keep.setdefault(attack.party, set()).update(kinds)
    for planned in plan.attacks:
        if wants_aux(planned.attack):
            aux_ids(planned.attack, vd.y_train, cfg.seed, plan.pool)  # refuses a set the pool cannot give
    return plan


def attacker_copy(model: nn.Module) -> nn.Module:
    """The attacker's private copy of one of its models: what it can run on its own.

    A model that involves another party provides ``attacker_copy()`` (VMask's bottom), or holds
    layers that provide ``attacker_module()`` (e.g. a Paillier-encrypted layer): the attacker cannot
    run those on its own, so the copy holds what the attacker can use in their place.
    """
    own = getattr(model, "attacker_copy", None)
    if callable(own):
        return own()
    clone = copy.deepcopy(model)
    for name, module in list(clone.named_modules()):
        replace = getattr(module, "attacker_module", None)
        if name and callable(replace):
            parent, _, child = name.rpartition(".")
            setattr(clone.get_submodule(parent) if parent else clone, child, replace())
    return clone
