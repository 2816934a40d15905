"""Planning attacks before training: compatibility with the scenario, auxiliary sets, what transcripts keep.

The experiment layer is the only place that holds ground truth; attacks receive only their party's view."""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from vflbench.attacks.base import (
    Attack,
    AuxData,
    BatchRecord,
    KnownLabels,
    Scenario,
    draws_of,
    victims_of,
)
from vflbench.attacks.registry import create_attack
from vflbench.data import VerticalData, known_label_indices
from vflbench.data.sampling import aux_indices
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.experiment.config import ExperimentConfig
from vflbench.experiment.scenario import DEFAULT_EMBED_DIM
from vflbench.protocol import Federation, PassiveParty, StepState
from vflbench.protocol.grants import Grant
from vflbench.protocol.hooks import PartyHook
from vflbench.protocol.messages import ACTIVE, passive_index, passive_names
from vflbench.rng import generator

if TYPE_CHECKING:
    pass


log = logging.getLogger(__name__)


def scenario_of(cfg: ExperimentConfig, vd: VerticalData) -> Scenario:
    """The public protocol facts of a config."""
    cfg = cfg.resolved()
    single = cfg.train.algorithm == "vlr" and vd.num_classes == 2
    out = 1 if single else vd.num_classes
    embed = out if cfg.train.algorithm == "vlr" else (cfg.model.embed_dim or DEFAULT_EMBED_DIM)
    assert cfg.train.aggregation and cfg.model.bottom and cfg.model.top
    return Scenario(cfg.train.algorithm, cfg.train.aggregation, vd.num_classes, vd.num_parties,
                    cfg.model.bottom, cfg.model.top, embed, single)


@dataclass
class PlannedAttack:
    """One configured attack and the state the runner keeps for it.

    ``aux_exclude``: rows its auxiliary set is not drawn from. For an attack whose aux set is
    disjoint from the training set these are the aux rows of the other attacks whose threat
    models have their aux rows trained on (GIA, GRNA: they read the victim's training-time
    embeddings of them), so that no row has to be both held out and trained on.
    """

    attack: Attack
    spec_params: dict[str, Any]
    records: list[BatchRecord] = field(default_factory=list)
    snapshots: list[dict[str, nn.Module]] = field(default_factory=list)
    aux: AuxData | None = None
    aux_exclude: Tensor | None = None


def known_labels(attack: Attack, y_train: Tensor, seed: int) -> KnownLabels | None:
    """The labelled rows the attack's threat model grants (seeded per attack)."""
    if not attack.known_per_class:
        return None
    ids = known_label_indices(y_train, per_class=attack.known_per_class,
                              generator=generator(seed, "attack", draws_of(attack), "known"))
    return KnownLabels(ids, y_train[ids])


def wants_aux(attack: Attack) -> bool:
    """Whether the attack's threat model grants an auxiliary set."""
    return attack.aux_size is not None or attack.aux_fraction is not None


def aux_data(attack: Attack, vd: VerticalData, own: Tensor | None, seed: int,
             exclude: Tensor | None = None) -> AuxData | None:
    """The auxiliary rows the attack's threat model grants (seeded per attack), or ``None``.

    ``aux_size`` (a count) takes precedence over ``aux_fraction``; ``aux_classes`` restricts the
    draw to those classes (an out-of-distribution aux set).
    ``own`` is the attacker's own training slice (``None`` when it holds no features); the
    victim's slice and the labels come from ``vd`` (the runner's ground truth). ``exclude``: rows
    the draw avoids (:attr:`PlannedAttack.aux_exclude`).
    """
    if not wants_aux(attack):
        return None
    ids = aux_ids(attack, vd.y_train, seed, exclude)
    names = victims_of(attack)
    victim, widths = victim_features(vd, names, "train", ids)
    classes = tuple(int(c) for c in attack.aux_classes) if attack.aux_classes is not None else None
    return AuxData(ids, None if own is None else own[ids].clone(), victim.clone(), vd.y_train[ids].clone(),
                   "+".join(names), classes, widths if len(names) > 1 else ())


