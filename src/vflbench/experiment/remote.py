"""A party's side across processes: the active party's handles on passive parties in other processes
(:class:`RemotePassive`, the scorer's :class:`OracleBottom`), a passive party's handlers there
(:class:`ServedPassive`), and the checks of everything a peer sends before it is used (a violation is a
:class:`~vflbench.net.errors.ProtocolError` naming the sender). Both extend the loop's message classes
(:mod:`vflbench.protocol.service`), which run unchanged in one process; :mod:`vflbench.experiment.party` starts the
processes and resumes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vflbench.experiment.results import (
    AttackResult,
)
from vflbench.experiment.resume import (
    load_checkpoint,
    load_party_state,
    party_state,
    save_checkpoint,
)
from vflbench.models.finetune import EVAL_BATCH
from vflbench.net.errors import ProtocolError
from vflbench.net.frames import MAX_JSON_BYTES, json_from_tensor, json_tensor
from vflbench.net.transport import NetChannel
from vflbench.protocol.channel import CommStats, Endpoint, KindStats
from vflbench.protocol.grants import Grant
from vflbench.protocol.messages import Message
from vflbench.protocol.party import PassiveParty
from vflbench.protocol.service import PassivePeer, PassiveService

log = logging.getLogger(__name__)


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


def check_tensor(
    t: Tensor,
    *,
    sender: str,
    what: str,
    shape: tuple[int, ...] | None = None,
    dtypes: Iterable[torch.dtype] = (),
    finite: bool = True,
) -> Tensor:
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
        raise ProtocolError(
            f"{sender} sent {what} with {bad} non-finite values (NaN or infinity) of {t.numel()}: "
            "its model diverged there, or it is not following the protocol"
        )
    return t


@contextlib.contextmanager
def refusing(channel: NetChannel, sender: str) -> Iterator[None]:
    """Checks of what ``sender`` sent: a :class:`ProtocolError` they raise is logged as this party's refusal and
    re-raised naming both parties (:meth:`~vflbench.net.transport.NetChannel.refuse`)."""
    try:
        yield
    except ProtocolError as exc:
        raise channel.refuse(sender, str(exc)) from None


def nothing_else(message: Message, what: str) -> None:
    """Refuse tensors a message of this kind does not carry (a request whose content is all in its header)."""
    if message.payload.numel() or message.extra:
        raise ProtocolError(
            f"{message.sender} sent {what} carrying tensors {[tuple(t.shape) for t in message.tensors]}"
            "; it carries none"
        )


def _counts(value: Any, what: str, sender: str) -> dict[str, dict[str, int]]:
    """Per-peer link counters (:func:`wire_of`) as a report carries them, checked."""
    keys = {"frames_sent", "bytes_sent", "frames_received", "bytes_received"}
    ok = isinstance(value, dict) and all(
        isinstance(peer, str)
        and isinstance(c, dict)
        and set(c) == keys
        and all(type(v) is int and v >= 0 for v in c.values())
        for peer, c in value.items()
    )
    if not ok:
        raise ProtocolError(
            f"{sender}'s {what} must map each peer to its counters {sorted(keys)} (non-negative "
            f"integers), got {str(value)[:200]}"
        )
    return value


def _stats(value: Any, sender: str) -> dict[str, Any]:
    """A report's channel counters per phase (:meth:`CommStats.as_dict`), checked as far as the active party reads
    them (the kinds, directions, messages, bytes and rounds)."""
    if not isinstance(value, dict) or not isinstance(value.get("train"), dict):
        raise ProtocolError(f"{sender}'s report must carry its channel counters per phase, 'train' included")
    by_kind = value["train"].get("by_kind")
    ok = isinstance(by_kind, dict) and all(
        isinstance(kind, str)
        and isinstance(d, dict)
        and set(d) <= {"up", "down"}
        and all(
            isinstance(c, dict)
            and set(c) == {"messages", "bytes", "rounds"}
            and all(type(v) is int and v >= 0 for v in c.values())
            for c in d.values()
        )
        for kind, d in by_kind.items()
    )
    if not ok:
        raise ProtocolError(
            f"{sender}'s report: its 'train' counters must map each kind to up/down counts of "
            "messages, bytes and rounds (non-negative integers)"
        )
    return value


def _attack_results(value: Any, positions: list[int], sender: str) -> dict[str, Any]:
    """A passive party's attack results, checked: exactly its own attacks' positions, each a result the active party
    can read."""
    if not isinstance(value, dict) or sorted(value) != sorted(str(i) for i in positions):
        raise ProtocolError(
            f"{sender}'s report must carry the results of its attacks at positions {positions} of the "
            f"config, got {sorted(value) if isinstance(value, dict) else type(value).__name__}"
        )
    fields = {f.name for f in dataclasses.fields(AttackResult)}
    for key, r in value.items():
        if not isinstance(r, dict) or not set(r) <= fields or not {"name", "target", "metric", "value"} <= set(r):
            raise ProtocolError(
                f"{sender}'s result of attack {key} is not an attack result (fields: {', '.join(sorted(fields))})"
            )
        if not all(
            isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool) for k in ("value", "prior", "leakage")
        ):
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
            return check_tensor(
                out,
                sender=self.name,
                what="its bottom model's outputs (passive.oracle_bottom)",
                shape=(len(x), self.width),
                dtypes=(torch.get_default_dtype(),),
            )


class RemotePassive(PassivePeer):
    """The active process's handle on passive party ``name`` in its own process: the loop's messages
    (:class:`~vflbench.protocol.service.PassivePeer`), with everything the party answers checked against what the
    protocol expects (``width``: its embeddings' width; ``granted``: whether the scorer may query its bottom model,
    :class:`OracleBottom`). :attr:`wire`: the party's link counters at each epoch's end, from its reports."""

    def __init__(
        self, name: str, *, endpoint: Endpoint, channel: NetChannel, width: int, granted: bool = False
    ) -> None:
        super().__init__(name, endpoint)
        self.channel = channel
        self.width = width
        self.bottom = OracleBottom(name, endpoint, channel=channel, width=width) if granted else None
        self.wire: list[dict[str, Any]] = []

    def embedding(self, reply: Message, message: Message, ids: Tensor) -> Tensor:
        """The embedding the party posted, checked: an empty reply, the request's position and rows, the width."""
        with refusing(self.channel, self.name):
            nothing_else(reply, "its passive.forward reply")
            if (message.epoch, message.step, message.phase) != (
                reply.epoch,
                reply.step,
                reply.phase,
            ) or not torch.equal(message.ids.cpu(), ids.cpu()):
                raise ProtocolError(
                    f"{self.name} sent an embedding for {message.phase} epoch {message.epoch} step "
                    f"{message.step} ({len(message.ids)} rows) when {reply.phase} epoch {reply.epoch} "
                    f"step {reply.step} ({len(ids)} rows) was asked for"
                )
            return check_tensor(
                message.payload,
                sender=self.name,
                what=f"an embedding of {len(ids)} rows",
                shape=(len(ids), self.width),
                dtypes=(torch.get_default_dtype(),),
            )

    def applied(self, reply: Message) -> bool:
        """Whether the party applied the update: a bool ``applied`` and no tensors, or a protocol error."""
        applied = reply.meta.get("applied")
        with refusing(self.channel, self.name):
            if not isinstance(applied, bool) or reply.payload.numel() or reply.extra:
                raise ProtocolError(
                    f"{self.name} answered passive.backward with something else than a bool "
                    f"'applied' and no tensors, got {applied!r}"
                )
        return applied

    def report(self, payload: Tensor, epoch: int) -> dict[str, object]:
        """The party's end-of-epoch report, bounded and checked (its link counters are kept in :attr:`wire`)."""
        with refusing(self.channel, self.name):
            reply = from_bytes_tensor(payload, sender=self.name, what=f"end-of-epoch report of epoch {epoch}")
            if not isinstance(reply, dict) or set(reply) != {"report", "wire"} or not isinstance(reply["report"], dict):
                raise ProtocolError(
                    f"{self.name}'s end-of-epoch report must be an object with a 'report' object and "
                    f"its 'wire' counters, got {str(reply)[:200]}"
                )
            self.wire.append(_counts(reply["wire"], "end-of-epoch link counters", self.name))
        return dict(reply["report"])


