"""The declared transport and its in-memory implementation: deliver messages, keep each party's transcript, count
traffic.

:class:`Transport` is what every party's code talks through (Flower's ``Grid``, CrypTen's communicator): the
in-process :class:`InMemoryTransport` (synchronous dispatch: a request runs its handler at once) and the gRPC
transport (:class:`~vflbench.net.transport.NetChannel`, parties in other processes or machines) implement it, and
the same party code runs on both with the same numbers.

Three ways to talk, each a message exchange that a network transport carries unchanged:

* :meth:`Transport.send` -- a one-way message, counted and recorded (the receiving code picks it up);
* :meth:`Endpoint.post` / :meth:`Endpoint.take` -- a one-way message left in the receiver's
  mailbox until its code takes it (e.g. what parties agree on before training);
* :meth:`Endpoint.call` / :meth:`Endpoint.serve` -- a request answered by a handler the receiving
  party registered for the kind's namespace (the halves of a two-party protocol such as VMask's
  secret-shared layers or the Paillier key holder); :meth:`Endpoint.ask` sends the request without waiting and
  :meth:`Endpoint.answer` takes its reply later (the reply may travel while the party does other work).

Every message goes through the transport's one counter (:class:`CommStats`): messages, bytes and rounds per
phase, per direction (``up`` = towards the active party) and per kind. A party's code holds only its own
:class:`Endpoint`; it never holds another party's objects.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from vflbench.protocol.messages import ACTIVE, NO_IDS, Message, MessageKind, Phase, Scalar

Handler = Callable[[Message], Message]


@dataclass
class Asked:
    """A request sent with :meth:`Endpoint.ask` whose reply :meth:`Endpoint.answer` has not yet taken: the request,
    the transport's key for its reply and, on a transport that answers at once, the reply."""

    request: Message
    key: tuple[str, int] | None = None
    reply: Message | None = None
    answered: bool = False


class Transcript:
    """The messages one party sent and received, as far as it chose to retain them.

    Counting every message is cheap; keeping every tensor is not (an MNIST run would hold
    gigabytes of gradients), so a transcript retains the payloads of the message kinds in
    ``keep`` only. The runner sets ``keep`` from what the configured attacks read.
    """

    def __init__(self, owner: str, keep: Collection[MessageKind] = ()) -> None:
        self.owner = owner
        self.keep = set(keep)
        self.messages: list[Message] = []

    def record(self, message: Message) -> None:
        """Retain ``message`` if its kind is kept."""
        if message.kind in self.keep:
            self.messages.append(message)

    def of_kind(self, kind: MessageKind, *, phase: str = "train") -> list[Message]:
        """Retained messages of one kind and phase, in order."""
        return [m for m in self.messages if m.kind == kind and m.phase == phase]


@dataclass
class KindStats:
    """Traffic of one message kind in one direction: messages, bytes and rounds (the requests among the
    messages: each request and its reply is one round trip, counted in the request's direction)."""

    messages: int = 0
    bytes: int = 0
    rounds: int = 0


