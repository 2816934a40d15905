"""The loop's messages: a passive party is a set of handlers, the active party reaches it only through its endpoint.

A passive party registers :class:`PassiveService` for the ``passive`` namespace on its own endpoint; the training
loop (:class:`~vflbench.protocol.federation.Federation`) holds one :class:`PassivePeer` per passive party, which
talks to that service through the active party's endpoint. The same two classes run over the in-memory transport
(every party in one process, synchronous dispatch) and over the gRPC transport (a party per process), so the loop
gives the same numbers on both.

One step, for passive party ``k``:

1. request ``passive.forward`` (the batch's row ids; ``meta``: split, train) -- the service computes the embedding
   and posts it to the active party as the one-way ``embedding`` message, then answers with an empty reply;
2. the active party takes ``embedding`` from its mailbox, steps, and posts the one-way ``cut_gradient`` (with the
   batch's ids) to ``k``;
3. request ``passive.backward`` -- the service takes ``cut_gradient`` from its mailbox, applies it and answers
   whether its defenses let the update through (``meta["applied"]``).

At the end of each epoch the request ``passive.end_epoch`` returns the party's report as JSON
(:func:`json_payload`). The ``passive.*`` requests drive the party (orchestration); the protocol's traffic that
``result.json`` reports is every other kind (:func:`protocol_kind`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from vflbench.protocol.channel import Endpoint
from vflbench.protocol.messages import Message, Phase
from vflbench.protocol.party import PassiveParty, Split

#: The namespace of the requests that drive a passive party (left out of the protocol's reported traffic).
ORCHESTRATION = "passive"


def protocol_kind(kind: str) -> bool:
    """Whether messages of ``kind`` are the protocol's own traffic (``result.json``'s ``comm``), not the requests
    that drive a passive party (``passive.*``)."""
    return not kind.startswith(f"{ORCHESTRATION}.")


def json_payload(value: Any) -> Tensor:
    """``value`` as JSON in a 1-d uint8 tensor (a report of any size; nothing is ever pickled)."""
    return torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8)


def from_json_payload(tensor: Tensor) -> Any:
    """The value :func:`json_payload` wrote (a peer in another process bounds it first: ``net.frames``)."""
    return json.loads(tensor.contiguous().cpu().numpy().tobytes().decode("utf-8"))


class PassiveService:
    """Passive party ``party``'s handlers for the loop's requests, served on its own ``endpoint`` (see the module
    docstring). A subclass adds requests (:meth:`handlers`) and checks what a peer sends."""

    def __init__(self, party: PassiveParty, endpoint: Endpoint) -> None:
        self.party = party
        self.endpoint = endpoint

    def serve(self) -> PassiveService:
        """Register this service for the ``passive`` namespace on the party's endpoint."""
        self.endpoint.serve(ORCHESTRATION, self)
        return self

    def handlers(self) -> Mapping[str, Callable[[Message], Message]]:
        """The requests this party answers, by kind."""
        return {"passive.forward": self.forward, "passive.backward": self.backward, "passive.end_epoch": self.end_epoch}

    def __call__(self, request: Message) -> Message:
        """Answer ``request`` with the handler of its kind."""
        handler = self.handlers().get(request.kind)
        if handler is None:
            raise self.unserved(request)
        return handler(request)

    def unserved(self, request: Message) -> Exception:
        """The error for a request kind this party does not answer."""
        return ValueError(f"{self.party.name} serves {', '.join(self.handlers())}, not {request.kind!r}")

    def embed(self, request: Message) -> Tensor:
        """The party's embedding of the requested rows (``meta``: split, train)."""
        split, train = request.meta.get("split"), request.meta.get("train")
        return self.party.forward(
            request.ids,
            epoch=request.epoch,
            step=request.step,
            split="test" if split == "test" else "train",
            train=bool(train),
        )

    def forward(self, request: Message) -> Message:
        """Post the embedding of the requested rows to the sender (:meth:`embed`); an empty reply."""
        out = self.embed(request)
        self.endpoint.post(
            "embedding",
            request.sender,
            out,
            ids=request.ids,
            epoch=request.epoch,
            step=request.step,
            phase=request.phase,
        )
        return request.reply()

    def gradient(self, request: Message) -> Message:
        """The ``cut_gradient`` message the sender posted before its ``passive.backward`` request."""
        return self.endpoint.take("cut_gradient", request.sender)

    def backward(self, request: Message) -> Message:
        """Apply the posted cut gradient; reply whether this party's defenses let the update through."""
        return request.reply(meta={"applied": self.party.backward(self.gradient(request).payload)})

    def report(self, epoch: int) -> dict[str, Any]:
        """What ``passive.end_epoch`` answers: the party's end-of-epoch report."""
        return {"report": self.party.end_epoch(epoch)}

    def end_epoch(self, request: Message) -> Message:
        """End the epoch at this party; reply with its report as JSON."""
        return request.reply(json_payload(self.report(request.epoch)))


class PassivePeer:
    """The active party's handle on passive party ``name``: the loop's exchanges with it, through the active party's
    ``endpoint`` only (the party may be in this process or in another). ``bottom``: the evaluation-only access to
    its bottom model a run may grant the scorer (``None``: none)."""

    bottom: nn.Module | None = None

    def __init__(self, name: str, endpoint: Endpoint) -> None:
        self.name = name
        self.endpoint = endpoint

    def forward(self, ids: Tensor, *, epoch: int, step: int, split: Split = "train", train: bool = True) -> Tensor:
        """The party's embedding of rows ``ids`` (phase ``train`` when ``train``, else ``eval``)."""
        phase: Phase = "train" if train else "eval"
        reply = self.endpoint.call(
            "passive.forward",
            self.name,
            ids=ids,
            epoch=epoch,
            step=step,
            phase=phase,
            meta={"split": split, "train": train},
        )
        return self.embedding(reply, self.endpoint.take("embedding", self.name), ids)

    def embedding(self, reply: Message, message: Message, ids: Tensor) -> Tensor:
        """The embedding ``message`` posted in answer to a ``passive.forward`` (a subclass checks it)."""
        return message.payload

    def backward(self, gradient: Tensor, *, ids: Tensor, epoch: int, step: int) -> bool:
        """Post the cut gradient of rows ``ids`` and have the party apply it; ``False`` if its defenses refused."""
        self.endpoint.post("cut_gradient", self.name, gradient, ids=ids, epoch=epoch, step=step, phase="train")
        return self.applied(self.endpoint.call("passive.backward", self.name, epoch=epoch, step=step))

    def applied(self, reply: Message) -> bool:
        """Whether the party applied the update, as its ``passive.backward`` reply says (a subclass checks it)."""
        return bool(reply.meta.get("applied"))

    def end_epoch(self, epoch: int) -> dict[str, object]:
        """The party's end-of-epoch report."""
        return self.report(self.endpoint.call("passive.end_epoch", self.name, epoch=epoch).payload, epoch)

    def report(self, payload: Tensor, epoch: int) -> dict[str, object]:
        """The report in a ``passive.end_epoch`` reply (a subclass bounds and checks it)."""
        return dict(from_json_payload(payload)["report"])