class ServedPassive(PassiveService):
    """A passive party's handlers in its own process: the loop's (:class:`~vflbench.protocol.service.PassiveService`)
    with every request checked against what the protocol expects at that point, plus ``passive.checkpoint``,
    ``passive.resume`` and, when granted, ``passive.oracle_bottom``."""

    def __init__(
        self,
        party: PassiveParty,
        channel: NetChannel,
        *,
        rows: Mapping[str, int],
        epochs: int,
        out_dir: Path | None = None,
        resume: bool = False,
        oracle: Grant | None = None,
    ) -> None:
        super().__init__(party, channel.endpoint(party.name))
        self.channel = channel
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
        """The loop's requests, ``passive.checkpoint``, ``passive.resume`` and ``passive.oracle_bottom``."""
        return {
            **super().handlers(),
            "passive.checkpoint": self.checkpoint,
            "passive.resume": self.restore,
            "passive.oracle_bottom": self._oracle,
        }

    def unserved(self, request: Message) -> Exception:
        """A protocol error naming what this party serves."""
        return ProtocolError(
            f"{self.party.name} serves passive.forward, passive.backward, passive.end_epoch, "
            f"passive.checkpoint, passive.resume and (when granted) passive.oracle_bottom, not "
            f"{request.kind!r}"
        )

    def _epoch_request(self, request: Message) -> None:
        nothing_else(request, request.kind)
        if not 0 <= request.epoch < self.epochs:
            raise ProtocolError(
                f"{request.sender} sent {request.kind} for epoch {request.epoch}; this run trains "
                f"epochs 0..{self.epochs - 1}"
            )

    def embed(self, request: Message) -> Tensor:
        """The embedding of the requested rows, once the request is checked (its split, rows and epoch)."""
        split, train = request.meta.get("split"), request.meta.get("train")
        if not isinstance(split, str) or split not in self.rows or not isinstance(train, bool):
            raise ProtocolError(
                f"passive.forward needs meta split in {sorted(self.rows)} and a bool train, got {request.meta}"
            )
        nothing_else(request, "passive.forward (row ids only)")
        ids = request.ids
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.rows[split]):
            raise ProtocolError(f"passive.forward asks for rows outside 0..{self.rows[split] - 1} of {split}")
        if train and not (0 <= request.epoch < self.epochs and request.step >= 0):
            raise ProtocolError(
                f"{request.sender} asked for a training embedding at epoch {request.epoch} step "
                f"{request.step}; this run trains epochs 0..{self.epochs - 1}"
            )
        out = super().embed(request)
        if train:
            self.pending, self.pending_ids, self.pending_at = tuple(out.shape), ids, (request.epoch, request.step)
        return out

    def backward(self, request: Message) -> Message:
        """Apply the posted cut gradient once it is checked against the pending embedding and its step."""
        sender = request.sender
        nothing_else(request, "passive.backward (the cut gradient comes as its own message)")
        if (request.epoch, request.step) != self.pending_at or self.pending is None:
            raise ProtocolError(
                f"{sender} sent the cut gradient of epoch {request.epoch} step {request.step}, "
                f"but the pending embedding is of epoch {self.pending_at[0]} step {self.pending_at[1]}"
            )
        message = self.gradient(request)
        g = message.payload
        # a plaintext cut gradient has the embedding's shape; an encrypted one (paillier_he) is its ciphertexts'
        # bytes, which the party's defense checks
        plain = g.dtype.is_floating_point and tuple(g.shape) == self.pending
        if not (plain or g.dtype == torch.uint8) or message.extra:
            raise ProtocolError(
                f"passive.backward: a cut gradient of shape {tuple(g.shape)} ({g.dtype}) does "
                f"not fit the pending embedding ({self.pending})"
            )
        assert self.pending_ids is not None
        if (message.epoch, message.step) != self.pending_at or not torch.equal(
            message.ids.cpu(), self.pending_ids.cpu()
        ):
            raise ProtocolError(
                f"{sender} sent a cut gradient for epoch {message.epoch} step {message.step} "
                f"({len(message.ids)} rows) when the pending embedding is of epoch "
                f"{self.pending_at[0]} step {self.pending_at[1]} ({len(self.pending_ids)} rows)"
            )
        check_tensor(g, sender=sender, what="a cut gradient")
        self.pending = self.pending_ids = None
        return request.reply(meta={"applied": self.party.backward(g)})

    def end_epoch(self, request: Message) -> Message:
        """End the epoch, once the request is checked (no tensors, an epoch of this run)."""
        self._epoch_request(request)
        return super().end_epoch(request)

    def report(self, epoch: int) -> dict[str, Any]:
        """The party's end-of-epoch report with its link counters."""
        report = super().report(epoch)
        return {**report, "wire": wire_of(self.channel)}

    def checkpoint(self, request: Message) -> Message:
        """Write this party's own state after the epoch (-1: it keeps no checkpoints, no ``--out``)."""
        self._epoch_request(request)
        if self.out_dir is None:
            return request.reply(meta={"committed": -1})
        save_checkpoint(
            self.out_dir,
            self.party.name,
            request.epoch,
            {**party_state(self.party), "net_stats": stats_json(self.channel)},
        )
        return request.reply(meta={"committed": request.epoch})

    def restore(self, request: Message) -> Message:
        """Load this party's checkpoint of the epoch the active party names (``--resume`` only)."""
        self._epoch_request(request)
        if not self.resume or self.out_dir is None:
            raise ProtocolError(
                f"{self.party.name} was asked to resume from epoch {request.epoch} but was "
                "started without --resume and --out"
            )
        state = load_checkpoint(self.out_dir, self.party.name, request.epoch)
        load_party_state(self.party, state)
        restore_stats(self.channel, state["net_stats"])  # its counts (dealer.* go into comm) continue
        log.info("%s: resumed from its checkpoint of epoch %d", self.party.name, request.epoch)
        return request.reply(meta={"resumed": request.epoch})

    def _oracle(self, request: Message) -> Message:
        """Answer an evaluation-only query of the bottom model, if the run granted it to its sender (the transport's
        policy refuses it otherwise; this is the second lock), checked and logged."""
        grant, sender = self.oracle, request.sender
        if grant is None or grant.client != sender:
            raise ProtocolError(
                f"{self.party.name} does not answer passive.oracle_bottom for {sender}: the run's "
                "plan does not grant it, or this party refused it"
            )
        assert self.party.data is not None and self.party.bottom is not None
        own = self.party.data.x_train
        x = request.payload
        if not 1 <= len(x) <= EVAL_BATCH or request.extra:
            raise ProtocolError(
                f"{sender} sent passive.oracle_bottom with {len(x)} rows; the scorer asks for 1 to "
                f"{EVAL_BATCH} at a time"
            )
        check_tensor(
            x,
            sender=sender,
            what="passive.oracle_bottom inputs",
            shape=(len(x), *own.shape[1:]),
            dtypes=dict.fromkeys((own.dtype, torch.float32)),
        )
        bottom = self.party.bottom
        was = bottom.training
        bottom.eval()
        with torch.no_grad():
            out = bottom(x)
        bottom.train(was)
        self.served += 1
        log.warning(
            "%s: served an evaluation-only query of its bottom model to %s (%d rows; query %d; granted for %s)",
            self.party.name,
            sender,
            len(x),
            self.served,
            ", ".join(grant.purpose) or "scoring",
        )
        return request.reply(out)


