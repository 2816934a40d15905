"""One party of an experiment in its own process (see docs/deployment.md).

The active party's process runs the usual training loop (:class:`~vflbench.protocol.Federation`) over the gRPC
transport: the loop talks to every passive party through the same messages as in one process
(:mod:`vflbench.protocol.service`), through a :class:`RemotePassive` handle that checks what the party answers, and
the passive party's process answers them with its registered handlers (:class:`_Served`). The dealer
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
(:data:`~vflbench.net.policy.SURFACE`) and, of the evaluation-only queries, only those the run's plan grants
(:meth:`~vflbench.experiment.plan.AttackPlan.grants`: the victim's bottom model for a feature attack's scorer);
a passive party may refuse those (``refuse_grants``), logs every one it answers, and both parties record the
grants in their results. Everything a party receives is checked before use against what the protocol expects
at that point: the embeddings' shape, dtype and finiteness, the cut gradient against the pending embedding and
its step, every report's size, nesting and fields (:func:`check_tensor`, :func:`from_bytes_tensor`); a
violation ends the run with a :class:`~vflbench.net.errors.ProtocolError` naming the sender.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vflbench.defenses import DEFENSES, create_defense
from vflbench.devices import resolve_device
from vflbench.errors import ConfigError
from vflbench.experiment.assemble import utility_of
from vflbench.experiment.config import ExperimentConfig, check_components
from vflbench.experiment.pipeline import Pipeline, RunDirectory
from vflbench.experiment.plan import AttackPlan, validate_attacks
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
from vflbench.experiment.run import check_before_training, cpu_state_dict, environment, train_run, undefended_result
from vflbench.experiment.scenario import (
    DefensePlan,
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
from vflbench.models.finetune import EVAL_BATCH
from vflbench.net.errors import ProtocolError
from vflbench.net.frames import MAX_JSON_BYTES, json_from_tensor, json_tensor
from vflbench.net.linkmodel import LINK_PROFILES, project
from vflbench.net.policy import SURFACE, Policy, role_of
from vflbench.net.transport import NetChannel
from vflbench.protocol import Federation, History
from vflbench.protocol.channel import CommStats, Endpoint, KindStats
from vflbench.protocol.grants import Grant
from vflbench.protocol.messages import ACTIVE, DEALER, Message, passive_name
from vflbench.protocol.party import PassiveParty
from vflbench.protocol.service import PassivePeer, PassiveService, protocol_kind
from vflbench.rng import generator

log = logging.getLogger(__name__)


def own_attacks(plan: AttackPlan, party: str) -> AttackPlan:
    """The attacks of ``plan`` that run at ``party`` (in its process)."""
    return dataclasses.replace(plan, attacks=[p for p in plan.attacks if p.attack.party == party])


def party_policy(grants: Iterable[Grant] = ()) -> Policy:
    """The protocol's surface (:data:`~vflbench.net.policy.SURFACE`, the remote passive party's requests included)
    with the run's ``grants``."""
    return Policy(SURFACE, grants)


def to_bytes_tensor(value: Any) -> Tensor:
    """``value`` as JSON in a uint8 tensor (a report of any size; a frame's ``meta`` strings are capped)."""
    return json_tensor(value)


def from_bytes_tensor(tensor: Tensor, *, sender: str = "the peer", what: str = "report") -> Any:
    """The JSON value :func:`to_bytes_tensor` wrote, bounded in size and nesting before it is parsed
    (:func:`~vflbench.net.frames.json_from_tensor`); a :class:`ProtocolError` naming ``sender`` and ``what``
    otherwise. Parsed as JSON: nothing received is unpickled."""
    try:
        return json_from_tensor(tensor, max_bytes=MAX_JSON_BYTES)
    except ProtocolError as exc:
        raise ProtocolError(f"{sender}'s {what}: {exc}") from None


def check_tensor(t: Tensor, *, sender: str, what: str, shape: tuple[int, ...] | None = None,
                 dtypes: Iterable[torch.dtype] = (), finite: bool = True) -> Tensor:
    """``t`` if it has the ``shape`` (``None``: any) and one of the ``dtypes`` (none given: any) the protocol expects
    of ``what`` from ``sender`` at this point, and only finite values (``finite``, floating dtypes); otherwise a
    :class:`ProtocolError` naming the sender, what it sent and what was expected."""
    dtypes = tuple(dtypes)
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ProtocolError(f"{sender} sent {what} of shape {tuple(t.shape)}; expected {tuple(shape)}")
    if dtypes and t.dtype not in dtypes:
        raise ProtocolError(f"{sender} sent {what} of dtype {t.dtype}; expected {' or '.join(map(str, dtypes))}")
    if finite and t.dtype.is_floating_point and t.numel() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise ProtocolError(f"{sender} sent {what} with {bad} non-finite values (NaN or infinity) of {t.numel()}: "
                            "its model diverged there, or it is not following the protocol")
    return t


@contextlib.contextmanager
def refusing(channel: NetChannel, sender: str) -> Iterator[None]:
    """Checks of what ``sender`` sent: a :class:`ProtocolError` they raise is logged as this party's refusal and
    re-raised naming both parties (:meth:`~vflbench.net.transport.NetChannel.refuse`)."""
    try:
        yield
    except ProtocolError as exc:
        raise channel.refuse(sender, str(exc)) from None


def _nothing_else(message: Message, what: str) -> None:
    """Refuse tensors a message of this kind does not carry (a request whose content is all in its header)."""
    if message.payload.numel() or message.extra:
        raise ProtocolError(f"{message.sender} sent {what} carrying tensors {[tuple(t.shape) for t in message.tensors]}"
                            "; it carries none")