@dataclass
class CommStats:
    """Traffic counted by the channel in one phase (``up`` = towards the active party).

    ``by_kind`` breaks the totals down by message kind and direction (``"up"``/``"down"``). ``rounds``
    counts round trips: a request and its reply are one round, in the request's direction and under
    its kind (the reply adds a message and its bytes, no round); a one-way message is a message, not a
    round trip.
    """

    messages: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    messages_up: int = 0
    messages_down: int = 0
    rounds_up: int = 0
    rounds_down: int = 0
    by_kind: dict[str, dict[str, KindStats]] = field(default_factory=lambda: defaultdict(dict))

    def count(self, message: Message) -> None:
        """Add one message."""
        up = message.receiver == ACTIVE
        rounds = int(message.role == "request")
        self.messages += 1
        if up:
            self.bytes_up += message.nbytes
            self.messages_up += 1
            self.rounds_up += rounds
        else:
            self.bytes_down += message.nbytes
            self.messages_down += 1
            self.rounds_down += rounds
        stats = self.by_kind[message.kind].setdefault("up" if up else "down", KindStats())
        stats.messages += 1
        stats.bytes += message.nbytes
        stats.rounds += rounds

    def only(self, keep: Callable[[str], bool]) -> CommStats:
        """The traffic of the kinds ``keep`` accepts, totals summed over them."""
        out = CommStats()
        out.add(self, keep)
        return out

    def add(self, other: CommStats, keep: Callable[[str], bool] = lambda kind: True) -> None:
        """Add ``other``'s traffic of the kinds ``keep`` accepts to this counter."""
        for kind, directions in other.by_kind.items():
            if not keep(kind):
                continue
            for direction, s in directions.items():
                into = self.by_kind[kind].setdefault(direction, KindStats())
                into.messages += s.messages
                into.bytes += s.bytes
                into.rounds += s.rounds
                self.messages += s.messages
                if direction == "up":
                    self.messages_up += s.messages
                    self.bytes_up += s.bytes
                    self.rounds_up += s.rounds
                else:
                    self.messages_down += s.messages
                    self.bytes_down += s.bytes
                    self.rounds_down += s.rounds

    @property
    def rounds(self) -> int:
        """Round trips in both directions."""
        return self.rounds_up + self.rounds_down

    def as_dict(self) -> dict[str, Any]:
        """Plain values for result.json: totals, then ``by_kind`` (kind -> direction -> messages, bytes, rounds)."""
        return {
            "messages": self.messages,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "messages_up": self.messages_up,
            "messages_down": self.messages_down,
            "rounds": self.rounds,
            "rounds_up": self.rounds_up,
            "rounds_down": self.rounds_down,
            "by_kind": {
                k: {d: {"messages": s.messages, "bytes": s.bytes, "rounds": s.rounds} for d, s in sorted(v.items())}
                for k, v in sorted(self.by_kind.items())
            },
        }


class Transport(Protocol):
    """What a party's code talks through: one counter of every message it carries (:attr:`stats`), each party's
    transcript, and four ways to talk (:class:`Endpoint` wraps them for one party). Implemented by
    :class:`InMemoryTransport` (every party in one process) and by the gRPC transport
    (:class:`~vflbench.net.transport.NetChannel`: one party, its peers in other processes)."""

    stats: dict[str, CommStats]

    def register(self, transcript: Transcript) -> None:
        """Attach a party's transcript under its owner's name."""

    def transcript(self, owner: str) -> Transcript:
        """The transcript of party ``owner``."""

    def endpoint(self, owner: str) -> Endpoint:
        """The connection of party ``owner``."""

    def send(self, message: Message) -> Message:
        """Deliver a one-way message (counted and recorded); returns it."""

    def call(self, request: Message) -> Message:
        """Deliver a request to the handler its receiver serves for the kind's namespace; returns the reply."""

    def ask(self, request: Message) -> Asked:
        """Deliver a request as :meth:`call` does without waiting for its reply (:meth:`answer` takes it)."""

    def answer(self, asked: Asked) -> Message:
        """The reply to a request :meth:`ask` sent (waiting for it if needed); each reply is taken once."""

    def serve(self, owner: str, namespace: str, handler: Handler) -> None:
        """Answer requests of kinds ``<namespace>.*`` sent to party ``owner`` with ``handler``."""

    def post(self, message: Message) -> None:
        """Leave a one-way message in its receiver's mailbox."""

    def take(self, owner: str, sender: str, kind: str) -> Message:
        """The oldest message of ``kind`` from ``sender`` in party ``owner``'s mailbox."""


