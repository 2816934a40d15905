"""Building a federation from a config: data, parties, models, optimizers, defenses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from vflbench.data import PartySlice, VerticalData, aux_indices, load_dataset, partition, subsample
from vflbench.defenses import create_defense
from vflbench.errors import ConfigError
from vflbench.experiment.config import ExperimentConfig
from vflbench.models import build_bottom, build_top
from vflbench.protocol import (
    ACTIVE,
    ActiveParty,
    BindContext,
    Channel,
    Defense,
    DefenseAux,
    Endpoint,
    Federation,
    PassiveParty,
    TrainSettings,
    Transcript,
    default_objective,
    passive_name,
)
from vflbench.rng import generator

DEFAULT_EMBED_DIM = 16


def load_vertical_data(cfg: ExperimentConfig, data_root: str | Path | None = None) -> VerticalData:
    """Load, subsample and partition the config's dataset."""
    d = cfg.data
    ds = load_dataset(d.name, root=d.root or data_root, **d.options)
    ds = subsample(ds, train_size=d.train_size, test_size=d.test_size,
                   generator=generator(cfg.seed, "data", "subsample"))
    vd = partition(ds, parties=d.parties, active_has_features=cfg.train.algorithm != "vsnn",
                   split=d.split, columns=d.columns, standardise=d.standardise)
    vd.info.update({"dataset": d.name, "parties": d.parties,
                    "subsampled": d.train_size is not None or d.test_size is not None,
                    "slice_shapes": [list(p.sample_shape) for p in vd.passive]
                    + ([list(vd.active.sample_shape)] if vd.active is not None else [])})
    return vd


def make_optimizer(cfg: ExperimentConfig, params: Sequence[nn.Parameter]) -> torch.optim.Optimizer:
    """The configured optimizer over ``params``."""
    t = cfg.train
    if t.optimizer == "adam":
        return torch.optim.Adam(params, lr=t.lr, weight_decay=t.weight_decay)
    return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)