def _counts(value: Any, what: str, sender: str) -> dict[str, dict[str, int]]:
    """Per-peer link counters (:func:`wire_of`) as a report carries them, checked."""
    keys = {"frames_sent", "bytes_sent", "frames_received", "bytes_received"}
    ok = isinstance(value, dict) and all(
        isinstance(peer, str) and isinstance(c, dict) and set(c) == keys
        and all(type(v) is int and v >= 0 for v in c.values()) for peer, c in value.items())
    if not ok:
        raise ProtocolError(f"{sender}'s {what} must map each peer to its counters {sorted(keys)} (non-negative "
                            f"integers), got {str(value)[:200]}")
    return value


def _stats(value: Any, sender: str) -> dict[str, Any]:
    """A report's channel counters per phase (:meth:`CommStats.as_dict`), checked as far as the active party reads
    them (the kinds, directions, messages, bytes and rounds)."""
    if not isinstance(value, dict) or not isinstance(value.get("train"), dict):
        raise ProtocolError(f"{sender}'s report must carry its channel counters per phase, 'train' included")
    by_kind = value["train"].get("by_kind")
    ok = isinstance(by_kind, dict) and all(
        isinstance(kind, str) and isinstance(d, dict) and set(d) <= {"up", "down"}
        and all(isinstance(c, dict) and set(c) == {"messages", "bytes", "rounds"}
                and all(type(v) is int and v >= 0 for v in c.values()) for c in d.values())
        for kind, d in by_kind.items())
    if not ok:
        raise ProtocolError(f"{sender}'s report: its 'train' counters must map each kind to up/down counts of "
                            "messages, bytes and rounds (non-negative integers)")
    return value


def _attack_results(value: Any, positions: list[int], sender: str) -> dict[str, Any]:
    """A passive party's attack results, checked: exactly its own attacks' positions, each a result the active party
    can read."""
    if not isinstance(value, dict) or sorted(value) != sorted(str(i) for i in positions):
        raise ProtocolError(f"{sender}'s report must carry the results of its attacks at positions {positions} of the "
                            f"config, got {sorted(value) if isinstance(value, dict) else type(value).__name__}")
    fields = {f.name for f in dataclasses.fields(AttackResult)}
    for key, r in value.items():
        if not isinstance(r, dict) or not set(r) <= fields or not {"name", "target", "metric", "value"} <= set(r):
            raise ProtocolError(f"{sender}'s result of attack {key} is not an attack result (fields: "
                                f"{', '.join(sorted(fields))})")
        if not all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
                   for k in ("value", "prior", "leakage")):
            raise ProtocolError(f"{sender}'s result of attack {key} needs numbers for value, prior and leakage")
    return value


class OracleBottom(nn.Module):
    """The scorer's access to a remote passive party's real bottom model (``passive.oracle_bottom``): a feature
    attack's diagnostics compare the attacker's shadow with the victim's model on the true features. This is the
    experimenter's ground truth, not a protocol step: it exists only when the run's plan grants it (and the passive
    party did not refuse), and the passive party logs every query it answers."""

    def __init__(self, name: str, endpoint: Endpoint, *, channel: NetChannel, width: int) -> None:
        super().__init__()
        self.name = name
        self.endpoint = endpoint
        self.channel = channel
        self.width = width

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        out = self.endpoint.call("passive.oracle_bottom", self.name, x, phase="eval").payload
        with refusing(self.channel, self.name):
            return check_tensor(out, sender=self.name, what="its bottom model's outputs (passive.oracle_bottom)",
                                shape=(len(x), self.width), dtypes=(torch.get_default_dtype(),))


class RemotePassive(PassivePeer):
    """The active process's handle on passive party ``name`` in its own process: the loop's messages
    (:class:`~vflbench.protocol.service.PassivePeer`), with everything the party answers checked against what the
    protocol expects (``width``: its embeddings' width; ``granted``: whether the scorer may query its bottom model,
    :class:`OracleBottom`). :attr:`wire`: the party's link counters at each epoch's end, from its reports."""

    def __init__(self, name: str, *, endpoint: Endpoint, channel: NetChannel, width: int,
                 granted: bool = False) -> None:
        super().__init__(name, endpoint)
        self.channel = channel
        self.width = width
        self.bottom = OracleBottom(name, endpoint, channel=channel, width=width) if granted else None
        self.wire: list[dict[str, Any]] = []

    def embedding(self, reply: Message, message: Message, ids: Tensor) -> Tensor:
        """The embedding the party posted, checked: an empty reply, the request's position and rows, the width."""
        with refusing(self.channel, self.name):
            _nothing_else(reply, "its passive.forward reply")
            if (message.epoch, message.step, message.phase) != (reply.epoch, reply.step, reply.phase) \
                    or not torch.equal(message.ids.cpu(), ids.cpu()):
                raise ProtocolError(f"{self.name} sent an embedding for {message.phase} epoch {message.epoch} step "
                                    f"{message.step} ({len(message.ids)} rows) when {reply.phase} epoch {reply.epoch} "
                                    f"step {reply.step} ({len(ids)} rows) was asked for")
            return check_tensor(message.payload, sender=self.name, what=f"an embedding of {len(ids)} rows",
                                shape=(len(ids), self.width), dtypes=(torch.get_default_dtype(),))

    def applied(self, reply: Message) -> bool:
        """Whether the party applied the update: a bool ``applied`` and no tensors, or a protocol error."""
        applied = reply.meta.get("applied")
        with refusing(self.channel, self.name):
            if not isinstance(applied, bool) or reply.payload.numel() or reply.extra:
                raise ProtocolError(f"{self.name} answered passive.backward with something else than a bool "
                                    f"'applied' and no tensors, got {applied!r}")
        return applied

    def report(self, payload: Tensor, epoch: int) -> dict[str, object]:
        """The party's end-of-epoch report, bounded and checked (its link counters are kept in :attr:`wire`)."""
        with refusing(self.channel, self.name):
            reply = from_bytes_tensor(payload, sender=self.name, what=f"end-of-epoch report of epoch {epoch}")
            if not isinstance(reply, dict) or set(reply) != {"report", "wire"} or not isinstance(reply["report"], dict):
                raise ProtocolError(f"{self.name}'s end-of-epoch report must be an object with a 'report' object and "
                                    f"its 'wire' counters, got {str(reply)[:200]}")
            self.wire.append(_counts(reply["wire"], "end-of-epoch link counters", self.name))
        return dict(reply["report"])