class InMemoryTransport:
    """Delivers messages between registered parties in one process, synchronously (a request's handler runs inside
    :meth:`call`); ``parties`` are registered with transcripts that keep nothing.

    The same party code runs over the gRPC transport; only the transport changes.
    """

    def __init__(self, parties: Collection[str] = ()) -> None:
        self._transcripts: dict[str, Transcript] = {}
        self._handlers: dict[tuple[str, str], Handler] = {}
        self._mailboxes: dict[tuple[str, str, str], deque[Message]] = defaultdict(deque)
        self.stats: dict[str, CommStats] = {"train": CommStats(), "eval": CommStats(), "setup": CommStats()}
        for name in parties:
            self.register(Transcript(name))

    @property
    def train(self) -> CommStats:
        """Traffic of the training phase."""
        return self.stats["train"]

    @property
    def eval(self) -> CommStats:
        """Traffic of evaluation (test-set inference)."""
        return self.stats["eval"]

    def register(self, transcript: Transcript) -> None:
        """Attach a party's transcript under its owner's name (again: a no-op for the same transcript)."""
        if self._transcripts.get(transcript.owner) is transcript:
            return
        if transcript.owner in self._transcripts:
            raise ValueError(f"party {transcript.owner!r} is already registered")
        self._transcripts[transcript.owner] = transcript

    def endpoint(self, owner: str) -> Endpoint:
        """The connection of party ``owner`` (registered with an empty transcript if not yet)."""
        if owner not in self._transcripts:
            self.register(Transcript(owner))
        return Endpoint(self, owner)

    def transcript(self, owner: str) -> Transcript:
        """The transcript of a registered party."""
        return self._transcripts[owner]

    def send(self, message: Message) -> Message:
        """Deliver ``message``: count it and record it in both parties' transcripts."""
        self._check_parties(message)
        self.stats[message.phase].count(message)
        self._transcripts[message.sender].record(message)
        self._transcripts[message.receiver].record(message)
        return message

    def _check_parties(self, message: Message) -> None:
        for name in (message.sender, message.receiver):
            if name not in self._transcripts:
                raise ValueError(
                    f"{message.kind!r} message between unregistered party {name!r}; "
                    f"registered: {', '.join(sorted(self._transcripts))}"
                )

    def serve(self, owner: str, namespace: str, handler: Handler) -> None:
        """Answer requests of kinds ``<namespace>.*`` sent to ``owner`` with ``handler`` (one handler per namespace)."""
        key = (owner, namespace)
        if key in self._handlers:
            raise ValueError(f"party {owner!r} already serves {namespace!r} requests")
        self._handlers[key] = handler

    def call(self, request: Message) -> Message:
        """Run the handler ``request``'s receiver serves for its namespace; the request and the reply are counted and
        recorded."""
        self._check_parties(request)
        namespace = request.kind.split(".", 1)[0]
        handler = self._handlers.get((request.receiver, namespace))
        if handler is None:
            raise RuntimeError(
                f"party {request.receiver!r} serves no {namespace!r} requests "
                f"(sent by {request.sender!r}, kind {request.kind!r})"
            )
        reply = handler(self.send(request))
        if reply.role != "reply" or reply.receiver != request.sender or reply.kind != request.kind:
            raise RuntimeError(f"the {request.kind!r} handler of {request.receiver!r} did not answer its request")
        return self.send(reply)

    def ask(self, request: Message) -> Asked:
        """:meth:`call` at once (a handler in this process answers synchronously); :meth:`answer` hands the reply
        over."""
        return Asked(request, reply=self.call(request))

    def answer(self, asked: Asked) -> Message:
        """The reply :meth:`ask` received."""
        return take_answer(asked)

    def post(self, message: Message) -> None:
        """Deliver ``message`` (:meth:`send`) into its receiver's mailbox."""
        self._mailboxes[(message.receiver, message.sender, message.kind)].append(self.send(message))

    def take(self, owner: str, sender: str, kind: str) -> Message:
        """The oldest ``kind`` message from ``sender`` in ``owner``'s mailbox (an error if there is none)."""
        box = self._mailboxes.get((owner, sender, kind))
        if not box:
            raise RuntimeError(f"party {owner!r} expected a {kind!r} message from {sender!r}, but none was sent")
        return box.popleft()


