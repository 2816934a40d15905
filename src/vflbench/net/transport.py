"""The gRPC transport: one party's channel to its peers in other processes or on other machines.

:class:`NetChannel` implements the declared :class:`~vflbench.protocol.channel.Transport` for one party, as the
in-process :class:`~vflbench.protocol.channel.InMemoryTransport` does for all of them: :meth:`NetChannel.endpoint`
returns the same :class:`~vflbench.protocol.channel.Endpoint` (``call``/``serve``/``post``/``take``) -- plus
:meth:`NetChannel.receive`, a one-way message matched by its position in training.

Links. One long-lived bidirectional gRPC stream per pair of parties that the protocol lets talk
(:meth:`~vflbench.net.policy.Policy.peers`). The dealer and the active party listen; a party dials
every peer that listens "above" it (passive -> active -> dealer), so a passive party only dials
out. Bytes only: generic handlers, frames from :mod:`vflbench.net.frames`, no protobuf.

Identity. With mutual TLS the listener reads the dialer's name from its certificate (gRPC's auth
context) and the dialer pins the listener's name as the TLS target name, so a peer's name never
comes from a frame. The insecure mode (no TLS, names taken from the peers' own greetings) is
refused on anything but loopback addresses and logs a warning.

Concurrency. A party's code runs on one thread. Reader threads (one per link) only decode,
check and queue frames; requests are answered by the party's thread whenever it waits -- for a
reply, a mailbox message or in :meth:`NetChannel.serve_forever` -- so requests nest: while A waits
for B's reply, A's handlers answer B's requests, as in one process.

Frames. A posted one-way message (:meth:`NetChannel.post`: an embedding, a cut gradient) waits on its link for
the next frame this party sends there, and the two travel as one bundle (:func:`~vflbench.net.frames.encode_bundle`):
the loop's ``passive.forward`` reply carries the embedding posted before it, the ``passive.backward`` request the cut
gradient. Nothing waits longer than until this party itself waits (for a reply, a mailbox message, a request) or
closes. Every message is still counted, checked and delivered on its own, in order; only the frames are fewer.

Faults. Keepalive pings on every link; every wait has a deadline (``receive_timeout`` seconds
without the awaited frame); the start-up barrier has its own deadline; a party that fails sends
an ``abort`` frame to its peers (:meth:`NetChannel.abort`, done by the context manager on an
exception), and every wait raises :class:`~vflbench.net.errors.PeerFailed` naming the peer whose link
carried the failure (the authenticated peer) and, as that peer's claim, the party that failed first and its
epoch and step. A frame the policy or the decoder refuses, a reply that does not answer the request it claims
to (its kind, phase, epoch and step), a request the party does not serve and one its handler cannot take end
the run the same way (:class:`~vflbench.net.errors.ProtocolError`, logged by the refusing party), and the
offending peer is told why. Evaluation-only requests pass only where the run's plan grants them
(:meth:`NetChannel.grant`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import logging
import queue
import re
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import torch
from torch import Tensor

from vflbench.errors import ConfigError
from vflbench.net.errors import BarrierTimeout, NetError, PeerFailed, ProtocolError
from vflbench.net.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    MAX_BUNDLE,
    VERSION,
    Frame,
    decode,
    encode,
    encode_bundle,
    split,
)
from vflbench.net.linkmodel import LinkProfile
from vflbench.net.policy import Policy, role_of
from vflbench.net.provision import Credentials
from vflbench.protocol.channel import Asked, CommStats, Endpoint, Handler, Transcript, take_answer
from vflbench.protocol.grants import Grant
from vflbench.protocol.messages import Message

log = logging.getLogger(__name__)
METHOD = "/vflbench.Link/Open"
_TOO_LARGE = re.compile(r"(CLIENT|SERVER): Received message larger than max \((\d+) vs\. (\d+)\)")
#: What a handler may raise on a peer's malformed request (refused as a protocol error naming the peer); anything
#: else (a :class:`~vflbench.errors.VFLBenchError`, an error of the transport) passes through as it is.
_MALFORMED = (ValueError, TypeError, RuntimeError, IndexError, KeyError)
_RANK = {"passive": 0, "active": 1, "dealer": 2}
T = TypeVar("T")


@dataclass(frozen=True)
class NetOptions:
    """Timing and size settings of the links (seconds unless named ``_ms``).

    ``receive_timeout``: the longest a wait may go without its frame arriving (answering a peer's
    request meanwhile restarts the clock); ``start_timeout``: the start-up barrier's deadline;
    ``close_timeout``: how long closing waits for the peers' goodbyes.
    """

    keepalive_ms: int = 10_000
    keepalive_timeout_ms: int = 5_000
    receive_timeout: float = 120.0
    start_timeout: float = 60.0
    close_timeout: float = 5.0
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    shape: LinkProfile | None = None
    """A traffic shaper on every link this party sends on (``None``: none): each frame leaves after the link has
    carried the frames before it at ``bandwidth_mbit_s`` and its own bytes, and arrives ``latency_ms`` later
    (:class:`Shaper`)."""
    device: str | None = None
    """Where the tensors of received messages are put: the party's ``train.device`` (``None``: the CPU, where frames
    are decoded). Row ids and byte payloads (uint8: ciphertexts, keys, JSON reports) stay on the CPU, where they are
    read; frames are always encoded from CPU copies."""


class Shaper:
    """A FIFO link of ``profile``'s bandwidth and one-way delay, enforced at the sender (netem is not available).

    A frame queued at time ``t`` starts on the wire when the link is free (``max(t, end of the previous frame)``),
    takes ``8 x bytes / bandwidth`` seconds, and is handed to gRPC ``latency`` after that: frames sent back to back
    pipeline as on a real link (each pays the latency once, the bytes queue behind each other). The loopback
    transfer itself adds its own (small) time on top."""

    def __init__(self, profile: LinkProfile) -> None:
        if profile.bandwidth_mbit_s <= 0 or profile.latency_ms < 0:
            raise ConfigError(
                f"a shaped link needs a bandwidth > 0 Mbit/s and a latency >= 0 ms, got "
                f"{profile.bandwidth_mbit_s} Mbit/s and {profile.latency_ms} ms"
            )
        self.profile = profile
        self._free = 0.0

    def due(self, nbytes: int, queued: float) -> float:
        """When (``time.monotonic()``) a frame of ``nbytes`` queued at ``queued`` reaches the other end."""
        start = max(queued, self._free)
        self._free = start + 8 * nbytes / (self.profile.bandwidth_mbit_s * 1e6)
        return self._free + self.profile.latency_ms / 1e3


@dataclass
class WireStats:
    """Frames and bytes on one link as handed to gRPC (frame headers included; gRPC's HTTP/2 and TLS framing
    not), control frames included."""

    frames_sent: int = 0
    bytes_sent: int = 0
    frames_received: int = 0
    bytes_received: int = 0

    def as_dict(self) -> dict[str, int]:
        """Plain values for result.json."""
        return {
            "frames_sent": self.frames_sent,
            "bytes_sent": self.bytes_sent,
            "frames_received": self.frames_received,
            "bytes_received": self.bytes_received,
        }


@dataclass
class _Link:
    peer: str
    outbox: queue.Queue[tuple[bytes, float] | None] = field(default_factory=queue.Queue)
    drained: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    call: Any = None
    grpc_channel: grpc.Channel | None = None
    shaper: Shaper | None = None
    held: list[bytes] = field(default_factory=list)
    """Encoded one-way messages waiting to travel with the next frame on this link (see the module doc)."""

    def outgoing(self) -> Iterator[bytes]:
        while True:
            item = self.outbox.get()
            if item is None:
                self.drained.set()
                return
            data, queued = item
            if self.shaper is not None:
                wait = self.shaper.due(len(data), queued) - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            yield data


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` names this machine only (127.0.0.0/8, ::1 or localhost)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _placed(message: Message, device: str | None) -> Message:
    """``message`` with its tensors on ``device`` (see :attr:`NetOptions.device`)."""
    if device is None or device == "cpu":
        return message

    def put(t: Tensor) -> Tensor:
        return t if t.dtype == torch.uint8 else t.to(device)

    return dataclasses.replace(message, payload=put(message.payload), extra=tuple(put(t) for t in message.extra))


class NetChannel:
    """Party ``name``'s links to its peers among ``parties`` in run ``run`` (see the module docstring).

    ``addresses``: ``host:port`` of every listening party (the active party and the dealer, when they
    have peers), the same map for everyone; ``credentials``: this party's certificates (mutual TLS),
    or ``insecure=True`` on loopback only. Use as a context manager, or call :meth:`start` and
    :meth:`close` (or :meth:`abort`) yourself.
    """

    def __init__(
        self,
        *,
        name: str,
        run: str,
        parties: Collection[str],
        addresses: Mapping[str, str],
        credentials: Credentials | None = None,
        insecure: bool = False,
        policy: Policy | None = None,
        options: NetOptions | None = None,
    ) -> None:
        self.name = name
        self.run = run
        self.parties = parties
        self.addresses = addresses
        self.credentials = credentials
        self.insecure = insecure
        self.policy = policy or Policy()
        self.options = options or NetOptions()
        if self.options.shape is not None:
            Shaper(self.options.shape)  # a bad bandwidth or delay is refused before any link opens
        role = role_of(name)
        if name not in parties:
            raise ConfigError(f"party {name!r} is not among the run's parties ({', '.join(parties)})")
        if (credentials is None) == (not insecure):
            raise ConfigError(
                "give a party either its credentials (mutual TLS) or insecure=True (loopback only), "
                "not both and not neither"
            )
        if credentials is not None and credentials.name != name:
            raise ConfigError(f"the certificate given to party {name!r} is party {credentials.name!r}'s")
        peers = self.policy.peers(name, parties)
        self.dials = [p for p in peers if _RANK[role_of(p)] > _RANK[role]]
        self.accepts = [p for p in peers if _RANK[role_of(p)] <= _RANK[role]]
        needed = self.dials + ([name] if self.accepts else [])
        missing = [p for p in needed if p not in addresses]
        if missing:
            raise ConfigError(
                f"party {name!r} needs the listening address of {', '.join(missing)}; "
                f"given: {', '.join(f'{k}={v}' for k, v in addresses.items()) or 'none'}"
            )
        if insecure:
            remote = [f"{p}={addresses[p]}" for p in needed if not is_loopback(addresses[p])]
            if remote:
                raise ConfigError(
                    f"insecure mode runs on loopback addresses only, but {', '.join(remote)} is not; "
                    "provision certificates with `vflbench net provision`"
                )
            log.warning("party %s: INSECURE links (no TLS): peers are who they claim to be; loopback only", name)
        self._transcripts: dict[str, Transcript] = {name: Transcript(name)}
        self.stats: dict[str, CommStats] = {"train": CommStats(), "eval": CommStats(), "setup": CommStats()}
        self.wire: dict[str, WireStats] = {p: WireStats() for p in peers}
        self._handlers: dict[str, Handler] = {}
        self._cond = threading.Condition()
        self._links: dict[str, _Link] = {}
        self._greeted: set[str] = set()
        self._said_bye: set[str] = set()
        self._ready: set[str] = set()
        self._refused: dict[str, str] = {}
        self._mailbox: dict[tuple[str, str], deque[Message]] = defaultdict(deque)
        self._replies: dict[tuple[str, int], Message] = {}
        self._pending: dict[tuple[str, int], Message] = {}
        self._requests: deque[tuple[Message, int]] = deque()
        self._failure: NetError | None = None
        self._calls = itertools.count(1)
        self._position = (-1, -1)
        self._peer_position: dict[str, tuple[int, int]] = dict.fromkeys(peers, (-1, -1))
        self._server: grpc.Server | None = None
        self._address: str | None = None
        self._closed = False

    def _shaper(self) -> Shaper | None:
        return Shaper(self.options.shape) if self.options.shape is not None else None

    def grant(self, grants: Iterable[Grant]) -> None:
        """Let the evaluation-only requests of ``grants`` pass between their two parties (replacing the grants held
        before: a grant a party refused is dropped this way). Every other evaluation-only request stays refused."""
        grants = frozenset(grants)
        self.policy = self.policy.with_grants(grants)
        mine = sorted(g.describe() for g in grants if self.name in (g.server, g.client))
        if mine:
            log.info("party %s: the run's plan grants %s", self.name, "; ".join(mine))

    # ----------------------------------------------------------------- life cycle

    def __enter__(self) -> NetChannel:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.close()
        else:
            self.abort(f"{type(exc).__name__}: {exc}")

    @property
    def address(self) -> str | None:
        """The address this party listens on (with the port the system chose for port 0), once listening."""
        return self._address

    @property
    def peers(self) -> list[str]:
        """The parties this one has a link to."""
        return self.dials + self.accepts

    def _channel_options(self) -> list[tuple[str, Any]]:
        o = self.options
        return [
            ("grpc.keepalive_time_ms", o.keepalive_ms),
            ("grpc.keepalive_timeout_ms", o.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_send_message_length", o.max_frame_bytes),
            ("grpc.max_receive_message_length", o.max_frame_bytes),
        ]

    def listen(self) -> str | None:
        """Start listening if this party accepts peers; returns the bound address (``None`` for a dial-only party)."""
        if not self.accepts or self._server is not None:
            return self._address
        options = [
            *self._channel_options(),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", self.options.keepalive_ms // 2),
            ("grpc.http2.max_ping_strikes", 0),
        ]
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=len(self.accepts) + 2, thread_name_prefix=f"vfl-{self.name}-server"),
            options=options,
            maximum_concurrent_rpcs=len(self.accepts) + 2,
        )
        handler = grpc.stream_stream_rpc_method_handler(self._accept)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("vflbench.Link", {"Open": handler})])
        address = self.addresses[self.name]
        if self.credentials is not None:
            creds = grpc.ssl_server_credentials(
                [(self.credentials.key, self.credentials.cert)],
                root_certificates=self.credentials.ca,
                require_client_auth=True,
            )
            port = server.add_secure_port(address, creds)
        else:
            port = server.add_insecure_port(address)
        if port == 0:
            raise ConfigError(f"party {self.name!r} cannot listen on {address}")
        server.start()
        self._server = server
        self._address = f"{address.rsplit(':', 1)[0]}:{port}"
        log.info("party %s listening on %s for %s", self.name, self._address, ", ".join(self.accepts))
        return self._address

    def start(self) -> NetChannel:
        """Listen, dial, and wait at the start-up barrier (``start_timeout``): until every peer has greeted and every
        listener this party dialled has reported all of its own peers linked (a ``ready`` frame), so that no party
        starts work while another is still missing."""
        try:
            self.listen()
            for peer in self.dials:
                self._dial(peer)
            deadline = time.monotonic() + self.options.start_timeout
            announced = False
            with self._cond:
                while self._failure is None:
                    if not announced and set(self.accepts) <= self._greeted:
                        for peer in self.accepts:
                            self._put(self._links[peer], Frame("ready", receiver=peer, run=self.run))
                        announced = True
                    if set(self.peers) <= self._greeted and set(self.dials) <= self._ready:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if self._failure is not None:
                    raise self._failure
                missing = [f"{p} ({self._expectation(p)})" for p in self.peers if p not in self._greeted]
                missing += [
                    f"{p} (linked, but {p} still waits for its other peers)"
                    for p in self.dials
                    if p in self._greeted and p not in self._ready
                ]
            if missing:
                refused = "".join(f"; refused a link from {who}: {why}" for who, why in self._refused.items())
                raise BarrierTimeout(
                    f"start-up barrier of {self.name}: not ready within "
                    f"{self.options.start_timeout:g} s: " + "; ".join(missing) + refused
                )
        except BaseException as exc:
            self.abort(f"start-up failed: {exc}")
            raise
        log.info("party %s: links up to %s", self.name, ", ".join(self.peers))
        return self

    def _expectation(self, peer: str) -> str:
        if peer in self.dials:
            return f"no greeting; dialled at {self.addresses[peer]}"
        return f"no greeting; expected to dial in at {self._address}"

    def _dial(self, peer: str) -> None:
        link = _Link(peer, shaper=self._shaper())
        options = self._channel_options()
        target = self.addresses[peer]
        if self.credentials is not None:
            creds = grpc.ssl_channel_credentials(self.credentials.ca, self.credentials.key, self.credentials.cert)
            channel = grpc.secure_channel(target, creds, options=[*options, ("grpc.ssl_target_name_override", peer)])
        else:
            channel = grpc.insecure_channel(target, options=options)
        link.grpc_channel = channel
        with self._cond:
            self._links[peer] = link
        self._put(link, Frame("hello", receiver=peer, run=self.run, meta={"party": self.name, "version": VERSION}))
        link.call = channel.stream_stream(METHOD)(link.outgoing(), wait_for_ready=True)
        threading.Thread(
            target=self._read, args=(link, link.call), name=f"vfl-{self.name}-from-{peer}", daemon=True
        ).start()

    def _accept(self, frames: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        """The listener's side of one link: check the dialer, then stream frames both ways."""
        certified = None
        if self.credentials is not None:
            names = context.auth_context().get("x509_common_name") or []
            if len(names) != 1:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "a peer certificate with one common name is required")
            certified = names[0].decode()
        try:
            first = next(frames)
        except (StopIteration, grpc.RpcError):
            return
        claimed: Any = None
        try:
            hello = decode(first, max_bytes=self.options.max_frame_bytes)
            claimed = hello.meta.get("party")
            peer = self._check_hello(hello, certified)
            if peer not in self.accepts:
                raise ProtocolError(f"{self.name} accepts links from {', '.join(self.accepts)}, not from {peer}")
            with self._cond:
                if peer in self._links:
                    raise ProtocolError(f"{peer} is already linked to {self.name}")
                link = _Link(peer, shaper=self._shaper())
                # the greeting goes out first: once the link is listed, this party's thread may send on it
                self._put(
                    link, Frame("hello", receiver=peer, run=self.run, meta={"party": self.name, "version": VERSION})
                )
                self._links[peer] = link
                self._greeted.add(peer)
                self._cond.notify_all()
        except (ProtocolError, ConfigError) as exc:
            who = certified or (claimed if isinstance(claimed, str) else "an unnamed peer")
            log.error("party %s refused a link from %s: %s", self.name, who, exc)
            with self._cond:
                self._refused[who[:64]] = str(exc)
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
            return
        self._count_in(peer, len(first))
        context.add_callback(lambda: link.outbox.put(None))
        threading.Thread(
            target=self._read, args=(link, frames), name=f"vfl-{self.name}-from-{peer}", daemon=True
        ).start()
        yield from link.outgoing()
        # Ending the handler ends the stream both ways: first let the dialer finish sending (its goodbye).
        link.finished.wait()

    def _check_hello(self, frame: Frame, certified: str | None) -> str:
        claimed = frame.meta.get("party")
        if frame.type != "hello" or not isinstance(claimed, str):
            raise ProtocolError(
                f"the first frame on a link must be a greeting naming its party, got a {frame.type!r} frame"
            )
        if certified is not None and claimed != certified:
            raise ProtocolError(f"a peer certified as {certified!r} greeted as {claimed!r}")
        role_of(claimed)
        if frame.meta.get("version") != VERSION:
            raise ProtocolError(
                f"{claimed} speaks frame version {frame.meta.get('version')!r}, {self.name} speaks {VERSION}"
            )
        if frame.run != self.run:
            raise ProtocolError(f"{claimed} is in run {frame.run!r}, {self.name} in run {self.run!r}")
        if frame.receiver != self.name:
            raise ProtocolError(f"{claimed} greeted {frame.receiver!r}, but this is {self.name!r}")
        return claimed

    def _greet(self, peer: str) -> None:
        with self._cond:
            self._greeted.add(peer)
            self._cond.notify_all()

    # ----------------------------------------------------------------- reading

    def _count_in(self, peer: str, nbytes: int) -> None:
        w = self.wire[peer]
        w.frames_received += 1
        w.bytes_received += nbytes

    def _read(self, link: _Link, frames: Iterator[bytes]) -> None:
        try:
            self._read_frames(link, frames)
        finally:
            link.finished.set()

    def _read_frames(self, link: _Link, frames: Iterator[bytes]) -> None:
        peer = link.peer
        try:
            for data in frames:
                self._count_in(peer, len(data))
                for piece in split(data, max_bytes=self.options.max_frame_bytes):
                    with self._cond:
                        if peer in self._said_bye or self._closed:
                            break
                    self._on_frame(link, decode(piece, max_bytes=self.options.max_frame_bytes))
        except ProtocolError as exc:
            self._refuse(link, exc)
            return
        except grpc.RpcError as exc:
            details = exc.details() if hasattr(exc, "details") else str(exc)  # type: ignore[attr-defined]
            code = exc.code() if hasattr(exc, "code") else None  # type: ignore[attr-defined]
            too_large = _TOO_LARGE.search(details or "")
            if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                self._fail(ProtocolError(f"{peer} refused the link from {self.name}: {details}"))
            elif too_large and too_large.group(1) == "CLIENT":  # gRPC refused a frame the peer sent to this party
                why = (
                    f"{peer} sent a frame of {too_large.group(2)} bytes, which exceeds the limit of "
                    f"{too_large.group(3)} bytes"
                )
                log.error("party %s refused a frame from %s: %s", self.name, peer, why)
                self._fail(ProtocolError(f"{self.name} refused a frame from {peer}: {why}"))
            elif too_large:  # the peer's gRPC refused a frame of this party's
                self._lost(
                    peer,
                    f"{peer} refused a frame of {too_large.group(2)} bytes from {self.name}, which "
                    f"exceeds its limit of {too_large.group(3)} bytes",
                )
            elif code is None and not details:  # a listener's stream that ended without a status
                self._lost(peer, self._closed_without_goodbye(peer))
            else:
                self._lost(
                    peer,
                    f"the connection to {peer} broke ({getattr(code, 'name', 'no status')}: {details or 'no detail'})",
                )
            return
        except Exception as exc:  # a bug here must not leave the party's thread waiting forever
            log.exception("party %s: reading from %s failed", self.name, peer)
            self._fail(NetError(f"{self.name}: reading from {peer} failed: {type(exc).__name__}: {exc}"))
            return
        self._lost(peer, self._closed_without_goodbye(peer))

    def _closed_without_goodbye(self, peer: str) -> str:
        return (
            f"{peer} closed the connection without a goodbye (its process ended or was killed, the network "
            f"dropped, or it sent a frame larger than the limit of {self.options.max_frame_bytes} bytes)"
        )

    def _lost(self, peer: str, why: str) -> None:
        with self._cond:
            if peer in self._said_bye or self._closed:
                return
            link = self._links.get(peer)
        if link is not None:
            link.outbox.put(None)
        epoch, step = self._peer_position[peer]
        self._fail(
            PeerFailed(
                f"{peer} failed{_at(epoch, step)}: {why} (noticed by {self.name})",
                party=peer,
                epoch=epoch,
                step=step,
                reason=why,
            )
        )

    def _refuse(self, link: _Link, exc: ProtocolError) -> None:
        log.error("party %s refused a frame from %s: %s", self.name, link.peer, exc)
        epoch, step = self._position
        self._put(
            link,
            Frame(
                "abort",
                receiver=link.peer,
                run=self.run,
                meta={
                    "origin": self.name,
                    "epoch": epoch,
                    "step": step,
                    "reason": f"refused a frame from {link.peer}: {exc}",
                },
            ),
        )
        link.outbox.put(None)
        self._fail(ProtocolError(f"{self.name} refused a frame from {link.peer}: {exc}"))

    def refuse(self, peer: str, why: str) -> ProtocolError:
        """Log that this party refuses what ``peer`` sent (``why`` names it) and return the :class:`ProtocolError`
        to raise: the party's thread raising it ends the run, and its abort tells the peers why."""
        log.error("party %s refused what %s sent: %s", self.name, peer, why)
        return ProtocolError(f"{self.name} refused what {peer} sent: {why}")

    def _fail(self, error: NetError) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = error
            self._cond.notify_all()

    def _on_frame(self, link: _Link, frame: Frame) -> None:
        peer = link.peer
        if frame.run != self.run:
            raise ProtocolError(f"frame of run {frame.run!r} on a link of run {self.run!r}")
        if frame.type == "hello":
            self._check_hello(frame, None)
            if frame.meta.get("party") != peer:
                raise ProtocolError(f"{self.name} dialled {peer} but was greeted by {frame.meta.get('party')!r}")
            self._greet(peer)
            return
        with self._cond:
            if peer not in self._greeted:
                raise ProtocolError(f"{peer} sent a {frame.type!r} frame before its greeting")
        if frame.type == "ready":
            if peer not in self.dials:
                raise ProtocolError(f"{peer} dialled {self.name}, so only {self.name} reports the links ready")
            with self._cond:
                self._ready.add(peer)
                self._cond.notify_all()
            return
        if frame.type == "bye":
            with self._cond:
                self._said_bye.add(peer)
                self._cond.notify_all()
            return
        if frame.type == "abort":
            # the failure is the authenticated peer's; whom it names as the first to fail is its claim
            claimed = frame.meta.get("origin")
            origin = claimed if isinstance(claimed, str) and claimed else peer
            epoch, step = (v if isinstance(v, int) else -1 for v in (frame.meta.get("epoch"), frame.meta.get("step")))
            reason = str(frame.meta.get("reason", ""))
            what = f"{peer} failed" if origin == peer else f"{peer} reports that {origin} failed"
            with self._cond:
                self._said_bye.add(peer)
            link.outbox.put(None)
            self._fail(
                PeerFailed(
                    f"{what}{_at(epoch, step)}: {reason} (noticed by {self.name})",
                    party=peer,
                    origin=origin,
                    epoch=epoch,
                    step=step,
                    reason=reason,
                )
            )
            return
        if frame.receiver != self.name:
            raise ProtocolError(
                f"{peer} addressed a {frame.kind!r} frame to {frame.receiver!r} on its link to {self.name}"
            )
        self.policy.check(frame.kind, peer, self.name, frame.role)
        message = _placed(frame.message(peer), self.options.device)
        if message.step >= 0:
            self._peer_position[peer] = (message.epoch, message.step)
        with self._cond:
            if frame.role == "reply":
                request = self._pending.pop((peer, frame.call), None)
                if request is None:
                    raise ProtocolError(
                        f"{peer} replied to call {frame.call} ({frame.kind!r}), which {self.name} "
                        "did not make or already has an answer to"
                    )
                asked = (request.kind, request.phase, request.epoch, request.step)
                if (message.kind, message.phase, message.epoch, message.step) != asked:
                    raise ProtocolError(
                        f"{peer} answered call {frame.call} ({request.kind!r}, {request.phase} epoch "
                        f"{request.epoch} step {request.step}) with a {message.kind!r} reply for "
                        f"{message.phase} epoch {message.epoch} step {message.step}"
                    )
                self._replies[(peer, frame.call)] = message
            elif frame.role == "request":
                self._requests.append((message, frame.call))
            else:
                self._mailbox[(peer, frame.kind)].append(message)
            self._cond.notify_all()

    # ----------------------------------------------------------------- waiting

    def _wait(self, ready: Callable[[], T | None], *, what: str, peer: str | None, timeout: float | None = -1.0) -> T:
        """Wait for ``ready()`` to give a value, answering peers' requests meanwhile."""
        self._flush()
        limit = self.options.receive_timeout if timeout == -1.0 else timeout
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            with self._cond:
                while True:
                    if self._failure is not None:
                        raise self._failure
                    value = ready()
                    if value is not None:
                        return value
                    if self._requests:
                        request, call = self._requests.popleft()
                        break
                    if peer is not None and peer in self._said_bye:
                        raise PeerFailed(
                            f"{peer} closed its link while {self.name} waited for {what}", party=peer, reason="closed"
                        )
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        who = peer or "any peer"
                        epoch, step = self._position
                        raise PeerFailed(
                            f"{who} sent nothing for {limit:g} s while {self.name} waited for {what}{_at(epoch, step)}",
                            party=who,
                            epoch=epoch,
                            step=step,
                            reason="timeout",
                        )
                    self._cond.wait(remaining)
            self._answer(request, call)
            self._flush()
            deadline = None if limit is None else time.monotonic() + limit

    def _answer(self, request: Message, call: int) -> None:
        self._consume(request)
        namespace = request.kind.split(".", 1)[0]
        handler = self._handlers.get(namespace)
        if handler is None:
            raise self.refuse(
                request.sender,
                f"{request.sender} sent a {request.kind!r} request, but {self.name} "
                f"serves no {namespace!r} requests in this run (it serves: "
                f"{', '.join(sorted(self._handlers)) or 'none'})",
            )
        try:
            reply = handler(request)
        except ProtocolError as exc:
            if exc is self._failure:  # a failure of this party's links while the handler waited: not the request's
                raise
            raise self.refuse(request.sender, str(exc)) from None  # the handler's own check of the request
        except _MALFORMED as exc:
            log.debug(
                "party %s: the %r handler failed on %s's request",
                self.name,
                request.kind,
                request.sender,
                exc_info=True,
            )
            raise self.refuse(
                request.sender,
                f"{self.name} could not answer {request.sender}'s {request.kind!r} "
                f"request{_at(request.epoch, request.step)}: {type(exc).__name__}: "
                f"{exc}",
            ) from None
        if reply.role != "reply" or reply.receiver != request.sender or reply.kind != request.kind:
            raise NetError(f"the {request.kind!r} handler of {self.name!r} did not answer its request")
        self._transmit(reply, call)

    def _consume(self, message: Message) -> Message:
        if message.step >= 0:
            self._position = (message.epoch, message.step)
        self.stats[message.phase].count(message)
        self._transcripts[self.name].record(message)
        return message

    # ----------------------------------------------------------------- sending

    def _put(self, link: _Link, frame: Frame, *, hold: bool = False) -> None:
        """Send ``frame`` on ``link`` with the one-way messages held there; ``hold``: a one-way message, which waits
        for the next frame (see the module doc)."""
        data = encode(frame)
        limit = self.options.max_frame_bytes
        if len(data) > limit:
            raise NetError(
                f"{self.name} cannot send a {frame.kind or frame.type!r} frame of {len(data)} bytes to "
                f"{link.peer}: it exceeds the limit of {limit} bytes"
            )
        with self._cond:  # the party's thread and a server thread may both send (a greeting, a refusal)
            held = link.held
            fits = len(held) < MAX_BUNDLE and 16 + 4 * MAX_BUNDLE + sum(map(len, held)) + len(data) <= limit
            if not fits and held:
                self._ship(link, held)
                held = []
            link.held = [] if not hold else [*held, data]
            if not hold:
                self._ship(link, [*held, data])

    def _ship(self, link: _Link, frames: list[bytes]) -> None:
        """Hand ``frames`` to gRPC as one unit (a bundle of several); under the lock, so that units keep their order."""
        data = encode_bundle(frames)
        w = self.wire[link.peer]
        w.frames_sent += 1
        w.bytes_sent += len(data)
        link.outbox.put((data, time.monotonic()))

    def _flush(self) -> None:
        """Send every one-way message still held (this party is about to wait)."""
        with self._cond:
            for link in self._links.values():
                if link.held:
                    self._ship(link, link.held)
                    link.held = []

    def _transmit(self, message: Message, call: int = 0, *, hold: bool = False) -> Message:
        if message.sender != self.name:
            raise ValueError(f"party {self.name!r} cannot send a message as {message.sender!r}")
        with self._cond:
            if self._failure is not None:
                raise self._failure
            link = self._links.get(message.receiver)
        if link is None or message.receiver not in self._greeted:
            raise NetError(
                f"party {self.name!r} has no link to {message.receiver!r} (its links: "
                f"{', '.join(self.peers) or 'none'}); was the channel started?"
            )
        self.policy.check(message.kind, self.name, message.receiver, message.role)
        self._put(link, Frame.of(message, run=self.run, call=call), hold=hold)
        return self._consume(message)

    # ----------------------------------------------------------------- the channel interface

    @property
    def train(self) -> CommStats:
        """Traffic of the training phase that this party sent or received."""
        return self.stats["train"]

    @property
    def eval(self) -> CommStats:
        """Traffic of evaluation that this party sent or received."""
        return self.stats["eval"]

    def register(self, transcript: Transcript) -> None:
        """Attach this party's transcript (a network channel carries one party only)."""
        if transcript.owner != self.name:
            raise ValueError(f"the channel of party {self.name!r} cannot carry party {transcript.owner!r}")
        self._transcripts[self.name] = transcript

    def transcript(self, owner: str) -> Transcript:
        """This party's transcript."""
        if owner != self.name:
            raise ValueError(f"the channel of party {self.name!r} holds no transcript of {owner!r}")
        return self._transcripts[owner]

    def endpoint(self, owner: str) -> Endpoint:
        """This party's connection: the in-process :class:`Endpoint`, talking through this channel."""
        if owner != self.name:
            raise ValueError(f"the channel of party {self.name!r} has no endpoint for {owner!r}")
        return Endpoint(self, owner)

    def send(self, message: Message) -> Message:
        """Send a one-way message (the loop's embeddings and cut gradients); returns it, as the in-process channel
        does. The receiver picks it up with :meth:`receive`."""
        return self._transmit(message)

    def receive(self, kind: str, sender: str, *, epoch: int, step: int, phase: str = "train") -> Message:
        """The next one-way ``kind`` message from ``sender``, which must be for ``epoch``, ``step`` and ``phase``
        (messages are matched by these keys, not by arrival order alone)."""
        message = self._wait(lambda: self._pop(sender, kind), what=f"{kind!r} from {sender}", peer=sender)
        if (message.epoch, message.step, message.phase) != (epoch, step, phase):
            raise ProtocolError(
                f"{sender} sent {kind!r} for {message.phase} epoch {message.epoch} step "
                f"{message.step} when {self.name} expected {phase} epoch {epoch} step {step}"
            )
        return self._consume(message)

    def _pop(self, sender: str, kind: str) -> Message | None:
        box = self._mailbox.get((sender, kind))
        return box.popleft() if box else None

    def call(self, request: Message) -> Message:
        """Send ``request`` and wait for its reply, answering peers' requests meanwhile (requests nest)."""
        return self.answer(self.ask(request))

    def ask(self, request: Message) -> Asked:
        """Send ``request``; its reply is kept when it arrives, for :meth:`answer`."""
        call = next(self._calls)
        key = (request.receiver, call)
        with self._cond:
            self._pending[key] = request
        self._transmit(request, call)
        return Asked(request, key)

    def answer(self, asked: Asked) -> Message:
        """The reply to a request :meth:`ask` sent, waiting for it (answering peers' requests meanwhile)."""
        if asked.reply is None and not asked.answered:
            key = asked.key
            if key is None:
                raise ValueError(f"the {asked.request.kind!r} request was not asked through this channel")
            asked.reply = self._wait(
                lambda: self._replies.pop(key, None),
                what=f"the reply to {asked.request.kind!r}",
                peer=asked.request.receiver,
            )
        return self._consume(take_answer(asked))

    def serve(self, owner: str, namespace: str, handler: Handler) -> None:
        """Answer requests of kinds ``<namespace>.*`` that peers send this party with ``handler``."""
        if owner != self.name:
            raise ValueError(f"the channel of party {self.name!r} cannot serve for {owner!r}")
        if namespace in self._handlers:
            raise ValueError(f"party {owner!r} already serves {namespace!r} requests")
        self._handlers[namespace] = handler

    def post(self, message: Message) -> None:
        """Send a one-way message into the receiver's mailbox (it picks it up with :meth:`take`). It travels with the
        next frame this party sends to the receiver, at the latest when this party waits or closes (module doc)."""
        self._transmit(message, hold=True)

    def take(self, owner: str, sender: str, kind: str) -> Message:
        """The oldest ``kind`` message from ``sender`` (waiting for it, answering requests meanwhile)."""
        if owner != self.name:
            raise ValueError(f"the channel of party {self.name!r} holds no mailbox of {owner!r}")
        return self._consume(self._wait(lambda: self._pop(sender, kind), what=f"{kind!r} from {sender}", peer=sender))

    def serve_forever(self, *, timeout: float | None = -1.0) -> None:
        """Answer requests until every peer has said goodbye (the dealer's loop). ``timeout``: the longest time
        without a request (``receive_timeout`` by default; ``None``: no limit, keepalive still detects dead
        peers)."""
        self._wait(
            lambda: True if set(self.peers) <= self._said_bye else None, what="requests", peer=None, timeout=timeout
        )

    # ----------------------------------------------------------------- ending

    def close(self) -> None:
        """Say goodbye to every peer, wait up to ``close_timeout`` for theirs, and take the links down."""
        if self._closed:
            return
        with self._cond:
            links = list(self._links.values())
        for link in links:
            self._put(link, Frame("bye", receiver=link.peer, run=self.run))
            link.outbox.put(None)
        deadline = time.monotonic() + self.options.close_timeout
        with self._cond:
            while not set(self._greeted) <= self._said_bye and self._failure is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.info(
                        "party %s closed before %s said goodbye",
                        self.name,
                        ", ".join(sorted(set(self._greeted) - self._said_bye)),
                    )
                    break
                self._cond.wait(remaining)
        self._teardown(links, deadline)

    def abort(self, reason: str) -> None:
        """Tell every peer this party failed (best effort), then take the links down."""
        if self._closed:
            return
        origin, epoch, step = self.name, *self._position
        said = reason
        if isinstance(self._failure, PeerFailed):  # pass on the first failure, not this party's report of it
            failure = self._failure
            origin, epoch, step, reason = failure.origin, failure.epoch, failure.step, failure.reason
            said = str(failure)
        log.error("party %s aborts: %s", self.name, said)
        with self._cond:
            links = list(self._links.values())
        for link in links:
            self._put(
                link,
                Frame(
                    "abort",
                    receiver=link.peer,
                    run=self.run,
                    meta={"origin": origin, "epoch": epoch, "step": step, "reason": reason[:4000]},
                ),
            )
            link.outbox.put(None)
        self._teardown(links, time.monotonic() + min(1.0, self.options.close_timeout))

    def _teardown(self, links: list[_Link], deadline: float) -> None:
        for link in links:
            link.drained.wait(max(0.0, deadline - time.monotonic()))
            link.finished.wait(max(0.0, deadline - time.monotonic()))
            if link.call is not None:  # a dialled link: the listener ends the call once it has read the last frame
                ended = threading.Event()
                link.call.add_done_callback(lambda _, ended=ended: ended.set())
                ended.wait(max(0.0, deadline - time.monotonic()))
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for link in links:
            if link.call is not None:
                link.call.cancel()
            if link.grpc_channel is not None:
                link.grpc_channel.close()
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2.0)


def _at(epoch: int, step: int) -> str:
    return f" at epoch {epoch} step {step}" if step >= 0 else ""