class _Served(PassiveService):
    """A passive party's handlers in its own process: the loop's (:class:`~vflbench.protocol.service.PassiveService`)
    with every request checked against what the protocol expects at that point, plus ``passive.checkpoint``,
    ``passive.resume`` and, when granted, ``passive.oracle_bottom``."""

    def __init__(self, party: PassiveParty, channel: NetChannel, on_epoch_end: Callable[[], None], *,
                 rows: Mapping[str, int], epochs: int, out_dir: Path | None = None, resume: bool = False,
                 oracle: Grant | None = None) -> None:
        super().__init__(party, channel.endpoint(party.name))
        self.channel = channel
        self.on_epoch_end = on_epoch_end
        self.rows = rows
        self.epochs = epochs
        self.out_dir = out_dir
        self.resume = resume
        self.oracle = oracle
        self.served = 0
        self.pending: tuple[int, ...] | None = None
        self.pending_ids: Tensor | None = None
        self.pending_at = (-1, -1)

    def handlers(self) -> Mapping[str, Callable[[Message], Message]]:
        return {**super().handlers(), "passive.checkpoint": self.checkpoint, "passive.resume": self.restore,
                "passive.oracle_bottom": self._oracle}

    def unserved(self, request: Message) -> Exception:
        return ProtocolError(f"{self.party.name} serves passive.forward, passive.backward, passive.end_epoch, "
                             f"passive.checkpoint, passive.resume and (when granted) passive.oracle_bottom, not "
                             f"{request.kind!r}")

    def _epoch_request(self, request: Message) -> None:
        _nothing_else(request, request.kind)
        if not 0 <= request.epoch < self.epochs:
            raise ProtocolError(f"{request.sender} sent {request.kind} for epoch {request.epoch}; this run trains "
                                f"epochs 0..{self.epochs - 1}")

    def embed(self, request: Message) -> Tensor:
        """The embedding of the requested rows, once the request is checked (its split, rows and epoch)."""
        split, train = request.meta.get("split"), request.meta.get("train")
        if not isinstance(split, str) or split not in self.rows or not isinstance(train, bool):
            raise ProtocolError(f"passive.forward needs meta split in {sorted(self.rows)} and a bool train, got "
                                f"{request.meta}")
        _nothing_else(request, "passive.forward (row ids only)")
        ids = request.ids
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.rows[split]):
            raise ProtocolError(f"passive.forward asks for rows outside 0..{self.rows[split] - 1} of {split}")
        if train and not (0 <= request.epoch < self.epochs and request.step >= 0):
            raise ProtocolError(f"{request.sender} asked for a training embedding at epoch {request.epoch} step "
                                f"{request.step}; this run trains epochs 0..{self.epochs - 1}")
        out = super().embed(request)
        if train:
            self.pending, self.pending_ids, self.pending_at = tuple(out.shape), ids, (request.epoch, request.step)
        return out

    def backward(self, request: Message) -> Message:
        """Apply the posted cut gradient once it is checked against the pending embedding and its step."""
        sender = request.sender
        _nothing_else(request, "passive.backward (the cut gradient comes as its own message)")
        if (request.epoch, request.step) != self.pending_at or self.pending is None:
            raise ProtocolError(f"{sender} sent the cut gradient of epoch {request.epoch} step {request.step}, "
                                f"but the pending embedding is of epoch {self.pending_at[0]} step {self.pending_at[1]}")
        message = self.gradient(request)
        g = message.payload
        # a plaintext cut gradient has the embedding's shape; an encrypted one (paillier_he) is its ciphertexts'
        # bytes, which the party's defense checks
        plain = g.dtype.is_floating_point and tuple(g.shape) == self.pending
        if not (plain or g.dtype == torch.uint8) or message.extra:
            raise ProtocolError(f"passive.backward: a cut gradient of shape {tuple(g.shape)} ({g.dtype}) does "
                                f"not fit the pending embedding ({self.pending})")
        assert self.pending_ids is not None
        if (message.epoch, message.step) != self.pending_at or not torch.equal(message.ids.cpu(),
                                                                               self.pending_ids.cpu()):
            raise ProtocolError(f"{sender} sent a cut gradient for epoch {message.epoch} step {message.step} "
                                f"({len(message.ids)} rows) when the pending embedding is of epoch "
                                f"{self.pending_at[0]} step {self.pending_at[1]} ({len(self.pending_ids)} rows)")
        check_tensor(g, sender=sender, what="a cut gradient")
        self.pending = self.pending_ids = None
        return request.reply(meta={"applied": self.party.backward(g)})

    def end_epoch(self, request: Message) -> Message:
        self._epoch_request(request)
        return super().end_epoch(request)

    def report(self, epoch: int) -> dict[str, Any]:
        """The party's end-of-epoch report, its attacks' snapshots taken, with its link counters."""
        report = super().report(epoch)
        self.on_epoch_end()
        return {**report, "wire": wire_of(self.channel)}

    def checkpoint(self, request: Message) -> Message:
        """Write this party's own state after the epoch (-1: it keeps no checkpoints, no ``--out``)."""
        self._epoch_request(request)
        if self.out_dir is None:
            return request.reply(meta={"committed": -1})
        save_checkpoint(self.out_dir, self.party.name, request.epoch,
                        {**party_state(self.party), "net_stats": _stats_json(self.channel)})
        return request.reply(meta={"committed": request.epoch})

    def restore(self, request: Message) -> Message:
        """Load this party's checkpoint of the epoch the active party names (``--resume`` only)."""
        self._epoch_request(request)
        if not self.resume or self.out_dir is None:
            raise ProtocolError(f"{self.party.name} was asked to resume from epoch {request.epoch} but was "
                                "started without --resume and --out")
        state = load_checkpoint(self.out_dir, self.party.name, request.epoch)
        load_party_state(self.party, state)
        _restore_stats(self.channel, state["net_stats"])  # its counts (dealer.* go into comm) continue
        log.info("%s: resumed from its checkpoint of epoch %d", self.party.name, request.epoch)
        return request.reply(meta={"resumed": request.epoch})

    def _oracle(self, request: Message) -> Message:
        """Answer an evaluation-only query of the bottom model, if the run granted it to its sender (the transport's
        policy refuses it otherwise; this is the second lock), checked and logged."""
        grant, sender = self.oracle, request.sender
        if grant is None or grant.client != sender:
            raise ProtocolError(f"{self.party.name} does not answer passive.oracle_bottom for {sender}: the run's "
                                "plan does not grant it, or this party refused it")
        assert self.party.data is not None and self.party.bottom is not None
        own = self.party.data.x_train
        x = request.payload
        if not 1 <= len(x) <= EVAL_BATCH or request.extra:
            raise ProtocolError(f"{sender} sent passive.oracle_bottom with {len(x)} rows; the scorer asks for 1 to "
                                f"{EVAL_BATCH} at a time")
        check_tensor(x, sender=sender, what="passive.oracle_bottom inputs", shape=(len(x), *own.shape[1:]),
                     dtypes=dict.fromkeys((own.dtype, torch.float32)))
        bottom = self.party.bottom
        was = bottom.training
        bottom.eval()
        with torch.no_grad():
            out = bottom(x)
        bottom.train(was)
        self.served += 1
        log.warning("%s: served an evaluation-only query of its bottom model to %s (%d rows; query %d; granted for "
                    "%s)", self.party.name, sender, len(x), self.served, ", ".join(grant.purpose) or "scoring")
        return request.reply(out)