def make_scheduler(cfg: ExperimentConfig, opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The configured learning-rate schedule (stepped once per epoch)."""
    t = cfg.train
    if t.schedule == "step":
        return torch.optim.lr_scheduler.StepLR(opt, t.step_size, t.gamma)
    if t.schedule == "multistep":
        return torch.optim.lr_scheduler.MultiStepLR(opt, t.milestones, t.gamma)
    if t.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, t.epochs)
    return None


@dataclass
class DefensePlan:
    """Defense instances per party (each party gets its own instances of its side's defenses)."""

    active: list[Defense]
    passive: dict[str, list[Defense]]

    def all(self) -> list[Defense]:
        """Every instance, active side first."""
        return self.active + [d for ds in self.passive.values() for d in ds]


def plan_defenses(cfg: ExperimentConfig, passive_names: Sequence[str]) -> DefensePlan:
    """Instantiate the configured defenses for the parties whose side they act on."""
    plan = DefensePlan([], {n: [] for n in passive_names})
    for spec in cfg.defenses:
        probe = create_defense(spec.name, **spec.params())
        if probe.side in ("active", "both"):
            plan.active.append(probe)
        if probe.side in ("passive", "both"):
            for name in passive_names:
                plan.passive[name].append(create_defense(spec.name, **spec.params()))
    return plan


def build_federation(cfg: ExperimentConfig, vd: VerticalData, *, defenses: DefensePlan | None = None,
                     alone: bool = False, keep: dict[str, set[str]] | None = None,
                     extra_dims: dict[str, int] | None = None, held_out: Tensor | None = None,
                     links: Callable[[str], Endpoint] | None = None) -> Federation:
    """Build the parties of ``cfg`` over ``vd`` (``alone``: the active party by itself).

    ``extra_dims`` widens a party's uploaded embedding (a malicious passive party appending
    dimensions); the top model is sized by what it receives, as in a deployment. ``held_out``:
    training rows no party trains on (an attacker's auxiliary set that its threat model keeps
    disjoint from the training set, :meth:`AttackPlan.held_out`). Every defense instance is bound
    with its party's endpoint of the federation's channel (its only way to reach other parties), or
    with ``links(party)`` when given: a party's endpoint of a network channel, in a process that runs
    one party (:mod:`vflbench.experiment.party`); VMask's dealer is then a process of its own, not
    started here.
    """
    cfg = cfg.resolved()
    m, t, seed = cfg.model, cfg.train, cfg.seed
    assert m.bottom and m.top and t.aggregation
    keep = keep or {}
    passive_slices = () if alone else vd.passive
    names = [passive_name(i + 1) for i in range(len(passive_slices))]
    plan = defenses or DefensePlan([], {n: [] for n in names})
    single_logit = t.algorithm == "vlr" and vd.num_classes == 2
    objective = default_objective(vd.y_train, vd.num_classes, single_logit=single_logit)
    holders = len(passive_slices) + (vd.active is not None)
    channel = Channel()
    transcripts = {n: Transcript(n, keep.get(n, ())) for n in (*names, ACTIVE)}
    for transcript in transcripts.values():
        channel.register(transcript)
    for d in plan.active if links is None else ():  # e.g. VMask's dealer, a party that is neither of the others
        for extra in d.extra_parties:
            d.start_party(extra, channel.endpoint(extra), generator(seed, "defense", d.name, ACTIVE))
    defense_held_out: list[Tensor] = []
    settings = TrainSettings(lr=t.lr, batch_size=t.batch_size, momentum=t.momentum, weight_decay=t.weight_decay,
                             epochs=t.epochs)
    completion = next((a.params() for a in cfg.attacks if a.name == "model_completion"), None)

    def bind(d: Defense, party: str) -> None:
        d.bind(BindContext(party, t.algorithm, vd.num_classes, holders + (vd.active is None),
                           generator(seed, "defense", d.name, party), generator(seed, "defense", d.name, "shared"),
                           link=(links or channel.endpoint)(party), train=settings, aggregation=t.aggregation,
                           active_has_features=vd.active is not None, model_completion=completion,
                           aux=defense_aux(d, party)))

    def defense_aux(d: Defense, party: str) -> DefenseAux | None:
        """The auxiliary labelled set a defense's threat model grants the active party (``aux_size``)."""
        size = getattr(d, "aux_size", None)
        if party != ACTIVE or not size:
            return None
        ids = aux_indices(vd.y_train, size=min(int(size), len(vd.y_train)),
                          generator=generator(seed, "defense", d.name, "aux"))
        defense_held_out.append(ids)  # the auxiliary rows do not overlap the rows the parties train on (VMask §IV-A)
        return DefenseAux(ids=ids, y=vd.y_train[ids],
                          x={n: part.x_train[ids] for n, part in zip(names, passive_slices, strict=True)})

    for d in plan.active:
        bind(d, ACTIVE)
        objective = d.transform_labels(objective)
    if t.algorithm == "vlr":
        embed_dim = objective.out_dim
        if m.embed_dim not in (None, embed_dim):
            raise ConfigError(f"VLR bottoms output the logits ({embed_dim}); remove model.embed_dim")
    else:
        embed_dim = m.embed_dim or DEFAULT_EMBED_DIM

    def own_slice(name: str, part: PartySlice) -> PartySlice:
        for d in (plan.active if name == ACTIVE else plan.passive.get(name, ())):
            part = d.augment_features(part)
        return part

    def bottom_for(name: str, part: PartySlice) -> nn.Module:
        assert m.bottom is not None
        model = build_bottom(m.bottom, part, embed_dim, generator(seed, name, "init"), **m.bottom_options)
        for d in (*plan.active, *plan.passive.get(name, ())):
            model = d.wrap_bottom(model, name)
        return model

    passives = []
    for name, part in zip(names, passive_slices, strict=True):
        for d in plan.passive[name]:
            bind(d, name)
        part = own_slice(name, part)
        bottom = bottom_for(name, part)
        opt = make_optimizer(cfg, list(bottom.parameters()))
        for d in plan.passive[name]:
            d.attach_optimizer(opt, name)
        passives.append(PassiveParty(name, data=part, bottom=bottom, optimizer=opt,
                                     scheduler=make_scheduler(cfg, opt),
                                     generator=generator(seed, name, "party"), defenses=plan.passive[name],
                                     transcript=transcripts[name]))
    active_slice = own_slice(ACTIVE, vd.active) if vd.active is not None else None
    active_bottom = bottom_for(ACTIVE, active_slice) if active_slice is not None else None
    if holders == 0:
        raise ConfigError("the active party holds no features in VSNN, so it cannot train alone")
    widths = [embed_dim + (extra_dims or {}).get(n, 0) for n in names] + [embed_dim] * (active_slice is not None)
    in_dim = sum(widths) if t.aggregation == "concat" else embed_dim
    top = build_top(m.top, in_dim, objective.out_dim, generator(seed, ACTIVE, "top"), **m.top_options)
    if m.top == "identity" and embed_dim != objective.out_dim:
        raise ConfigError("an identity top model needs bottoms that output the logits")
    for d in plan.active:
        top = d.wrap_top(top)
    params = list(top.parameters()) + (list(active_bottom.parameters()) if active_bottom is not None else [])
    opt = make_optimizer(cfg, params)
    for d in plan.active:
        d.attach_optimizer(opt, ACTIVE)
    active = ActiveParty(ACTIVE, data=active_slice, bottom=active_bottom, top=top, objective=objective,
                         aggregation=t.aggregation, optimizer=opt, scheduler=make_scheduler(cfg, opt),
                         generator=generator(seed, ACTIVE, "party"), defenses=plan.active,
                         transcript=transcripts[ACTIVE])
    train_rows = None
    excluded = [*([held_out] if held_out is not None and len(held_out) else []), *defense_held_out]
    if excluded:
        keep_rows = torch.ones(len(vd.y_train), dtype=torch.bool)
        keep_rows[torch.cat(excluded)] = False
        train_rows = torch.nonzero(keep_rows).flatten()
    return Federation(active, passives, channel=channel, train_rows=train_rows)
