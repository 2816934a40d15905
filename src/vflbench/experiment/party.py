"""One party of an experiment in its own process (see docs/deployment.md).

The active party's process runs the usual training loop (:class:`~vflbench.protocol.Federation`) over the gRPC
transport: the loop talks to every passive party through the same messages as in one process
(:mod:`vflbench.protocol.service`), through a :class:`RemotePassive` handle that checks what the party answers, and
the passive party's process answers them with its registered handlers (:class:`ServedPassive`). The dealer
of VMask's Beaver triples, when the config needs one, is a process of its own that answers
``dealer.*`` requests. Each process binds only its own party's defense halves to its
:class:`~vflbench.net.NetChannel` endpoint, so what crosses the wire between the halves is exactly
what they send with ``link.call``/``serve``/``post``/``take``.

Sequence: every process starts its channel (the start-up barrier); the active party builds its side and posts
``passive.setup`` (the bottom models' width) to each passive party, which builds its own (its VMask half sends
``vmask.setup`` to the active party while doing so); then each passive party
posts ``passive.ready`` and answers requests; the active party waits for every ``passive.ready``,
trains, posts ``passive.done``, takes each passive party's ``passive.report`` (its counters), writes
the run directory (``result.json`` atomically) and says goodbye; the dealer answers until every peer
has said goodbye.

One counter: ``result.json``'s ``comm`` is what the active party's transport counted (the loop's embeddings and cut
gradients and the defense halves' messages it sent or received), plus each passive party's ``dealer.*`` traffic
from its report, leaving out the ``passive.*`` requests that drive a passive party, as in one process.
``net.json`` records what crossed each link (frames and bytes) per epoch and the measured epoch times.

Each process keeps only its own part of the dataset (:func:`local_state`: a passive party its own slice, the active
party its slice, the labels and the passive parties' layouts) and builds only its own models; the bottom models'
width, which the active party's label transforms may set, reaches the passive parties in ``passive.setup``. Limits:
no VSNN, which :func:`check_party_config` refuses. Attacks run in their party's process; a process whose party runs
an attack keeps the whole dataset as the scorer's ground truth (not reachable from the party's objects), and a
passive party sends its attack results in its report.

What a party serves and accepts. Each process's channel lets through only the kinds of the protocol's surface
(:func:`~vflbench.net.policy.run_surface`) and, of the evaluation-only queries, only those the run's plan grants
(:meth:`~vflbench.experiment.plan.AttackPlan.grants`: the victim's bottom model for a feature attack's scorer);
a passive party may refuse those (``refuse_grants``), logs every one it answers, and both parties record the
grants in their results. Everything a party receives is checked before use against what the protocol expects
at that point: the embeddings' shape, dtype and finiteness, the cut gradient against the pending embedding and
its step, every report's size, nesting and fields (:func:`check_tensor`, :func:`from_bytes_tensor`); a
violation ends the run with a :class:`~vflbench.net.errors.ProtocolError` naming the sender.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vflbench.defenses import create_defense, defense_class
from vflbench.devices import resolve_device
from vflbench.errors import ConfigError
from vflbench.experiment.assemble import utility_of
from vflbench.experiment.config import ExperimentConfig, check_components
from vflbench.experiment.pipeline import Pipeline, RunDirectory
from vflbench.experiment.plan import AttackPlan, validate_attacks
from vflbench.experiment.remote import (
    RemotePassive,
    ServedPassive,
    comm_from_dict,
    final_report,
    nothing_else,
    refusals,
    refusing,
    restore_stats,
    stats_json,
    to_bytes_tensor,
    wire_of,
)
from vflbench.experiment.results import (
    AttackResult,
    TrainedRun,
    UtilityResult,
    save_torch_atomic,
    write_json,
)
from vflbench.experiment.resume import (
    check_resumable,
    committed_epoch,
    load_checkpoint,
    load_party_state,
    party_state,
    resumable,
    save_checkpoint,
    write_manifest,
)
from vflbench.experiment.run import (
    check_before_training,
    cpu_state_dict,
    environment,
    honest_result,
    needs_honest_reference,
    train_run,
    undefended_result,
)
from vflbench.experiment.scenario import (
    PassiveData,
    active_data,
    active_side,
    build_passive,
    connect,
    defense_aux_rows,
    load_vertical_data,
    passive_data,
    plan_defenses,
)
from vflbench.experiment.scoring import run_attacks
from vflbench.experiment.search import search_attacks
from vflbench.net.errors import ProtocolError
from vflbench.net.linkmodel import LINK_PROFILES, project
from vflbench.net.policy import Policy, role_of, run_surface
from vflbench.net.transport import NetChannel
from vflbench.protocol import Federation, History
from vflbench.protocol.channel import CommStats, Endpoint
from vflbench.protocol.grants import Grant
from vflbench.protocol.messages import ACTIVE, DEALER, passive_name
from vflbench.protocol.party import PassiveParty
from vflbench.protocol.service import protocol_kind
from vflbench.rng import generator

log = logging.getLogger(__name__)


def own_attacks(plan: AttackPlan, party: str) -> AttackPlan:
    """The attacks of ``plan`` that run at ``party`` (in its process)."""
    return dataclasses.replace(plan, attacks=[p for p in plan.attacks if p.attack.party == party])


def party_policy(cfg: ExperimentConfig, grants: Iterable[Grant] = ()) -> Policy:
    """The surface of ``cfg``'s run (:func:`~vflbench.net.policy.run_surface`: the loop's kinds, the remote passive
    party's requests included, and those each configured defense declares) with the run's ``grants``."""
    declared = [rule for spec in cfg.defenses for rule in defense_class(spec.name).surface]
    return Policy(run_surface(declared), grants)


@dataclass
class LocalState:
    """What one party's process keeps after loading the dataset (:func:`local_state`).

    ``data``: a passive party's :class:`~vflbench.experiment.scenario.PassiveData` (its own slice only), or the
    active party's :func:`~vflbench.experiment.scenario.active_data` (its slice, the labels, each passive party's
    layout and the auxiliary rows its defenses' threat model grants). ``defenses``: this party's own defense
    instances (no other party's are built here). ``attacks``: the attacks that run at this party (the active party's
    plan also lists the others', whose extra embedding widths size its top model). ``ground_truth``: the whole
    dataset, kept only when this party runs attacks: the experimenter's truth to score them (and the labels or
    auxiliary rows their threat models grant), never given to the party's own objects. ``positions``: where this
    party's attacks stand in the config's list. ``grants``: the evaluation-only queries the run's plan grants
    between any two parties (the same list in every process: :meth:`~vflbench.experiment.plan.AttackPlan.grants`).
    """

    data: Any
    defenses: Any
    attacks: AttackPlan
    positions: list[int]
    ground_truth: Any = None
    grants: list[Grant] = field(default_factory=list)


class OwnSide:
    """A passive party's process seen as a federation by the attack runner: the one party it holds."""

    def __init__(self, party: PassiveParty) -> None:
        self.passives = [party]

    def parties(self) -> list[PassiveParty]:
        """The process's own party."""
        return list(self.passives)

    def bottom_of(self, name: str) -> nn.Module | None:
        """The bottom model of ``name`` as the scorer may query it: the process's own party's; no other's is here."""
        own = self.passives[0]
        return own.bottom if name == own.name else None