@dataclass
class LocalState:
    """What one party's process keeps after loading the dataset (:func:`local_state`).

    ``data``: a passive party's :class:`~vflbench.experiment.scenario.PassiveData` (its own slice only), or the
    active party's :func:`~vflbench.experiment.scenario.active_data` (its slice, the labels, each passive party's
    layout and the auxiliary rows its defenses' threat model grants). ``defenses``: the config's defense
    instances. ``attacks``: the attacks that run at this party (the active party's plan also lists the others',
    whose extra embedding widths size its top model). ``ground_truth``: the whole dataset, kept only when this
    party runs attacks: the experimenter's truth to score them (and the labels or auxiliary rows their threat
    models grant), never given to the party's own objects. ``positions``: where this party's attacks stand in the
    config's list. ``grants``: the evaluation-only queries the run's plan grants between any two parties (the same
    list in every process: :meth:`~vflbench.experiment.plan.AttackPlan.grants`).
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


def local_state(cfg: ExperimentConfig, party: str, data_root: str | Path | None = None) -> LocalState:
    """Load ``cfg``'s dataset, keep ``party``'s part of it (see :class:`LocalState`) and drop the rest: a dataset
    file holds every party's columns, so the process reads it once and slices it at once. Checks the config's
    attacks against the data first, as ``vflbench run`` does (the active party checks what needs the labels)."""
    cfg = cfg.resolved()
    if party not in party_names(cfg) or party == DEALER:
        raise ConfigError(f"party {party!r} holds no data in this config's run ({', '.join(party_names(cfg))})")
    vd = load_vertical_data(cfg, data_root)
    plan = plan_defenses(cfg, party_names(cfg)[1:cfg.data.parties])
    attack_plan = validate_attacks(cfg, vd)
    positions = _positions(attack_plan, party)
    if party == ACTIVE:
        check_before_training(cfg, vd, attack_plan)
        attacks = attack_plan if positions else dataclasses.replace(attack_plan, data=None)
        return LocalState(active_data(vd, granted=defense_aux_rows(cfg, plan, vd.y_train)), plan, attacks, positions,
                          vd if positions else None, attack_plan.grants())
    attacks = own_attacks(attack_plan, party) if positions else AttackPlan(seed=cfg.seed)
    mine = DefensePlan([], {party: plan.passive[party]})  # its own halves only
    return LocalState(passive_data(vd, party), mine, attacks, positions, vd if positions else None,
                      attack_plan.grants())


def _stats_json(channel: NetChannel) -> str:
    """The channel's message counters, every phase, as JSON (for a checkpoint)."""
    return json.dumps({phase: stats.as_dict() for phase, stats in channel.stats.items()})


def _restore_stats(channel: NetChannel, saved: str) -> None:
    """Put :func:`_stats_json`'s counters back: what a resumed process counts continues the run's counts (the
    resume's own set-up messages are left out, as the uninterrupted run had them once)."""
    for phase, raw in json.loads(saved).items():
        channel.stats[phase] = _comm_restored(raw)


def wire_of(channel: NetChannel) -> dict[str, dict[str, int]]:
    """The channel's frame counters per peer."""
    return {k: v.as_dict() for k, v in channel.wire.items()}


def check_party_config(cfg: ExperimentConfig) -> None:
    """Refuse what :func:`run_party` cannot run yet (see the module docstring)."""
    problems = []
    if cfg.train.algorithm == "vsnn":
        problems.append("VSNN (the active party holds no features)")
    if problems:
        raise ConfigError(f"parties in separate processes cannot run {' or '.join(problems)} yet; use `vflbench run` "
                          "for everything in one process")