def aux_ids(attack: Attack, y_train: Tensor, seed: int, exclude: Tensor | None = None) -> Tensor:
    """The training rows of the attack's auxiliary set (sorted; the same draw for a seed, an attack name and
    ``exclude``, the rows the draw avoids)."""
    size, fraction = attack.aux_size, attack.aux_fraction if attack.aux_size is None else None  # a count first
    if fraction is not None and exclude is not None and 0.0 < fraction <= 1.0:
        # the fraction is of the training split (of its rows of aux_classes), whatever the draw avoids
        y = y_train.cpu()
        pool = y if attack.aux_classes is None else y[torch.isin(y, torch.as_tensor(list(attack.aux_classes),
                                                                                      dtype=y.dtype))]
        size, fraction = max(1, round(fraction * len(pool))), None
    return aux_indices(y_train, generator=generator(seed, "attack", attack.name, "aux"), size=size,
                       fraction=fraction, classes=attack.aux_classes, exclude=exclude)


def victim_features(vd: VerticalData, victims: Sequence[str], split: str,
                    ids: Tensor | None = None) -> tuple[Tensor, tuple[int, ...]]:
    """The victims' slices of ``split`` (rows ``ids``, all when ``None``) concatenated along the last
    axis, and each one's width there."""
    parts = [getattr(vd.passive[passive_index(v)], "x_test" if split == "test" else "x_train") for v in victims]
    if ids is not None:
        parts = [x[ids] for x in parts]
    return (parts[0] if len(parts) == 1 else torch.cat(parts, -1)), tuple(int(x.shape[-1]) for x in parts)


def _check_victims(name: str, attack: Attack, victims: tuple[str, ...], vd: VerticalData) -> None:
    """A list of target parties: an attack built for them, distinct parties, slices that concatenate."""
    if not attack.multi_victim:
        raise ConfigError(f"attack {name!r} targets one passive party; give victim as one name (several target "
                          "parties are supported by dmavfl and dmavfl_sync, DMAVFL Table 6)")
    if len(set(victims)) != len(victims):
        raise ConfigError(f"attack {name!r}: the victims {list(victims)} name a party twice")
    shapes = [tuple(vd.passive[passive_index(v)].x_train.shape[1:]) for v in victims]
    if len({shape[:-1] for shape in shapes}) != 1:
        raise ConfigError(f"attack {name!r}: the victims' slices must agree in every axis but the last to be "
                          f"reconstructed together; their shapes are {shapes}")