def stats_json(channel: NetChannel) -> str:
    """The channel's message counters, every phase, as JSON (for a checkpoint)."""
    return json.dumps({phase: stats.as_dict() for phase, stats in channel.stats.items()})


def restore_stats(channel: NetChannel, saved: str) -> None:
    """Put :func:`stats_json`'s counters back: what a resumed process counts continues the run's counts (the
    resume's own set-up messages are left out, as the uninterrupted run had them once)."""
    for phase, raw in json.loads(saved).items():
        channel.stats[phase] = _comm_restored(raw)


def wire_of(channel: NetChannel) -> dict[str, dict[str, int]]:
    """The channel's frame counters per peer."""
    return {k: v.as_dict() for k, v in channel.wire.items()}


def comm_from_dict(raw: Mapping[str, Any]) -> CommStats:
    """A :class:`CommStats` from its :meth:`~CommStats.as_dict` (a passive party's report)."""
    stats = CommStats()
    for kind, directions in raw["by_kind"].items():
        for direction, s in directions.items():
            stats.by_kind[kind][direction] = KindStats(int(s["messages"]), int(s["bytes"]), int(s["rounds"]))
    return stats


def refusals(ready: Message, grants: list[Grant]) -> dict[Grant, str]:
    """The grants a passive party refuses, as its ``passive.ready`` says (``refuses``: comma-separated kinds of the
    evaluation-only queries of its own model that it will not answer), each with its status for ``result.json``."""
    said = ready.meta.get("refuses", "")
    kinds = {k for k in said.split(",") if k} if isinstance(said, str) else None
    its = {g.kind: g for g in grants if g.server == ready.sender}
    if kinds is None or not kinds <= its.keys():
        raise ProtocolError(
            f"{ready.sender}'s passive.ready may refuse only grants of this run that query its own "
            f"model ({', '.join(its) or 'none'}), as comma-separated kinds; got {said!r}"
        )
    for kind in sorted(kinds):
        log.warning(
            "active: %s refuses %s (its own configuration): the scores that need it are not computed",
            ready.sender,
            its[kind].describe(),
        )
    return {its[k]: f"refused by {ready.sender}" for k in kinds}