def take_answer(asked: Asked) -> Message:
    """``asked``'s reply, once (a second take is an error: a reply answers one use)."""
    if asked.answered or asked.reply is None:
        raise RuntimeError(f"the reply to {asked.request.kind!r} was already taken or has not arrived")
    asked.answered = True
    return asked.reply


#: The in-memory transport's former name (kept for existing code).
Channel = InMemoryTransport


class Endpoint:
    """One party's connection to a :class:`Transport`: what its code (and its defenses' halves) send, receive and
    serve, always as this party."""

    def __init__(self, transport: Transport, owner: str) -> None:
        self._transport = transport
        self.owner = owner

    def _message(
        self,
        kind: str,
        receiver: str,
        tensors: tuple[Tensor, ...],
        *,
        meta: Mapping[str, Scalar] | None,
        ids: Tensor | None,
        epoch: int,
        step: int,
        phase: Phase,
        role: str,
    ) -> Message:
        first, *rest = tensors or (torch.empty(0),)
        return Message(
            kind,
            self.owner,
            receiver,
            first,
            NO_IDS if ids is None else ids,
            epoch,
            step,
            phase,
            tuple(rest),
            dict(meta or {}),
            role,  # type: ignore[arg-type]
        )

    @property
    def stats(self) -> Mapping[str, CommStats]:
        """The traffic counted so far, per phase (read only; e.g. a defense reporting its own kinds)."""
        return self._transport.stats

    def call(
        self,
        kind: str,
        receiver: str,
        *tensors: Tensor,
        meta: Mapping[str, Scalar] | None = None,
        ids: Tensor | None = None,
        epoch: int = -1,
        step: int = -1,
        phase: Phase = "train",
    ) -> Message:
        """Send a request to ``receiver`` and return its reply (its handler for ``kind``'s namespace answers)."""
        return self._transport.call(
            self._message(
                kind, receiver, tensors, meta=meta, ids=ids, epoch=epoch, step=step, phase=phase, role="request"
            )
        )

    def ask(
        self,
        kind: str,
        receiver: str,
        *tensors: Tensor,
        meta: Mapping[str, Scalar] | None = None,
        ids: Tensor | None = None,
        epoch: int = -1,
        step: int = -1,
        phase: Phase = "train",
    ) -> Asked:
        """Send a request as :meth:`call` does, without waiting for its reply: :meth:`answer` takes it later. Counted
        as :meth:`call` counts it (a request and its reply, one round)."""
        return self._transport.ask(
            self._message(
                kind, receiver, tensors, meta=meta, ids=ids, epoch=epoch, step=step, phase=phase, role="request"
            )
        )

    def answer(self, asked: Asked) -> Message:
        """The reply to the request :meth:`ask` sent (waiting for it if it has not arrived)."""
        return self._transport.answer(asked)

    def serve(self, namespace: str, handler: Handler) -> None:
        """Answer requests of kinds ``<namespace>.*`` sent to this party with ``handler(request) -> reply``."""
        self._transport.serve(self.owner, namespace, handler)

    def post(
        self,
        kind: str,
        receiver: str,
        *tensors: Tensor,
        meta: Mapping[str, Scalar] | None = None,
        ids: Tensor | None = None,
        epoch: int = -1,
        step: int = -1,
        phase: Phase = "setup",
    ) -> None:
        """Leave a one-way message in ``receiver``'s mailbox."""
        self._transport.post(
            self._message(kind, receiver, tensors, meta=meta, ids=ids, epoch=epoch, step=step, phase=phase, role="send")
        )

    def take(self, kind: str, sender: str) -> Message:
        """The oldest message of ``kind`` from ``sender`` in this party's mailbox (an error if there is none)."""
        return self._transport.take(self.owner, sender, kind)