@dataclass
class AttackPlan:
    """Validated attacks of a config and what each party's transcript must retain."""

    scenario: Scenario | None = None
    attacks: list[PlannedAttack] = field(default_factory=list)
    keep: dict[str, set[str]] = field(default_factory=dict)
    seed: int = 0
    y_train: Tensor | None = None
    data: VerticalData | None = None

    def held_out(self) -> Tensor | None:
        """Training rows no party may train on: the auxiliary rows of every attack whose threat model
        keeps its auxiliary set disjoint from the training set (``aux_disjoint``; DMAVFL §3.2,
        §6.1), sorted; ``None`` when there are none. A function of the config's attacks and seed
        only, so a sweep's no-defense baseline (same attacks, same seed) holds out the same rows."""
        assert self.y_train is not None
        drawn = [aux_ids(p.attack, self.y_train, self.seed, p.aux_exclude) for p in self.attacks
                 if p.attack.aux_disjoint and wants_aux(p.attack)]
        return torch.cat(drawn).unique() if drawn else None

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
            if attack.target == "features" and attack.party == ACTIVE:
                for victim in victims_of(attack):
                    wanted.setdefault(("passive.oracle_bottom", victim, ACTIVE), []).append(attack.name)
            if isinstance(attack, VMaskWeightRecovery) and attack.party != ACTIVE:
                wanted.setdefault(("vmask.oracle", ACTIVE, attack.party), []).append(attack.name)
        return [Grant(kind, server, client, tuple(dict.fromkeys(names)))
                for (kind, server, client), names in wanted.items()]

    def prepare(self, fed: Federation) -> None:
        """Install each attack on its own party before training."""
        parties = {p.name: p for p in fed.parties()}
        for planned in self.attacks:
            attack = planned.attack
            party = parties[attack.party]
            attack.observe(party)
            if {"model_gradient", "cut_gradient"} & set(attack.reads) and isinstance(party, PassiveParty):
                party.attach(_Recorder(planned, party, with_params="model_gradient" in attack.reads))
            assert self.y_train is not None
            known = known_labels(attack, self.y_train, self.seed)
            if wants_aux(attack):
                assert self.data is not None
                own = party.data.x_train if party.data is not None else None
                planned.aux = aux_data(attack, self.data, own, self.seed, planned.aux_exclude)
                attack.corrupt(party, known, aux=planned.aux,
                               generator=generator(self.seed, "attack", attack.name, "corrupt"))
            else:
                attack.corrupt(party, known)

    def on_epoch_end(self, fed: Federation) -> None:
        """Snapshot the attacker's models for attacks evaluated at every epoch."""
        parties = {p.name: p for p in fed.parties()}
        for planned in self.attacks:
            if planned.attack.every_epoch:
                models = parties[planned.attack.party].models()
                planned.snapshots.append({k: attacker_copy(m) for k, m in models.items()})


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
            grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                     for p in self.party.bottom.parameters()]
        assert state.embedding is not None
        self.planned.records.append(BatchRecord(state.epoch, state.step, state.ids, state.embedding.detach(),
                                                gradient.detach(), grads))


def validate_attacks(cfg: ExperimentConfig, vd: VerticalData) -> AttackPlan:
    """Check every configured attack against the scenario before any training."""
    scenario = scenario_of(cfg, vd)
    plan = AttackPlan(scenario, seed=cfg.seed, y_train=vd.y_train, data=vd)
    valid_parties = [*passive_names(len(vd.passive)), ACTIVE]
    for spec in cfg.attacks:
        attack = create_attack(spec.name, **spec.params())
        if attack.party not in valid_parties:
            raise ConfigError(f"attack {spec.name!r}: party {attack.party!r} does not exist; "
                              f"valid parties are: {', '.join(valid_parties)}")
        if attack.target == "features":
            passives = valid_parties[:-1]
            victims = victims_of(attack)
            for victim in victims:
                if victim not in passives or victim == attack.party:
                    raise ConfigError(f"attack {spec.name!r}: victim {victim!r} must be a passive party other than "
                                      f"the attacker; valid victims are: {', '.join(passives)}")
            if not isinstance(attack.victim, str):
                _check_victims(spec.name, attack, victims, vd)
            if attack.prior != "random":
                raise CompatibilityError(f"attack {spec.name!r} is a feature attack: its prior is the aux-mean guess; "
                                         "use prior: random")
        attack.check(scenario)
        if attack.prior == "local" and type(attack).local is Attack.local:
            raise CompatibilityError(f"attack {spec.name!r} has no 'local' prior; use prior: random or scratch")
        plan.attacks.append(PlannedAttack(attack, spec.params()))
        kinds = {"cut_gradient"} & set(attack.reads)
        if kinds:
            plan.keep.setdefault(attack.party, set()).update(kinds)
    trained = [aux_ids(p.attack, vd.y_train, cfg.seed) for p in plan.attacks
               if wants_aux(p.attack) and not p.attack.aux_disjoint]
    if trained:
        kept = torch.cat(trained).unique()
        for planned in plan.attacks:
            if planned.attack.aux_disjoint:
                planned.aux_exclude = kept
    held = plan.held_out()
    if held is not None and len(held) >= len(vd.y_train):
        raise ConfigError(f"the auxiliary sets of the attacks hold out all {len(vd.y_train)} training rows "
                          "(they are disjoint from the training set); give a smaller aux_size or aux_fraction")
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
