"""Building a federation from a config: data, parties, models, optimizers, defenses."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor, nn

from vflbench.data import PartySlice, VerticalData, aux_indices, load_dataset, partition, subsample
from vflbench.defenses import check_defense, create_defense, defense_class
from vflbench.devices import resolve_device
from vflbench.errors import ConfigError
from vflbench.experiment.config import ExperimentConfig
from vflbench.models import build_bottom, build_top
from vflbench.protocol import (
    ACTIVE,
    ActiveParty,
    BindContext,
    Defense,
    DefenseAux,
    Endpoint,
    Federation,
    InMemoryTransport,
    PassiveParty,
    TopLayout,
    TrainSettings,
    Transcript,
    Transport,
    default_objective,
)
from vflbench.protocol.messages import PASSIVE, passive_index, passive_names
from vflbench.protocol.objective import Objective
from vflbench.protocol.service import PassivePeer
from vflbench.rng import generator

DEFAULT_EMBED_DIM = 16
log = logging.getLogger(__name__)


def load_vertical_data(cfg: ExperimentConfig, data_root: str | Path | None = None) -> VerticalData:
    """Load, subsample and partition the config's dataset, and move it to ``train.device`` (once: everything
    built from it later finds it there)."""
    d = cfg.data
    ds = load_dataset(d.name, root=d.root or data_root, **d.options)
    ds = subsample(
        ds, train_size=d.train_size, test_size=d.test_size, generator=generator(cfg.seed, "data", "subsample")
    )
    vd = partition(
        ds,
        parties=d.parties,
        active_has_features=cfg.train.algorithm != "vsnn",
        split=d.split,
        columns=d.columns,
        standardise=d.standardise,
    )
    vd.info.update(
        {
            "dataset": d.name,
            "parties": d.parties,
            "subsampled": d.train_size is not None or d.test_size is not None,
            "slice_shapes": [list(p.sample_shape) for p in vd.passive]
            + ([list(vd.active.sample_shape)] if vd.active is not None else []),
        }
    )
    return vd.to(resolve_device(cfg.train.device))


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


def plan_defenses(cfg: ExperimentConfig, passive_names: Sequence[str], *, active: bool = True) -> DefensePlan:
    """Instantiate the configured defenses for the parties built here, on the side each acts on: the active party's
    instances (``active``) and each of ``passive_names``', each its role's half where the defense declares halves
    (:meth:`Defense.for_role`). A party's own process builds its own instances only
    (another party's are never built there); every defense's parameters are checked either way."""
    plan = DefensePlan([], {n: [] for n in passive_names})
    for spec in cfg.defenses:
        check_defense(spec.name, spec.params())
        side = defense_class(spec.name).side
        if active and side in ("active", "both"):
            plan.active.append(create_defense(spec.name, **spec.params()).for_role(ACTIVE))
        if side in ("passive", "both"):
            for name in passive_names:
                plan.passive[name].append(create_defense(spec.name, **spec.params()).for_role(PASSIVE))
    return plan


@dataclass(frozen=True)
class PassiveData:
    """What a passive party's process holds of the dataset (:func:`passive_data`): its own feature slice, whose row
    ids are the shared row ids (row ``i`` of ``part`` is row ``i`` of the run), the number of classes and the
    number of feature-holding parties (both public, from the config and the dataset's description). No labels, no
    other party's columns."""

    name: str
    part: PartySlice
    num_classes: int
    holders: int


def _copy_slice(part: PartySlice) -> PartySlice:
    """``part`` with tensors of its own (a view of the loaded dataset would keep every column reachable)."""
    return PartySlice(part.x_train.clone(), part.x_test.clone(), part.kind, part.columns, dict(part.meta))


def shape_only(part: PartySlice, *, rows: Tensor | None = None) -> PartySlice:
    """``part``'s layout (sample shape, dtype, kind, columns, meta: what sizes a model of it) without its values;
    with ``rows``, the training rows ``rows`` of it (a grant, :attr:`PartySlice.rows`)."""
    empty = part.x_train.new_empty((0, *part.sample_shape))
    if rows is None:
        return PartySlice(empty, empty.clone(), part.kind, part.columns, dict(part.meta))
    ids = rows.sort().values
    return PartySlice(part.x_train[ids].clone(), empty, part.kind, part.columns, dict(part.meta), rows=ids)


def passive_data(vd: VerticalData, name: str) -> PassiveData:
    """Passive party ``name``'s own part of ``vd`` (copied, so that nothing else of ``vd`` stays reachable)."""
    return PassiveData(
        name, _copy_slice(vd.passive[passive_index(name)]), vd.num_classes, len(vd.passive) + (vd.active is not None)
    )


def active_data(vd: VerticalData, *, granted: Tensor | None = None) -> VerticalData:
    """The active party's part of ``vd``: its own slice and the labels (copied); each passive party's slice only as
    its layout, holding the training rows ``granted`` (the auxiliary rows a defense's threat model grants the active
    party, :func:`defense_aux_rows`) and nothing else."""
    rows = granted if granted is not None and len(granted) else None
    return VerticalData(
        vd.name,
        vd.num_classes,
        tuple(shape_only(p, rows=rows) for p in vd.passive),
        _copy_slice(vd.active) if vd.active is not None else None,
        vd.y_train.clone(),
        vd.y_test.clone(),
        info=dict(vd.info),
    )


def pool_size(cfg: ExperimentConfig, n: int) -> int:
    """How many of the ``n`` training rows ``data.aux_pool`` holds out (a row count, or a share of ``n``; 0: none)."""
    pool = cfg.data.aux_pool
    if not pool:
        return 0
    return pool if isinstance(pool, int) else max(1, round(pool * n))


def pool_rows(cfg: ExperimentConfig, y_train: Tensor) -> Tensor | None:
    """The training rows held out of every party's training as the auxiliary pool (``data.aux_pool``: a share
    of the training split, or a row count), sorted; ``None`` without a pool.

    A function of the dataset, its split options and the seed only, never of the attacks or defenses: every
    config with the same data section and seed trains on the same rows, so that verdicts compare like with
    like. Attacks and defenses whose threat model keeps their auxiliary set disjoint from the training set
    (``aux_disjoint``; VMask's shadow set) draw it from this pool.
    """
    n = len(y_train)
    size = pool_size(cfg, n)
    if not size:
        return None
    pool = cfg.data.aux_pool
    if size > (n + 1) // 2:
        raise ConfigError(
            f"data.aux_pool {pool} holds out {size} of the {n} training rows, more than half; "
            f"give at most {(n + 1) // 2} rows or a share of at most 0.5"
        )
    if size > 0.2 * n:
        log.warning(
            "data.aux_pool holds out %d of the %d training rows (%.0f%%); the papers' auxiliary sets are "
            "1-10%% of the training data",
            size,
            n,
            100.0 * size / n,
        )
    return aux_indices(y_train, generator=generator(cfg.seed, "data", "aux_pool"), size=size)


def defense_aux_ids(d: Defense, y_train: Tensor, seed: int, pool: Tensor | None) -> Tensor | None:
    """The auxiliary labelled rows defense ``d``'s threat model grants the active party, if it uses any
    (``uses_aux``): rows of the pool (:func:`pool_rows`), which no party trains on (VMask §IV-A) — all of it,
    or ``aux_size`` rows of it."""
    if not d.uses_aux:
        return None
    if pool is None or not len(pool):
        raise ConfigError(
            f"defense {d.name!r} trains on an auxiliary set disjoint from the rows the parties train "
            "on, drawn from a pool of held-out rows: set data.aux_pool (a share of the training rows, "
            "e.g. 0.02, or a row count such as 640); the pool is held out for every run of the config, "
            "defended or not"
        )
    size = getattr(d, "aux_size", None)
    if size is None:
        return pool
    if size > len(pool):
        raise ConfigError(
            f"defense {d.name!r} asks for aux_size {size} rows, but the pool (data.aux_pool) holds "
            f"{len(pool)}; raise data.aux_pool or leave aux_size unset to take the whole pool"
        )
    trained = torch.ones(len(y_train), dtype=torch.bool)
    trained[pool] = False
    return aux_indices(
        y_train,
        size=int(size),
        generator=generator(seed, "defense", d.name, "aux"),
        exclude=torch.nonzero(trained).flatten(),
    )


def aux_grants(
    cfg: ExperimentConfig, defenses: Sequence[Defense], y_train: Tensor, pool: Tensor | None
) -> list[Tensor | None]:
    """The auxiliary labelled rows each of the active party's ``defenses`` is granted (:func:`defense_aux_ids`, in
    order; ``None``: it takes none), drawn once from the pool ``pool`` (:func:`pool_rows`)."""
    return [defense_aux_ids(d, y_train, cfg.seed, pool) for d in defenses]


def defense_aux_rows(cfg: ExperimentConfig, plan: DefensePlan, y_train: Tensor) -> Tensor | None:
    """Every training row the active party's defenses in ``plan`` take as their auxiliary set (sorted)."""
    drawn = [ids for ids in aux_grants(cfg, plan.active, y_train, pool_rows(cfg, y_train)) if ids is not None]
    return torch.cat(drawn).unique() if drawn else None


def train_rows_of(n: int, excluded: Sequence[Tensor | None]) -> Tensor | None:
    """The training rows the loop trains on: all ``n`` but the ``excluded`` ones (``None``: all of them)."""
    left_out = [rows for rows in excluded if rows is not None and len(rows)]
    if not left_out:
        return None
    keep_rows = torch.ones(n, dtype=torch.bool)
    keep_rows[torch.cat(left_out)] = False
    return torch.nonzero(keep_rows).flatten()


def embed_dim_of(cfg: ExperimentConfig, out_dim: int) -> int:
    """The width of every bottom model's output: the top model's output width ``out_dim`` (after the active party's
    label transforms) in VLR, else ``model.embed_dim`` (default :data:`DEFAULT_EMBED_DIM`)."""
    m = cfg.resolved().model
    if cfg.train.algorithm == "vlr":
        if m.embed_dim not in (None, out_dim):
            raise ConfigError(f"VLR bottoms output the logits ({out_dim}); remove model.embed_dim")
        return out_dim
    return m.embed_dim or DEFAULT_EMBED_DIM


def _binder(
    cfg: ExperimentConfig,
    *,
    num_classes: int,
    num_parties: int,
    active_has_features: bool,
    link: Callable[[str], Endpoint],
    aux: Callable[[Defense, str], DefenseAux | None],
    device: torch.device,
) -> Callable[[Defense, str], None]:
    """Bind a defense instance at a party (the same context in one process and in a party's own process)."""
    t, seed = cfg.train, cfg.seed
    assert t.aggregation
    settings = TrainSettings(
        lr=t.lr, batch_size=t.batch_size, momentum=t.momentum, weight_decay=t.weight_decay, epochs=t.epochs
    )
    completion = next((a.params() for a in cfg.attacks if a.name == "model_completion"), None)

    def bind(d: Defense, party: str) -> None:
        d.bind(
            BindContext(
                party,
                t.algorithm,
                num_classes,
                num_parties,
                generator(seed, "defense", d.name, party),
                generator(seed, "defense", d.name, "shared"),
                link=link(party),
                train=settings,
                aggregation=t.aggregation,
                active_has_features=active_has_features,
                model_completion=completion,
                aux=aux(d, party),
                device=device,
            )
        )

    return bind


def passive_party(
    cfg: ExperimentConfig,
    name: str,
    part: PartySlice,
    *,
    defenses: Sequence[Defense],
    active_defenses: Sequence[Defense],
    embed_dim: int,
    bind: Callable[[Defense, str], None],
    transcript: Transcript,
) -> PassiveParty:
    """Passive party ``name`` on its slice ``part``: its defenses bound, its bottom model (wrapped by its own
    defenses), optimizer and schedule. The active party's defenses never receive this party's model: they look at
    an architecture built from the slice's layout (:func:`show_layout`), as in the active party's own process."""
    m, seed = cfg.model, cfg.seed
    assert m.bottom is not None
    device = part.x_train.device
    for d in defenses:
        bind(d, name)
    for d in defenses:
        part = d.augment_features(part).to(device)
    bottom = build_bottom(m.bottom, part, embed_dim, generator(seed, name, "init"), device=device, **m.bottom_options)
    show_layout(cfg, name, shape_only(part), active_defenses, embed_dim=embed_dim, device=device)
    for d in defenses:
        bottom = d.wrap_bottom(bottom, name).to(device)  # a wrapper's own layers are built (and seeded) on the CPU
    opt = make_optimizer(cfg, list(bottom.parameters()))
    for d in defenses:
        d.attach_optimizer(opt, name)
    return PassiveParty(
        name,
        data=part,
        bottom=bottom,
        optimizer=opt,
        scheduler=make_scheduler(cfg, opt),
        generator=generator(seed, name, "party"),
        defenses=list(defenses),
        transcript=transcript,
    )


def build_passive(
    cfg: ExperimentConfig,
    data: PassiveData,
    *,
    defenses: Sequence[Defense],
    embed_dim: int,
    link: Callable[[str], Endpoint],
    keep: set[str] | None = None,
) -> PassiveParty:
    """Passive party ``data.name`` alone, in its own process (:mod:`vflbench.experiment.party`): built from its own
    slice only, its defense halves bound to ``link(name)``, with the bottom model's width ``embed_dim`` as the
    active party sends it (it depends on the active party's label transforms in VLR). The same party, bit for bit,
    as :func:`build_federation` builds in one process, on ``train.device``."""
    cfg = cfg.resolved()
    data = replace(data, part=data.part.to(resolve_device(cfg.train.device)))
    if cfg.train.algorithm == "vsnn":
        raise ConfigError("a passive party's own process is not built for VSNN (the active party holds no features)")
    bind = _binder(
        cfg,
        num_classes=data.num_classes,
        num_parties=data.holders,
        active_has_features=True,
        link=link,
        aux=lambda d, party: None,
        device=data.part.x_train.device,
    )
    return passive_party(
        cfg,
        data.name,
        data.part,
        defenses=defenses,
        active_defenses=(),
        embed_dim=embed_dim,
        bind=bind,
        transcript=Transcript(data.name, keep or ()),
    )


def bind_active(
    cfg: ExperimentConfig, vd: VerticalData, defenses: Sequence[Defense], *, bind: Callable[[Defense, str], None]
) -> tuple[Objective, int]:
    """Bind the active party's ``defenses`` and let them transform its labels: the objective it trains on, and the
    bottom models' width that follows from it (:func:`embed_dim_of`). First of the active party's steps: the
    passive parties' bottoms are sized by it."""
    single_logit = cfg.train.algorithm == "vlr" and vd.num_classes == 2
    objective = default_objective(vd.y_train, vd.num_classes, single_logit=single_logit)
    for d in defenses:
        bind(d, ACTIVE)
        objective = d.transform_labels(objective)
    return objective, embed_dim_of(cfg, objective.out_dim)


def lay_out_top(
    cfg: ExperimentConfig,
    vd: VerticalData,
    defenses: Sequence[Defense],
    *,
    names: Sequence[str],
    embed_dim: int,
    extra_dims: Mapping[str, int] | None = None,
) -> TopLayout:
    """The top model's input layout, computed once (from public widths, never from a party's model) and handed to
    the active party's ``defenses`` (:meth:`Defense.bind_top`): the active party's own bottom's embedding first (if
    ``vd`` has an active slice; none in VSNN), then each passive party's in ``names`` order (the order the
    federation sends them), each ``embed_dim`` wide plus what ``extra_dims`` appends to it, aggregated by
    ``train.aggregation``. Second of the active party's steps, after :func:`bind_active`; :func:`build_active`
    builds the top model and the party by it."""
    assert cfg.train.aggregation
    own = [(ACTIVE, embed_dim)] if vd.active is not None else []
    extra = extra_dims or {}
    layout = TopLayout.of([*own, *((n, embed_dim + extra.get(n, 0)) for n in names)], cfg.train.aggregation)
    for d in defenses:
        d.bind_top(layout)
    return layout


def show_layout(
    cfg: ExperimentConfig,
    name: str,
    layout: PartySlice,
    defenses: Sequence[Defense],
    *,
    embed_dim: int,
    device: torch.device,
) -> None:
    """Let the active party's ``defenses`` look at passive party ``name``'s bottom architecture, built from its
    slice's ``layout`` only (VMask's shadow architecture, an information bottleneck's widths), never at the
    party's own model; the architecture is then dropped."""
    if not defenses:
        return
    assert cfg.model.bottom is not None
    architecture = build_bottom(
        cfg.model.bottom,
        layout,
        embed_dim,
        generator(cfg.seed, name, "architecture"),
        device=device,
        **cfg.model.bottom_options,
    )
    for d in defenses:
        architecture = d.wrap_bottom(architecture, name).to(device)


def show_layouts(
    cfg: ExperimentConfig,
    vd: VerticalData,
    defenses: Sequence[Defense],
    *,
    names: Sequence[str],
    embed_dim: int,
    device: torch.device,
) -> None:
    """:func:`show_layout` for every passive party of ``vd`` (in the active party's own process, where no passive
    party's model exists)."""
    for name, part in zip(names, vd.passive, strict=True):
        show_layout(cfg, name, part, defenses, embed_dim=embed_dim, device=device)


def build_active(
    cfg: ExperimentConfig,
    vd: VerticalData,
    *,
    objective: Objective,
    embed_dim: int,
    defenses: Sequence[Defense],
    layout: TopLayout,
    transcript: Transcript,
    device: torch.device,
) -> ActiveParty:
    """The active party: its slice (augmented by its defenses), bottom model (none in VSNN), the top model sized by
    what it aggregates (``layout``, :func:`lay_out_top`), the optimizer over both, all wrapped by its ``defenses``
    (bound already, :func:`bind_active`)."""
    m, t, seed = cfg.model, cfg.train, cfg.seed
    assert m.bottom and m.top and t.aggregation
    active_slice = vd.active
    for d in defenses if active_slice is not None else ():
        active_slice = d.augment_features(active_slice).to(device)  # type: ignore[arg-type]
    bottom = None
    if active_slice is not None:
        bottom = build_bottom(
            m.bottom, active_slice, embed_dim, generator(seed, ACTIVE, "init"), device=device, **m.bottom_options
        )
        for d in defenses:
            bottom = d.wrap_bottom(bottom, ACTIVE).to(device)
    if not layout.parts:
        raise ConfigError("the active party holds no features in VSNN, so it cannot train alone")
    top = build_top(
        m.top,
        layout.width,
        objective.out_dim,
        generator(seed, ACTIVE, "top"),
        device=device,
        **m.top_options,
    )
    if m.top == "identity" and embed_dim != objective.out_dim:
        raise ConfigError("an identity top model needs bottoms that output the logits")
    for d in defenses:
        top = d.wrap_top(top).to(device)
    opt = make_optimizer(cfg, list(top.parameters()) + (list(bottom.parameters()) if bottom is not None else []))
    for d in defenses:
        d.attach_optimizer(opt, ACTIVE)
    return ActiveParty(
        ACTIVE,
        data=active_slice,
        bottom=bottom,
        top=top,
        objective=objective,
        layout=layout,
        labels=vd.y_train,
        optimizer=opt,
        scheduler=make_scheduler(cfg, opt),
        generator=generator(seed, ACTIVE, "party"),
        defenses=list(defenses),
        transcript=transcript,
    )


def connect(
    active: ActiveParty,
    passives: Sequence[PassiveParty],
    transport: Transport,
    *,
    train_rows: Tensor | None = None,
    remote: Sequence[PassivePeer] = (),
) -> Federation:
    """The federation of ``active`` and the passive parties over ``transport``: ``passives`` held in this process
    (each serving its handlers), ``remote`` handles on those in other processes."""
    return Federation(active, passives, channel=transport, train_rows=train_rows, remote=remote)


def build_federation(
    cfg: ExperimentConfig,
    vd: VerticalData,
    *,
    defenses: DefensePlan | None = None,
    alone: bool = False,
    keep: dict[str, set[str]] | None = None,
    extra_dims: dict[str, int] | None = None,
    held_out: Tensor | None = None,
    device: torch.device | None = None,
) -> Federation:
    """Build the parties of ``cfg`` over ``vd`` in one process, joined by an in-memory transport (``alone``: the
    active party by itself): :func:`bind_active`, :func:`lay_out_top`, each passive party (:func:`passive_party`),
    :func:`build_active`,
    :func:`connect`. A party in its own process builds its side alone (:mod:`vflbench.experiment.party`).

    ``extra_dims`` widens a party's uploaded embedding (a malicious passive party appending
    dimensions); the top model is sized by what it receives, as in a deployment. No party trains on
    the auxiliary pool (:func:`pool_rows`, a function of the data section and the seed) nor on
    ``held_out``, further training rows to leave out. Every defense instance is bound
    with its party's endpoint of the federation's transport (its only way to reach other parties).

    Everything is built on ``device`` (default: ``train.device``): the data is moved there (a no-op when it is there
    already), every model is seeded on the CPU and moved there, and each defense is told it in its bind context.
    """
    cfg = cfg.resolved()
    device = resolve_device(cfg.train.device) if device is None else device
    vd = vd.to(device)  # a no-op when the run moved it already (once, after loading)
    keep = keep or {}
    passive_slices = () if alone else vd.passive
    names = passive_names(len(passive_slices))
    plan = defenses or DefensePlan([], {n: [] for n in names})
    channel, transcripts = _in_memory_transport(cfg, names, keep, plan, device)
    pool = pool_rows(cfg, vd.y_train)  # held out of training whatever the attacks and defenses
    grants = aux_grants(cfg, plan.active, vd.y_train, pool)
    bind = _binder(
        cfg,
        num_classes=vd.num_classes,
        num_parties=len(passive_slices) + 1,
        active_has_features=vd.active is not None,
        link=channel.endpoint,
        aux=granted_aux(plan.active, grants, vd.y_train, dict(zip(names, passive_slices, strict=True))),
        device=device,
    )
    objective, embed_dim = bind_active(cfg, vd, plan.active, bind=bind)
    layout = lay_out_top(cfg, vd, plan.active, names=names, embed_dim=embed_dim, extra_dims=extra_dims)
    passives = _passive_parties(cfg, names, passive_slices, plan, embed_dim, bind, transcripts)
    active = build_active(
        cfg,
        vd,
        objective=objective,
        embed_dim=embed_dim,
        defenses=plan.active,
        layout=layout,
        transcript=transcripts[ACTIVE],
        device=device,
    )
    return connect(active, passives, channel, train_rows=train_rows_of(len(vd.y_train), [pool, held_out, *grants]))


def _in_memory_transport(
    cfg: ExperimentConfig,
    names: Sequence[str],
    keep: dict[str, set[str]],
    plan: DefensePlan,
    device: torch.device,
) -> tuple[InMemoryTransport, dict[str, Transcript]]:
    """The federation's in-memory transport with each party's transcript registered on it (keeping the messages
    ``keep`` names), and the active party's defenses' extra parties (e.g. VMask's dealer) started on it."""
    channel = InMemoryTransport()
    transcripts = {n: Transcript(n, keep.get(n, ())) for n in (*names, ACTIVE)}
    for transcript in transcripts.values():
        channel.register(transcript)
    for d in plan.active:  # e.g. VMask's dealer, a party that is neither of the others: its own half
        for extra in d.extra_parties:
            d.for_role(extra).start_party(
                extra, channel.endpoint(extra), generator(cfg.seed, "defense", d.name, ACTIVE), device=device
            )
    return channel, transcripts


def _passive_parties(
    cfg: ExperimentConfig,
    names: Sequence[str],
    slices: Sequence[PartySlice],
    plan: DefensePlan,
    embed_dim: int,
    bind: Callable[[Defense, str], None],
    transcripts: dict[str, Transcript],
) -> list[PassiveParty]:
    """Each passive party (:func:`passive_party`) over its slice, with its defenses and transcript, in order."""
    return [
        passive_party(
            cfg,
            name,
            part,
            defenses=plan.passive[name],
            active_defenses=plan.active,
            embed_dim=embed_dim,
            bind=bind,
            transcript=transcripts[name],
        )
        for name, part in zip(names, slices, strict=True)
    ]


@dataclass
class ActiveSide:
    """The active party built in its own process (:func:`active_side`): the party, the bottom models' width its
    labels set (sent to every passive party) and the rows the loop trains on."""

    party: ActiveParty
    embed_dim: int
    train_rows: Tensor | None


def active_side(
    cfg: ExperimentConfig,
    vd: VerticalData,
    *,
    defenses: Sequence[Defense],
    link: Callable[[str], Endpoint],
    keep: Collection[str] = (),
    extra_dims: Mapping[str, int] | None = None,
    held_out: Tensor | None = None,
    device: torch.device | None = None,
) -> ActiveSide:
    """The active party of ``cfg`` in its own process (``vd`` from :func:`active_data`): its defense halves bound to
    ``link(active)``, the passive parties' bottoms shown to them as architectures only (:func:`show_layouts`),
    then :func:`build_active`; the same party, bit for bit, as :func:`build_federation` builds in one process.
    VMask's dealer is a process of its own, not started here."""
    cfg = cfg.resolved()
    device = resolve_device(cfg.train.device) if device is None else device
    vd = vd.to(device)
    names = passive_names(len(vd.passive))
    pool = pool_rows(cfg, vd.y_train)
    grants = aux_grants(cfg, defenses, vd.y_train, pool)
    bind = _binder(
        cfg,
        num_classes=vd.num_classes,
        num_parties=len(names) + 1,
        active_has_features=vd.active is not None,
        link=link,
        aux=granted_aux(defenses, grants, vd.y_train, dict(zip(names, vd.passive, strict=True))),
        device=device,
    )
    objective, embed_dim = bind_active(cfg, vd, defenses, bind=bind)
    layout = lay_out_top(cfg, vd, defenses, names=names, embed_dim=embed_dim, extra_dims=extra_dims)
    show_layouts(cfg, vd, defenses, names=names, embed_dim=embed_dim, device=device)
    active = build_active(
        cfg,
        vd,
        objective=objective,
        embed_dim=embed_dim,
        defenses=defenses,
        layout=layout,
        transcript=Transcript(ACTIVE, keep),
        device=device,
    )
    return ActiveSide(active, embed_dim, train_rows_of(len(vd.y_train), [pool, held_out, *grants]))


def granted_aux(
    defenses: Sequence[Defense], grants: Sequence[Tensor | None], y_train: Tensor, slices: Mapping[str, PartySlice]
) -> Callable[[Defense, str], DefenseAux | None]:
    """The auxiliary set each of the active party's ``defenses`` is granted (``grants``, :func:`aux_grants`): its
    rows, their labels and each passive party's columns of them (``slices``: in the active party's own process,
    the layouts holding only the granted rows, :func:`active_data`)."""
    by_instance = {id(d): ids for d, ids in zip(defenses, grants, strict=True)}

    def aux(d: Defense, party: str) -> DefenseAux | None:
        ids = by_instance.get(id(d)) if party == ACTIVE else None
        if ids is None:
            return None
        return DefenseAux(ids=ids, y=y_train[ids], x={n: part.train_rows(ids) for n, part in slices.items()})

    return aux