def final_report(payload: Tensor, sender: str, positions: list[int]) -> dict[str, Any]:
    """A passive party's ``passive.report``, bounded and checked before the active party reads it."""
    report = from_bytes_tensor(payload, sender=sender, what="final report")
    keys = {"stats", "wire", "attacks", "attack_seconds", "defenses"}
    if not isinstance(report, dict) or set(report) != keys:
        raise ProtocolError(
            f"{sender}'s final report must be an object with exactly {', '.join(sorted(keys))}, "
            f"got {sorted(report) if isinstance(report, dict) else type(report).__name__}"
        )
    _stats(report["stats"], sender)
    _counts(report["wire"], "final link counters", sender)
    _attack_results(report["attacks"], positions, sender)
    seconds = report["attack_seconds"]
    if not isinstance(seconds, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in seconds.items()
    ):
        raise ProtocolError(f"{sender}'s final report: attack_seconds must map attack names to seconds")
    defenses = report["defenses"]
    if not isinstance(defenses, dict) or not all(
        isinstance(k, str) and isinstance(v, dict) and all(isinstance(f, str) for f in v) for k, v in defenses.items()
    ):
        raise ProtocolError(f"{sender}'s final report: defenses must map defense names to objects of details")
    return report


def _comm_restored(raw: Mapping[str, Any]) -> CommStats:
    """:func:`comm_from_dict` with the totals too."""
    stats = comm_from_dict(raw)
    for key in ("messages", "bytes_up", "bytes_down", "messages_up", "messages_down", "rounds_up", "rounds_down"):
        setattr(stats, key, int(raw[key]))
    return stats