def local_state(cfg: ExperimentConfig, party: str, data_root: str | Path | None = None) -> LocalState:
    """Load ``cfg``'s dataset, keep ``party``'s part of it (see :class:`LocalState`) and drop the rest: a dataset
    file holds every party's columns, so the process reads it once and slices it at once. Checks the config's
    attacks against the data first, as ``vflbench run`` does (the active party checks what needs the labels)."""
    cfg = cfg.resolved()
    if party not in party_names(cfg) or party == DEALER:
        raise ConfigError(f"party {party!r} holds no data in this config's run ({', '.join(party_names(cfg))})")
    vd = load_vertical_data(cfg, data_root)
    plan = plan_defenses(cfg, [] if party == ACTIVE else [party], active=party == ACTIVE)  # its own instances only
    attack_plan = validate_attacks(cfg, vd)
    positions = _positions(attack_plan, party)
    if party == ACTIVE:
        check_before_training(cfg, vd, attack_plan)
        attacks = attack_plan if positions else dataclasses.replace(attack_plan, data=None)
        return LocalState(
            active_data(vd, granted=defense_aux_rows(cfg, plan, vd.y_train)),
            plan,
            attacks,
            positions,
            vd if positions else None,
            attack_plan.grants(),
        )
    attacks = own_attacks(attack_plan, party) if positions else AttackPlan(seed=cfg.seed)
    return LocalState(
        passive_data(vd, party), plan, attacks, positions, vd if positions else None, attack_plan.grants()
    )


def check_party_config(cfg: ExperimentConfig) -> None:
    """Refuse what :func:`run_party` cannot run yet (see the module docstring)."""
    problems = []
    if cfg.train.algorithm == "vsnn":
        problems.append("VSNN (the active party holds no features)")
    if problems:
        raise ConfigError(
            f"parties in separate processes cannot run {' or '.join(problems)} yet; use `vflbench run` "
            "for everything in one process"
        )


def needs_dealer(cfg: ExperimentConfig) -> str | None:
    """The name of the configured defense that needs the dealer as an extra party (VMask and its variants), if any."""
    return next((s.name for s in cfg.defenses if DEALER in defense_class(s.name).extra_parties), None)