def needs_dealer(cfg: ExperimentConfig) -> str | None:
    """The name of the configured defense that needs the dealer as an extra party (VMask and its variants), if any."""
    return next((s.name for s in cfg.defenses if DEALER in getattr(DEFENSES.get(s.name).factory, "extra_parties", ())),
                None)


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


def comm_from_dict(raw: Mapping[str, Any]) -> CommStats:
    """A :class:`CommStats` from its :meth:`~CommStats.as_dict` (a passive party's report)."""
    stats = CommStats()
    for kind, directions in raw["by_kind"].items():
        for direction, s in directions.items():
            stats.by_kind[kind][direction] = KindStats(int(s["messages"]), int(s["bytes"]), int(s["rounds"]))
    return stats


def _save_models(models: Mapping[str, nn.Module], party: str, out_dir: Path) -> None:
    for role, model in models.items():
        save_torch_atomic(out_dir / "checkpoints" / f"{party}.{role}.final.pt", cpu_state_dict(model))


def run_party(cfg: ExperimentConfig, *, party: str, channel: NetChannel, out_dir: Path | None = None,
              data_root: str | Path | None = None, resume: bool = False,
              stop_after: int | None = None, refuse_grants: bool = False) -> dict[str, Any]:
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
        grants = local.grants if local is not None else []
        refused = [g for g in grants if refuse_grants and g.server == party]
        for g in refused:
            log.warning("%s refuses %s, which the run's plan grants (--refuse-grants)", party, g.describe())
        channel.grant([g for g in grants if g not in refused])
        summary: dict[str, Any] = {"party": party, "run": channel.run}
        with channel:
            if party == DEALER:
                summary["dealer"] = _serve_dealer(cfg, channel, out_dir=out_dir, resume=resume)
                models: dict[str, nn.Module] = {}
            elif party == ACTIVE:
                assert local is not None
                models = _run_active(cfg, local, channel, summary, out_dir, data_root, resume=resume,
                                     stop_after=stop_after)
            else:
                assert local is not None
                models = _run_passive(cfg, local, channel, party, summary, out_dir=out_dir, resume=resume,
                                      refused=refused)
        summary["net"] = {"stats": {k: v.as_dict() for k, v in channel.stats.items()}, "wire": wire_of(channel)}
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            _save_models(models, party, out_dir)
            write_json(out_dir / f"{party}.json", summary)
        return summary
    finally:
        torch.set_num_threads(previous_threads)


def check_party_run(cfg: ExperimentConfig, party: str, *, out_dir: Path | None, resume: bool,
                    stop_after: int | None, refuse_grants: bool) -> None:
    """Refuse, before anything starts, what :func:`run_party` cannot do with these options (one-line errors)."""
    check_party_config(cfg)
    if party not in party_names(cfg):
        raise ConfigError(f"party {party!r} is not in this config's run ({', '.join(party_names(cfg))})")
    if refuse_grants and role_of(party) != "passive":
        raise ConfigError("--refuse-grants is a passive party's choice (it refuses evaluation-only queries of its "
                          "own bottom model); the active party's VMask shares for vmask_weight_recovery's "
                          "evaluation-only errors cannot be refused yet: leave that attack out of the config instead")
    if resume:
        check_resumable(cfg)
        if out_dir is None:
            raise ConfigError("--resume needs --out: the directory that holds this party's checkpoints")
        if party == ACTIVE:
            committed_epoch(out_dir)  # before anything starts: nothing to resume is an error of its own
    if stop_after is not None and stop_after < 1:
        raise ConfigError(f"--stop-after takes a number of epochs of at least 1, got {stop_after}")


def _serve_dealer(cfg: ExperimentConfig, channel: NetChannel, *, out_dir: Path | None = None,
                  resume: bool = False) -> dict[str, int]:
    """The dealer's process: VMask's dealer, seeded as in one process, answering until every peer said goodbye.
    With ``out_dir`` (and a resumable config) it writes its own checkpoint when the active party asks at an epoch
    boundary (``dealer.checkpoint``); with ``resume`` it continues from the one the active party names
    (``dealer.resume``). Returns its counters: the next triple's id, and where a resumed dealer started."""
    name = needs_dealer(cfg)
    assert name is not None
    spec = next(s for s in cfg.defenses if s.name == name)
    defense = create_defense(name, **spec.params())
    defense.start_party(DEALER, channel.endpoint(DEALER), generator(cfg.seed, "defense", name, ACTIVE),
                        device=resolve_device(cfg.train.device))
    service = defense.dealer_service_  # type: ignore[attr-defined]
    if out_dir is not None and resumable(cfg):
        service.save = lambda epoch, state: save_checkpoint(out_dir, DEALER, epoch, {"dealer": state})
        if resume:
            service.load = lambda epoch: load_checkpoint(out_dir, DEALER, epoch)["dealer"]
    channel.serve_forever()
    return {"next_triple": service.dealer.next_triple, "resumed_at_triple": service.dealer.retired_below}