def party_names(cfg: ExperimentConfig) -> list[str]:
    """The parties of ``cfg``'s run: the active party, its passive parties and the dealer when one is needed."""
    names = [ACTIVE, *(passive_name(i + 1) for i in range(cfg.data.parties - 1))]
    return names + [DEALER] * (needs_dealer(cfg) is not None)


def merged_comm(parts: list[tuple[CommStats, Callable[[str], bool]]]) -> dict[str, Any]:
    """One ``comm`` from several counters, each contributing the kinds its filter keeps (so that no message is
    counted twice); the totals are the sums over the kinds, as :class:`CommStats` counts them."""
    merged = CommStats()
    for stats, keep in parts:
        merged.add(stats, keep)
    return merged.as_dict()


def _save_models(models: Mapping[str, nn.Module], party: str, out_dir: Path) -> None:
    for role, model in models.items():
        save_torch_atomic(out_dir / "checkpoints" / f"{party}.{role}.final.pt", cpu_state_dict(model))


def run_party(
    cfg: ExperimentConfig,
    *,
    party: str,
    channel: NetChannel,
    out_dir: Path | None = None,
    data_root: str | Path | None = None,
    resume: bool = False,
    stop_after: int | None = None,
    refuse_grants: bool = False,
) -> dict[str, Any]:
    """Run ``party``'s side of ``cfg`` over ``channel`` (started here, and closed -- or aborted on an error -- before
    returning); returns (and writes to ``out_dir/<party>.json``) its summary with the channel's final counts, and
    saves its models' state dicts under ``out_dir/checkpoints``. The active party also writes the run directory's
    ``result.json``, ``metrics.jsonl``, ``config.yaml``, ``env.json`` and ``net.json`` in ``out_dir``.

    Configs without attacks, with no defense or VMask, are checkpointed after every epoch
    (:mod:`vflbench.experiment.resume`; VMask's dealer writes its own); ``resume``: continue from the last epoch
    every party committed (the active party's manifest says which; a passive party loads its own checkpoint of
    that epoch when the active party asks). ``stop_after``: the active party stops the run after that many
    epochs, once they are committed (``summary["stopped_after"]``; no ``result.json``), as if the run had
    been cut off there.

    Grants: the channel lets through the evaluation-only queries the run's plan grants
    (:meth:`~vflbench.experiment.plan.AttackPlan.grants`) and refuses every other. ``refuse_grants`` (a passive
    party's own choice): refuse those that query this party's model; the active party learns it from
    ``passive.ready`` and its scorer reports the scores it could not compute. Both parties record the grants and
    what became of them (``grants`` in ``result.json`` and in ``<party>.json``, with the queries served)."""
    cfg = cfg.resolved()
    check_party_run(cfg, party, out_dir=out_dir, resume=resume, stop_after=stop_after, refuse_grants=refuse_grants)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.train.threads)
    device = resolve_device(cfg.train.device)
    if channel.options.device is None:  # what this party receives lands where it computes
        channel.options = dataclasses.replace(channel.options, device=str(device))
    try:
        local = local_state(cfg, party, data_root) if party != DEALER else None
        refused = _grant(channel, party, local.grants if local is not None else [], refuse_grants)
        summary: dict[str, Any] = {"party": party, "run": channel.run}
        with channel:
            if party == DEALER:
                summary["dealer"] = _serve_dealer(cfg, channel, out_dir=out_dir, resume=resume)
                models: dict[str, nn.Module] = {}
            elif party == ACTIVE:
                assert local is not None
                models = _run_active(
                    cfg, local, channel, summary, out_dir, data_root, resume=resume, stop_after=stop_after
                )
            else:
                assert local is not None
                models = _run_passive(
                    cfg, local, channel, party, summary, out_dir=out_dir, resume=resume, refused=refused
                )
        _record_party(summary, channel, models, party, out_dir)
        return summary
    finally:
        torch.set_num_threads(previous_threads)


def _grant(channel: NetChannel, party: str, grants: list[Grant], refuse_grants: bool) -> list[Grant]:
    """Let the run's ``grants`` through ``channel``, less those that query ``party``'s model when it refuses them
    (``refuse_grants``, each logged); the refused ones."""
    refused = [g for g in grants if refuse_grants and g.server == party]
    for g in refused:
        log.warning("%s refuses %s, which the run's plan grants (--refuse-grants)", party, g.describe())
    channel.grant([g for g in grants if g not in refused])
    return refused


def _record_party(
    summary: dict[str, Any], channel: NetChannel, models: dict[str, nn.Module], party: str, out_dir: Path | None
) -> None:
    """Add the channel's final counts to ``summary`` and, with an ``out_dir``, save the party's models and write
    ``summary`` to ``out_dir/<party>.json``."""
    summary["net"] = {"stats": {k: v.as_dict() for k, v in channel.stats.items()}, "wire": wire_of(channel)}
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        _save_models(models, party, out_dir)
        write_json(out_dir / f"{party}.json", summary)