def _run_passive(cfg: ExperimentConfig, local: LocalState, channel: NetChannel, party: str, summary: dict[str, Any],
                 *, out_dir: Path | None, resume: bool, refused: list[Grant]) -> dict[str, nn.Module]:
    """A passive party's process: take the bottom model's width from the active party (``passive.setup``), build
    its own side from its own slice (its defense halves on the network), answer the active party's requests until
    it says ``passive.done`` (the evaluation-only query of its bottom model only as granted and not ``refused``,
    which ``passive.ready`` tells the active party), then report this process's counters and its attacks'
    results. ``summary["grants"]``: the grants that involve this party, what became of them, the queries served."""
    assert isinstance(local.data, PassiveData)
    endpoint = channel.endpoint(party)
    setup = endpoint.take("passive.setup", ACTIVE)
    embed_dim = setup.meta.get("embed_dim")
    with refusing(channel, ACTIVE):
        _nothing_else(setup, "passive.setup")
        if not isinstance(embed_dim, int) or isinstance(embed_dim, bool) or not 1 <= embed_dim <= 1 << 20:
            raise ProtocolError(f"passive.setup must carry the bottom model's width as an int embed_dim, got "
                                f"{embed_dim!r}")
    attacks = local.attacks
    passive = build_passive(cfg, local.data, defenses=local.defenses.passive[party], embed_dim=embed_dim,
                            link=channel.endpoint, keep=attacks.keep.get(party))
    side = OwnSide(passive)
    attacks.prepare(side)  # type: ignore[arg-type]
    assert passive.data is not None
    oracle = next((g for g in local.grants if g.kind == "passive.oracle_bottom" and g.server == party
                   and g not in refused), None)
    channel.register(passive.transcript)  # the party records what it sends and receives, as in one process
    served = _Served(passive, channel, lambda: attacks.on_epoch_end(side),  # type: ignore[arg-type]
                     out_dir=out_dir if resumable(cfg) else None, resume=resume,
                     rows={"train": len(passive.data.x_train), "test": len(passive.data.x_test)},
                     epochs=cfg.train.epochs, oracle=oracle)
    served.serve()
    endpoint.post("passive.ready", ACTIVE, meta={"refuses": ",".join(sorted({g.kind for g in refused}))})

    def record_grants() -> None:
        summary["grants"] = [{**g.as_dict(f"refused by {party}" if g in refused else "granted"),
                              **({"served": served.served} if g.server == party else {})}
                             for g in local.grants if party in (g.server, g.client)]

    if endpoint.take("passive.done", ACTIVE).meta.get("stopped"):
        record_grants()
        return passive.models()  # the active party stopped the run after a committed epoch: nothing to report
    results: list[Any] = []
    seconds: dict[str, float] = {}
    if attacks.attacks:
        assert local.ground_truth is not None
        trained = TrainedRun(cfg, local.ground_truth, side, History(), 0.0, attacks.held_out())  # type: ignore[arg-type]
        results, seconds = run_attacks(attacks, trained)
        seconds.update(search_attacks(attacks, trained, results))
    endpoint.post("passive.report", ACTIVE, to_bytes_tensor({
        "stats": {k: v.as_dict() for k, v in channel.stats.items()}, "wire": wire_of(channel),
        "attacks": {str(i): dataclasses.asdict(r) for i, r in zip(local.positions, results, strict=True)},
        "attack_seconds": seconds}))
    record_grants()
    return passive.models()


def _positions(plan: AttackPlan, party: str) -> list[int]:
    """Where ``party``'s attacks stand in the config's list of attacks."""
    return [i for i, p in enumerate(plan.attacks) if p.attack.party == party]


def _run_active(cfg: ExperimentConfig, local: LocalState, channel: NetChannel, summary: dict[str, Any],
                out_dir: Path | None, data_root: str | Path | None, *, resume: bool = False,
                stop_after: int | None = None) -> dict[str, nn.Module]:
    """The active party's process: build its side, wait for every passive party, train (checkpointing each epoch
    with every party, or continuing from the last committed one), collect the passive parties' reports and write
    the run directory (:class:`_ActiveRun`)."""
    return _ActiveRun(cfg, local, channel, summary, out_dir, data_root, resume=resume, stop_after=stop_after)()