def check_party_run(
    cfg: ExperimentConfig,
    party: str,
    *,
    out_dir: Path | None,
    resume: bool,
    stop_after: int | None,
    refuse_grants: bool,
) -> None:
    """Refuse, before anything starts, what :func:`run_party` cannot do with these options (one-line errors)."""
    check_party_config(cfg)
    if party not in party_names(cfg):
        raise ConfigError(f"party {party!r} is not in this config's run ({', '.join(party_names(cfg))})")
    if refuse_grants and role_of(party) != "passive":
        raise ConfigError(
            "--refuse-grants is a passive party's choice (it refuses evaluation-only queries of its "
            "own bottom model); the active party's VMask shares for vmask_weight_recovery's "
            "evaluation-only errors cannot be refused yet: leave that attack out of the config instead"
        )
    if resume:
        check_resumable(cfg)
        if out_dir is None:
            raise ConfigError("--resume needs --out: the directory that holds this party's checkpoints")
        if party == ACTIVE:
            committed_epoch(out_dir)  # before anything starts: nothing to resume is an error of its own
    if stop_after is not None and stop_after < 1:
        raise ConfigError(f"--stop-after takes a number of epochs of at least 1, got {stop_after}")


def _serve_dealer(
    cfg: ExperimentConfig, channel: NetChannel, *, out_dir: Path | None = None, resume: bool = False
) -> dict[str, int]:
    """The dealer's process: VMask's dealer, seeded as in one process, answering until every peer said goodbye.
    With ``out_dir`` (and a resumable config) it writes its own checkpoint when the active party asks at an epoch
    boundary (``dealer.checkpoint``); with ``resume`` it continues from the one the active party names
    (``dealer.resume``). Returns its counters: the next triple's id, and where a resumed dealer started."""
    name = needs_dealer(cfg)
    assert name is not None
    spec = next(s for s in cfg.defenses if s.name == name)
    defense = create_defense(name, **spec.params()).for_role(DEALER)
    defense.start_party(
        DEALER,
        channel.endpoint(DEALER),
        generator(cfg.seed, "defense", name, ACTIVE),
        device=resolve_device(cfg.train.device),
    )
    service = defense.dealer_service_  # type: ignore[attr-defined]
    if out_dir is not None and resumable(cfg):
        service.save = lambda epoch, state: save_checkpoint(out_dir, DEALER, epoch, {"dealer": state})
        if resume:
            service.load = lambda epoch: load_checkpoint(out_dir, DEALER, epoch)["dealer"]
    channel.serve_forever()
    return {"next_triple": service.dealer.next_triple, "resumed_at_triple": service.dealer.retired_below}


def _run_passive(
    cfg: ExperimentConfig,
    local: LocalState,
    channel: NetChannel,
    party: str,
    summary: dict[str, Any],
    *,
    out_dir: Path | None,
    resume: bool,
    refused: list[Grant],
) -> dict[str, nn.Module]:
    """A passive party's process: take the bottom model's width from the active party (``passive.setup``), build
    its own side from its own slice (its defense halves on the network), answer the active party's requests until
    it says ``passive.done`` (the evaluation-only query of its bottom model only as granted and not ``refused``,
    which ``passive.ready`` tells the active party), then report this process's counters and its attacks'
    results. ``summary["grants"]``: the grants that involve this party, what became of them, the queries served."""
    assert isinstance(local.data, PassiveData)
    endpoint = channel.endpoint(party)
    embed_dim = _take_embed_dim(channel, endpoint)
    attacks = local.attacks
    passive = build_passive(
        cfg,
        local.data,
        defenses=local.defenses.passive[party],
        embed_dim=embed_dim,
        link=channel.endpoint,
        keep=attacks.keep.get(party),
    )
    side = OwnSide(passive)
    attacks.prepare(side)  # type: ignore[arg-type]
    assert passive.data is not None
    oracle = next(
        (g for g in local.grants if g.kind == "passive.oracle_bottom" and g.server == party and g not in refused), None
    )
    channel.register(passive.transcript)  # the party records what it sends and receives, as in one process
    served = ServedPassive(
        passive,
        channel,
        out_dir=out_dir if resumable(cfg) else None,
        resume=resume,
        rows={"train": len(passive.data.x_train), "test": len(passive.data.x_test)},
        epochs=cfg.train.epochs,
        oracle=oracle,
    )
    served.serve()
    endpoint.post("passive.ready", ACTIVE, meta={"refuses": ",".join(sorted({g.kind for g in refused}))})
    if endpoint.take("passive.done", ACTIVE).meta.get("stopped"):
        summary["grants"] = _grant_records(local.grants, party, refused, served.served)
        return passive.models()  # the active party stopped the run after a committed epoch: nothing to report
    _report_passive(cfg, local, side, channel, endpoint)
    summary["grants"] = _grant_records(local.grants, party, refused, served.served)
    return passive.models()


def _take_embed_dim(channel: NetChannel, endpoint: Endpoint) -> int:
    """The bottom model's width that the active party's ``passive.setup`` gives; a clear error if it is not an int
    in [1, 2**20] or the message carries anything else."""
    setup = endpoint.take("passive.setup", ACTIVE)
    embed_dim = setup.meta.get("embed_dim")
    with refusing(channel, ACTIVE):
        nothing_else(setup, "passive.setup")
        if not isinstance(embed_dim, int) or isinstance(embed_dim, bool) or not 1 <= embed_dim <= 1 << 20:
            raise ProtocolError(
                f"passive.setup must carry the bottom model's width as an int embed_dim, got {embed_dim!r}"
            )
    return embed_dim


def _grant_records(grants: list[Grant], party: str, refused: list[Grant], served: int) -> list[dict[str, Any]]:
    """The grants that involve ``party``, each with what became of it (granted, or refused by it) and, where it
    serves them, the queries ``served``."""
    return [
        {
            **g.as_dict(f"refused by {party}" if g in refused else "granted"),
            **({"served": served} if g.server == party else {}),
        }
        for g in grants
        if party in (g.server, g.client)
    ]


def _report_passive(
    cfg: ExperimentConfig, local: LocalState, side: OwnSide, channel: NetChannel, endpoint: Endpoint
) -> None:
    """Run the passive party's own attacks on the trained run and send the active party ``passive.report``: this
    process's channel counters and wire, the attacks' results (by their positions in the run's plan) and times, and
    what its defenses report for result.json (:meth:`~vflbench.protocol.hooks.Defense.details`, e.g. a detector's
    decisions at this party)."""
    attacks = local.attacks
    results: list[Any] = []
    seconds: dict[str, float] = {}
    if attacks.attacks:
        assert local.ground_truth is not None
        trained = TrainedRun(cfg, local.ground_truth, side, History(), 0.0, attacks.held_out())  # type: ignore[arg-type]
        results, seconds = run_attacks(attacks, trained)
        seconds.update(search_attacks(attacks, trained, results))
    endpoint.post(
        "passive.report",
        ACTIVE,
        to_bytes_tensor(
            {
                "stats": {k: v.as_dict() for k, v in channel.stats.items()},
                "wire": wire_of(channel),
                "attacks": {str(i): dataclasses.asdict(r) for i, r in zip(local.positions, results, strict=True)},
                "attack_seconds": seconds,
                "defenses": {d.name: details for d in side.passives[0].defenses if (details := d.details())},
            }
        ),
    )


def _positions(plan: AttackPlan, party: str) -> list[int]:
    """Where ``party``'s attacks stand in the config's list of attacks."""
    return [i for i, p in enumerate(plan.attacks) if p.attack.party == party]


def _run_active(
    cfg: ExperimentConfig,
    local: LocalState,
    channel: NetChannel,
    summary: dict[str, Any],
    out_dir: Path | None,
    data_root: str | Path | None,
    *,
    resume: bool = False,
    stop_after: int | None = None,
) -> dict[str, nn.Module]:
    """The active party's process: build its side, wait for every passive party, train (checkpointing each epoch
    with every party, or continuing from the last committed one), collect the passive parties' reports and write
    the run directory (:class:`_ActiveRun`)."""
    return _ActiveRun(cfg, local, channel, summary, out_dir, data_root, resume=resume, stop_after=stop_after)()