class _ActiveRun:
    """The active party's process, step by step: :meth:`connect` (its side, the passive parties' ``passive.setup``
    and ``passive.ready``), :meth:`train` (the :class:`~vflbench.experiment.pipeline.Pipeline`'s loop with the
    epoch commits, or its continuation), :meth:`collect` (its attacks, the passive parties' reports) and
    :meth:`finish` (``result.json`` and ``net.json``)."""

    def __init__(self, cfg: ExperimentConfig, local: LocalState, channel: NetChannel, summary: dict[str, Any],
                 out_dir: Path | None, data_root: str | Path | None, *, resume: bool, stop_after: int | None) -> None:
        check_components(cfg)
        self.cfg, self.local, self.channel, self.summary = cfg, local, channel, summary
        self.out_dir, self.data_root, self.resume, self.stop_after = out_dir, data_root, resume, stop_after
        self.names = party_names(cfg)[1:cfg.data.parties]
        self.endpoint = channel.endpoint(ACTIVE)
        vd = local.data
        directory = RunDirectory(out_dir, cfg, lambda: environment(cfg.train.threads, vd.device))
        # the experimenter's ground truth scores this party's attacks; the party's own objects hold only its part
        self.pipeline = Pipeline(cfg, local.ground_truth if local.ground_truth is not None else vd, local.attacks,
                                 directory, attacks=own_attacks(local.attacks, ACTIVE))
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
        built = active_side(self.cfg, local.data, defenses=local.defenses.active, link=channel.endpoint,
                            keep=plan.keep.get(ACTIVE, ()), extra_dims=plan.extra_dims(), held_out=plan.held_out())
        for name in self.names:  # the bottom models' width, which the active party's label transforms may set (VLR)
            self.endpoint.post("passive.setup", name, meta={"embed_dim": built.embed_dim})
        for name in self.names:
            ready = self.endpoint.take("passive.ready", name)
            with refusing(channel, name):
                self.refused.update(_refusals(ready, local.grants))
        if self.refused:  # not asked for at all: the scorer reports what it could not compute
            channel.grant([g for g in local.grants if g not in self.refused])
        log.info("active: %s ready; training", ", ".join(self.names))
        extra = plan.extra_dims()
        granted = {g.server for g in local.grants if g.kind == "passive.oracle_bottom" and g not in self.refused}
        remotes = [RemotePassive(name, endpoint=self.endpoint, channel=channel,
                                 width=built.embed_dim + extra.get(name, 0), granted=name in granted)
                   for name in self.names]
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
            history = History(epochs=records, epoch_seconds=[r["seconds"] for r in records],
                              refused_updates=sum(r.get("refused_updates", 0) for r in records))
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
                _commit_epoch(out_dir, epoch, fed, channel, self.batches, remotes, directory.lines, self.walls,
                              self.wire)
            if self.stop_after is not None and epoch + 1 == self.stop_after and epoch + 1 < cfg.train.epochs:
                raise _Stopped(epoch + 1)

        try:
            return self.pipeline.train(fed, on_epoch_end=on_epoch_end, start_epoch=start, history=history,
                                       batches=self.batches)
        except _Stopped as stopped:
            for remote in remotes:
                self.endpoint.post("passive.done", remote.name, meta={"stopped": True})
            self.summary["stopped_after"] = stopped.epochs
            log.info("active: stopped after epoch %d as asked; continue with --resume", stopped.epochs - 1)
            return None

    def collect(self, run: TrainedRun,
                remotes: list[RemotePassive]) -> tuple[list[AttackResult], dict[str, float], dict[str, Any]]:
        """Every attack's result in the config's order: this party's (scored before ``passive.done``: they may query
        the passive parties), then each passive party's from its final report (also returned, by party)."""
        found, seconds = self.pipeline.score(run)
        plan, reports = self.local.attacks, {}
        for remote in remotes:
            self.endpoint.post("passive.done", remote.name)
            payload = self.endpoint.take("passive.report", remote.name).payload
            with refusing(self.channel, remote.name):
                reports[remote.name] = _final_report(payload, remote.name, _positions(plan, remote.name))
        results: dict[int, AttackResult] = dict(zip(self.local.positions, found, strict=True))
        for report in reports.values():
            results.update({int(i): AttackResult(**r) for i, r in report["attacks"].items()})
            seconds.update(report["attack_seconds"])
        return [results[i] for i in range(len(plan.attacks))], seconds, reports

    def finish(self, run: TrainedRun, remotes: list[RemotePassive], attacks: list[AttackResult],
               seconds: dict[str, float], reports: dict[str, Any]) -> None:
        """``result.json`` (the traffic counted here and each passive party's ``dealer.*`` from its report) and
        ``net.json``; the summary's utility, epochs, traffic and grants."""
        cfg, out_dir, channel = self.cfg, self.out_dir, self.channel
        undefended = (undefended_result(cfg, out_dir=out_dir.parent if out_dir else None, data_root=self.data_root)
                      if cfg.defenses and cfg.attacks else None)
        comm = merged_comm([(channel.train, protocol_kind),
                            *((comm_from_dict(r["stats"]["train"]), lambda kind: kind.startswith("dealer."))
                              for r in reports.values())])
        grants = [g.as_dict(self.refused.get(g, "granted")) for g in self.local.grants]
        held_out = self.local.attacks.held_out()

        def baseline(alone: bool) -> UtilityResult:  # the active party alone, on its own data
            return utility_of(cfg, train_run(cfg, run.data, with_defenses=False, alone=alone,
                                             held_out=held_out).history)

        baselines = self.pipeline.baselines(run, undefended=undefended, train=baseline, second_federation=False)
        result = self.pipeline.result(run, attacks=attacks, attack_seconds=seconds, comm=comm, baselines=baselines,
                                      undefended=undefended, grants=grants, honest_reference=False)
        self.summary.update(utility=result.utility.__dict__, epochs=run.history.epochs, comm=comm, grants=grants)
        self.pipeline.directory.write("net.json", net_report(
            self.walls, comm, self.wire, {r.name: r.wire for r in remotes},
            {ACTIVE: wire_of(channel), **{n: r["wire"] for n, r in reports.items()}}, shaped=channel.options.shape))
        self.pipeline.directory.write("result.json", result.to_dict())


def _refusals(ready: Message, grants: list[Grant]) -> dict[Grant, str]:
    """The grants a passive party refuses, as its ``passive.ready`` says (``refuses``: comma-separated kinds of the
    evaluation-only queries of its own model that it will not answer), each with its status for ``result.json``."""
    said = ready.meta.get("refuses", "")
    kinds = {k for k in said.split(",") if k} if isinstance(said, str) else None
    its = {g.kind: g for g in grants if g.server == ready.sender}
    if kinds is None or not kinds <= its.keys():
        raise ProtocolError(f"{ready.sender}'s passive.ready may refuse only grants of this run that query its own "
                            f"model ({', '.join(its) or 'none'}), as comma-separated kinds; got {said!r}")
    for kind in sorted(kinds):
        log.warning("active: %s refuses %s (its own configuration): the scores that need it are not computed",
                    ready.sender, its[kind].describe())
    return {its[k]: f"refused by {ready.sender}" for k in kinds}


def _final_report(payload: Tensor, sender: str, positions: list[int]) -> dict[str, Any]:
    """A passive party's ``passive.report``, bounded and checked before the active party reads it."""
    report = from_bytes_tensor(payload, sender=sender, what="final report")
    keys = {"stats", "wire", "attacks", "attack_seconds"}
    if not isinstance(report, dict) or set(report) != keys:
        raise ProtocolError(f"{sender}'s final report must be an object with exactly {', '.join(sorted(keys))}, "
                            f"got {sorted(report) if isinstance(report, dict) else type(report).__name__}")
    _stats(report["stats"], sender)
    _counts(report["wire"], "final link counters", sender)
    _attack_results(report["attacks"], positions, sender)
    seconds = report["attack_seconds"]
    if not isinstance(seconds, dict) or not all(isinstance(k, str) and isinstance(v, (int, float))
                                                and not isinstance(v, bool) for k, v in seconds.items()):
        raise ProtocolError(f"{sender}'s final report: attack_seconds must map attack names to seconds")
    return report


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