class _ActiveRun:
    """The active party's process, step by step: :meth:`connect` (its side, the passive parties' ``passive.setup``
    and ``passive.ready``), :meth:`train` (the :class:`~vflbench.experiment.pipeline.Pipeline`'s loop with the
    epoch commits, or its continuation), :meth:`collect` (its attacks, the passive parties' reports) and
    :meth:`finish` (``result.json`` and ``net.json``)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        local: LocalState,
        channel: NetChannel,
        summary: dict[str, Any],
        out_dir: Path | None,
        data_root: str | Path | None,
        *,
        resume: bool,
        stop_after: int | None,
    ) -> None:
        check_components(cfg)
        self.cfg, self.local, self.channel, self.summary = cfg, local, channel, summary
        self.out_dir, self.data_root, self.resume, self.stop_after = out_dir, data_root, resume, stop_after
        self.names = party_names(cfg)[1 : cfg.data.parties]
        self.endpoint = channel.endpoint(ACTIVE)
        vd = local.data
        directory = RunDirectory(out_dir, cfg, lambda: environment(cfg.train.threads, vd.device))
        # the experimenter's ground truth scores this party's attacks; the party's own objects hold only its part
        self.pipeline = Pipeline(
            cfg,
            local.ground_truth if local.ground_truth is not None else vd,
            local.attacks,
            directory,
            attacks=own_attacks(local.attacks, ACTIVE),
        )
        self.refused: dict[Grant, str] = {}
        self.walls: list[float] = []
        self.wire: list[dict[str, Any]] = []
        self.batches = generator(cfg.seed, "active", "batches")

    def __call__(self) -> dict[str, nn.Module]:
        """Run the active party's side; its models."""
        fed, remotes = self.connect()
        run = self.train(fed, remotes)
        if run is not None:
            self.finish(run, remotes, *self.collect(run, remotes))
        return fed.active.models()

    def connect(self) -> tuple[Federation, list[RemotePassive]]:
        """Build the active party's side, send every passive party the bottoms' width, wait for each to be ready
        (answering its defense halves' set-up requests meanwhile) and connect the loop to them."""
        plan, local, channel = self.local.attacks, self.local, self.channel
        built = active_side(
            self.cfg,
            local.data,
            defenses=local.defenses.active,
            link=channel.endpoint,
            keep=plan.keep.get(ACTIVE, ()),
            extra_dims=plan.extra_dims(),
            held_out=plan.held_out(),
        )
        for name in self.names:  # the bottom models' width, which the active party's label transforms may set (VLR)
            self.endpoint.post("passive.setup", name, meta={"embed_dim": built.embed_dim})
        for name in self.names:
            ready = self.endpoint.take("passive.ready", name)
            with refusing(channel, name):
                self.refused.update(refusals(ready, local.grants))
        if self.refused:  # not asked for at all: the scorer reports what it could not compute
            channel.grant([g for g in local.grants if g not in self.refused])
        log.info("active: %s ready; training", ", ".join(self.names))
        extra = plan.extra_dims()
        granted = {g.server for g in local.grants if g.kind == "passive.oracle_bottom" and g not in self.refused}
        remotes = [
            RemotePassive(
                name,
                endpoint=self.endpoint,
                channel=channel,
                width=built.embed_dim + extra.get(name, 0),
                granted=name in granted,
            )
            for name in self.names
        ]
        fed = connect(built.party, [], channel, train_rows=built.train_rows, remote=remotes)
        assert self.pipeline.attacks is not None
        self.pipeline.attacks.prepare(fed)
        self.pipeline.directory.open()
        return fed, remotes

    def train(self, fed: Federation, remotes: list[RemotePassive]) -> TrainedRun | None:
        """The loop, each epoch committed with every party (resumable configs with ``--out``), continuing from the
        last committed epoch with ``resume``; ``None`` when it stopped after ``stop_after`` epochs."""
        cfg, out_dir, channel, directory = self.cfg, self.out_dir, self.channel, self.pipeline.directory
        start, history = 0, History()
        if self.resume:
            assert out_dir is not None
            start = committed_epoch(out_dir) + 1
            restored = _resume_active(out_dir, start - 1, fed, channel, self.batches, remotes)
            directory.lines, self.walls, self.wire = restored["metrics"], restored["walls"], restored["active_wire"]
            records = [json.loads(line) for line in directory.lines]
            history = History(
                epochs=records,
                epoch_seconds=[r["seconds"] for r in records],
                refused_updates=sum(r.get("refused_updates", 0) for r in records),
            )
            log.info("active: resuming after epoch %d, which every party committed", start - 1)
        # a resumed process's link counters start at zero: what crossed before adds the last snapshot's counts
        wire_base = self.wire[-1] if self.wire else {}
        last = [time.perf_counter()]

        def on_epoch_end(epoch: int, record: dict[str, Any]) -> None:
            now = time.perf_counter()
            self.walls.append(now - last[0])
            last[0] = now
            self.wire.append(_plus(wire_base, wire_of(channel)))
            if out_dir is not None and resumable(cfg):
                _commit_epoch(
                    out_dir, epoch, fed, channel, self.batches, remotes, directory.lines, self.walls, self.wire
                )
            if self.stop_after is not None and epoch + 1 == self.stop_after and epoch + 1 < cfg.train.epochs:
                raise _Stopped(epoch + 1)

        try:
            return self.pipeline.train(
                fed, on_epoch_end=on_epoch_end, start_epoch=start, history=history, batches=self.batches
            )
        except _Stopped as stopped:
            for remote in remotes:
                self.endpoint.post("passive.done", remote.name, meta={"stopped": True})
            self.summary["stopped_after"] = stopped.epochs
            log.info("active: stopped after epoch %d as asked; continue with --resume", stopped.epochs - 1)
            return None

    def collect(
        self, run: TrainedRun, remotes: list[RemotePassive]
    ) -> tuple[list[AttackResult], dict[str, float], dict[str, Any]]:
        """Every attack's result in the config's order: this party's (scored before ``passive.done``: they may query
        the passive parties), then each passive party's from its final report (also returned, by party)."""
        found, seconds = self.pipeline.score(run)
        plan, reports = self.local.attacks, {}
        for remote in remotes:
            self.endpoint.post("passive.done", remote.name)
            payload = self.endpoint.take("passive.report", remote.name).payload
            with refusing(self.channel, remote.name):
                reports[remote.name] = final_report(payload, remote.name, _positions(plan, remote.name))
        results: dict[int, AttackResult] = dict(zip(self.local.positions, found, strict=True))
        for report in reports.values():
            results.update({int(i): AttackResult(**r) for i, r in report["attacks"].items()})
            seconds.update(report["attack_seconds"])
        return [results[i] for i in range(len(plan.attacks))], seconds, reports

    def finish(
        self,
        run: TrainedRun,
        remotes: list[RemotePassive],
        attacks: list[AttackResult],
        seconds: dict[str, float],
        reports: dict[str, Any],
    ) -> None:
        """``result.json`` (the traffic counted here and each passive party's ``dealer.*`` from its report) and
        ``net.json``; the summary's utility, epochs, traffic and grants."""
        cfg, out_dir, channel = self.cfg, self.out_dir, self.channel
        root = out_dir.parent if out_dir else None
        undefended = (
            undefended_result(cfg, out_dir=root, data_root=self.data_root) if cfg.defenses and cfg.attacks else None
        )
        honest = honest_result(cfg, out_dir=root, data_root=self.data_root) if needs_honest_reference(cfg) else None
        comm = merged_comm(
            [
                (channel.train, protocol_kind),
                *(
                    (comm_from_dict(r["stats"]["train"]), lambda kind: kind.startswith("dealer."))
                    for r in reports.values()
                ),
            ]
        )
        grants = [g.as_dict(self.refused.get(g, "granted")) for g in self.local.grants]
        held_out = self.local.attacks.held_out()

        def baseline(alone: bool) -> UtilityResult:  # the active party alone, on its own data
            return utility_of(
                cfg, train_run(cfg, run.data, with_defenses=False, alone=alone, held_out=held_out).history
            )

        baselines = self.pipeline.baselines(run, undefended=undefended, train=baseline, second_federation=False)
        result = self.pipeline.result(
            run,
            attacks=attacks,
            attack_seconds=seconds,
            comm=comm,
            baselines=baselines,
            undefended=undefended,
            grants=grants,
            reported={n: r["defenses"] for n, r in reports.items()},
            honest=honest,
        )
        self.summary.update(utility=result.utility.__dict__, epochs=run.history.epochs, comm=comm, grants=grants)
        self.pipeline.directory.write(
            "net.json",
            net_report(
                self.walls,
                comm,
                self.wire,
                {r.name: r.wire for r in remotes},
                {ACTIVE: wire_of(channel), **{n: r["wire"] for n, r in reports.items()}},
                shaped=channel.options.shape,
            ),
        )
        self.pipeline.directory.write("result.json", result.to_dict())


class _Stopped(Exception):
    """The active party stops the run after ``epochs`` committed epochs (``stop_after``)."""

    def __init__(self, epochs: int) -> None:
        super().__init__(f"stopped after {epochs} epochs")
        self.epochs = epochs


def _plus(base: Mapping[str, Mapping[str, int]], now: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Per-peer link counters ``now`` plus ``base`` (those of the run before it was resumed)."""
    out = {peer: dict(counts) for peer, counts in base.items()}
    for peer, counts in now.items():
        out[peer] = {k: int(v) + int(base.get(peer, {}).get(k, 0)) for k, v in counts.items()}
    return out


def _commit_epoch(
    out_dir: Path,
    epoch: int,
    fed: Any,
    channel: NetChannel,
    batches: torch.Generator,
    remotes: list[RemotePassive],
    metrics_lines: list[str],
    epoch_walls: list[float],
    active_wire: list[dict[str, Any]],
) -> None:
    """The checkpoint of ``epoch``: each passive party writes its own and reports it, then the active party writes
    its own and, once every party committed ``epoch``, the manifest."""
    committed: dict[str, int] = {}
    for r in remotes:
        answer = r.endpoint.call("passive.checkpoint", r.name, epoch=epoch).meta.get("committed")
        if not isinstance(answer, int):
            raise ProtocolError(f"{r.name} answered passive.checkpoint without an int 'committed', got {answer!r}")
        committed[r.name] = answer
    if DEALER in channel.parties:  # the dealer writes its generator and triple counters
        answer = (
            channel.endpoint(ACTIVE).call("dealer.checkpoint", DEALER, epoch=epoch, phase="setup").meta.get("committed")
        )
        if not isinstance(answer, int):
            raise ProtocolError(f"the dealer answered dealer.checkpoint without an int 'committed', got {answer!r}")
        committed[DEALER] = answer
    extra = {
        "batches": batches.get_state(),
        "metrics": list(metrics_lines),
        "walls": list(epoch_walls),
        "active_wire": json.dumps(active_wire),
        "passive_wire": json.dumps({r.name: r.wire for r in remotes}),
        "net_stats": stats_json(channel),
    }
    save_checkpoint(out_dir, ACTIVE, epoch, {**party_state(fed.active), **extra})
    committed[ACTIVE] = epoch
    if all(e == epoch for e in committed.values()):
        write_manifest(out_dir, epoch, committed)
    else:
        log.warning(
            "epoch %d is not committed by every party (%s): a resume would start from an earlier one",
            epoch,
            ", ".join(f"{n} {e}" for n, e in committed.items()),
        )


def _resume_active(
    out_dir: Path, epoch: int, fed: Any, channel: NetChannel, batches: torch.Generator, remotes: list[RemotePassive]
) -> dict[str, Any]:
    """Load the active party's checkpoint of ``epoch``, have every passive party load its own, and return what the
    loop's bookkeeping continues from."""
    state = load_checkpoint(out_dir, ACTIVE, epoch)
    if DEALER in channel.parties:  # before the first triple of the resumed epochs is asked for
        channel.endpoint(ACTIVE).call("dealer.resume", DEALER, epoch=epoch, phase="setup")
    for remote in remotes:
        remote.endpoint.call("passive.resume", remote.name, epoch=epoch)
    load_party_state(fed.active, state)
    batches.set_state(state["batches"])
    restore_stats(channel, state["net_stats"])
    for remote in remotes:
        remote.wire = list(json.loads(state["passive_wire"]).get(remote.name, []))
    return {
        "metrics": list(state["metrics"]),
        "walls": [float(w) for w in state["walls"]],
        "active_wire": json.loads(state["active_wire"]),
    }


def net_report(
    epoch_seconds: list[float],
    comm: dict[str, Any],
    active_wire: list[dict[str, Any]],
    passive_wire: dict[str, list[dict[str, Any]]],
    final: dict[str, dict[str, Any]],
    shaped: Any = None,
) -> dict[str, Any]:
    """``net.json``: the measured wall time per epoch (training, the end-of-epoch reports and the evaluation), what
    the channels counted, and what crossed each link per epoch (frames and bytes, counted at one end of each link:
    the active party's links at the active party, a passive party's link to the dealer at that party), with the
    time projected on each :data:`~vflbench.net.linkmodel.LINK_PROFILES` network; ``shaped``: the link the
    transport's shaper enforced (``None``: none, loopback speed)."""

    def links(active: Mapping[str, Any], passives: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, int]]:
        out = {
            f"active-{peer}": {
                "frames": w["frames_sent"] + w["frames_received"],
                "bytes": w["bytes_sent"] + w["bytes_received"],
            }
            for peer, w in active.items()
        }
        for name, wire in passives.items():
            if DEALER in wire:
                w = wire[DEALER]
                out[f"{name}-{DEALER}"] = {
                    "frames": w["frames_sent"] + w["frames_received"],
                    "bytes": w["bytes_sent"] + w["bytes_received"],
                }
        return out

    per_epoch: list[dict[str, dict[str, int]]] = []
    previous: dict[str, dict[str, int]] = {}
    for epoch, snapshot in enumerate(active_wire):
        now = links(snapshot, {n: w[epoch] for n, w in passive_wire.items() if epoch < len(w)})
        per_epoch.append({k: {m: v[m] - previous.get(k, {}).get(m, 0) for m in v} for k, v in now.items()})
        previous = now
    frames = [sum(v["frames"] for v in e.values()) for e in per_epoch]
    nbytes = [sum(v["bytes"] for v in e.values()) for e in per_epoch]
    return {
        "epoch_seconds": epoch_seconds,
        "shaped": None if shaped is None else shaped.as_dict(),
        "counted": {"messages": comm["messages"], "bytes": comm["bytes_up"] + comm["bytes_down"]},
        "wire_per_epoch": {"frames": frames, "bytes": nbytes, "links": per_epoch},
        "wire_total": links(final.get(ACTIVE, {}), {n: w for n, w in final.items() if n != ACTIVE}),
        "projected": {
            name: {
                **profile.as_dict(),
                "epoch_seconds": [
                    project(s, f, b, profile) for s, f, b in zip(epoch_seconds, frames, nbytes, strict=False)
                ],
            }
            for name, profile in LINK_PROFILES.items()
        },
    }