def _commit_epoch(out_dir: Path, epoch: int, fed: Any, channel: NetChannel, batches: torch.Generator,
                  remotes: list[RemotePassive], metrics_lines: list[str], epoch_walls: list[float],
                  active_wire: list[dict[str, Any]]) -> None:
    """The checkpoint of ``epoch``: each passive party writes its own and reports it, then the active party writes
    its own and, once every party committed ``epoch``, the manifest."""
    committed: dict[str, int] = {}
    for r in remotes:
        answer = r.endpoint.call("passive.checkpoint", r.name, epoch=epoch).meta.get("committed")
        if not isinstance(answer, int):
            raise ProtocolError(f"{r.name} answered passive.checkpoint without an int 'committed', got {answer!r}")
        committed[r.name] = answer
    if DEALER in channel.parties:  # the dealer writes its generator and triple counters
        answer = channel.endpoint(ACTIVE).call("dealer.checkpoint", DEALER, epoch=epoch, phase="setup").meta.get(
            "committed")
        if not isinstance(answer, int):
            raise ProtocolError(f"the dealer answered dealer.checkpoint without an int 'committed', got {answer!r}")
        committed[DEALER] = answer
    extra = {"batches": batches.get_state(), "metrics": list(metrics_lines), "walls": list(epoch_walls),
             "active_wire": json.dumps(active_wire), "passive_wire": json.dumps({r.name: r.wire for r in remotes}),
             "net_stats": _stats_json(channel)}
    save_checkpoint(out_dir, ACTIVE, epoch, {**party_state(fed.active), **extra})
    committed[ACTIVE] = epoch
    if all(e == epoch for e in committed.values()):
        write_manifest(out_dir, epoch, committed)
    else:
        log.warning("epoch %d is not committed by every party (%s): a resume would start from an earlier one",
                    epoch, ", ".join(f"{n} {e}" for n, e in committed.items()))


def _resume_active(out_dir: Path, epoch: int, fed: Any, channel: NetChannel, batches: torch.Generator,
                   remotes: list[RemotePassive]) -> dict[str, Any]:
    """Load the active party's checkpoint of ``epoch``, have every passive party load its own, and return what the
    loop's bookkeeping continues from."""
    state = load_checkpoint(out_dir, ACTIVE, epoch)
    if DEALER in channel.parties:  # before the first triple of the resumed epochs is asked for
        channel.endpoint(ACTIVE).call("dealer.resume", DEALER, epoch=epoch, phase="setup")
    for remote in remotes:
        remote.endpoint.call("passive.resume", remote.name, epoch=epoch)
    load_party_state(fed.active, state)
    batches.set_state(state["batches"])
    _restore_stats(channel, state["net_stats"])
    for remote in remotes:
        remote.wire = list(json.loads(state["passive_wire"]).get(remote.name, []))
    return {"metrics": list(state["metrics"]), "walls": [float(w) for w in state["walls"]],
            "active_wire": json.loads(state["active_wire"])}


def _comm_restored(raw: Mapping[str, Any]) -> CommStats:
    """:func:`comm_from_dict` with the totals too."""
    stats = comm_from_dict(raw)
    for key in ("messages", "bytes_up", "bytes_down", "messages_up", "messages_down", "rounds_up", "rounds_down"):
        setattr(stats, key, int(raw[key]))
    return stats


def net_report(epoch_seconds: list[float], comm: dict[str, Any], active_wire: list[dict[str, Any]],
               passive_wire: dict[str, list[dict[str, Any]]], final: dict[str, dict[str, Any]],
               shaped: Any = None) -> dict[str, Any]:
    """``net.json``: the measured wall time per epoch (training, the end-of-epoch reports and the evaluation), what
    the channels counted, and what crossed each link per epoch (frames and bytes, counted at one end of each link:
    the active party's links at the active party, a passive party's link to the dealer at that party), with the
    time projected on each :data:`~vflbench.net.linkmodel.LINK_PROFILES` network; ``shaped``: the link the
    transport's shaper enforced (``None``: none, loopback speed)."""
    def links(active: Mapping[str, Any], passives: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, int]]:
        out = {f"active-{peer}": {"frames": w["frames_sent"] + w["frames_received"],
                                  "bytes": w["bytes_sent"] + w["bytes_received"]} for peer, w in active.items()}
        for name, wire in passives.items():
            if DEALER in wire:
                w = wire[DEALER]
                out[f"{name}-{DEALER}"] = {"frames": w["frames_sent"] + w["frames_received"],
                                           "bytes": w["bytes_sent"] + w["bytes_received"]}
        return out

    per_epoch: list[dict[str, dict[str, int]]] = []
    previous: dict[str, dict[str, int]] = {}
    for epoch, snapshot in enumerate(active_wire):
        now = links(snapshot, {n: w[epoch] for n, w in passive_wire.items() if epoch < len(w)})
        per_epoch.append({k: {m: v[m] - previous.get(k, {}).get(m, 0) for m in v} for k, v in now.items()})
        previous = now
    frames = [sum(v["frames"] for v in e.values()) for e in per_epoch]
    nbytes = [sum(v["bytes"] for v in e.values()) for e in per_epoch]
    return {"epoch_seconds": epoch_seconds, "shaped": None if shaped is None else shaped.as_dict(),
            "counted": {"messages": comm["messages"], "bytes": comm["bytes_up"] + comm["bytes_down"]},
            "wire_per_epoch": {"frames": frames, "bytes": nbytes, "links": per_epoch},
            "wire_total": links(final.get(ACTIVE, {}), {n: w for n, w in final.items() if n != ACTIVE}),
            "projected": {name: {**profile.as_dict(),
                                 "epoch_seconds": [project(s, f, b, profile) for s, f, b in
                                                   zip(epoch_seconds, frames, nbytes, strict=False)]}
                          for name, profile in LINK_PROFILES.items()}}
