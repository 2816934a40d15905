"""The in-memory channel: delivers messages, keeps each party's transcript, counts traffic."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from vflbench.protocol.messages import ACTIVE, Message, MessageKind


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
class CommStats:
    """Traffic counted by the channel (``up`` = towards the active party)."""

    messages: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


class Channel:
    """Delivers messages between registered parties (in one process).

    The same party code would run over a network transport; only this class would change.
    """

    def __init__(self) -> None:
        self._transcripts: dict[str, Transcript] = {}
        self.train = CommStats()
        self.eval = CommStats()

    def register(self, transcript: Transcript) -> None:
        """Attach a party's transcript under its owner's name."""
        if transcript.owner in self._transcripts:
            raise ValueError(f"party {transcript.owner!r} is already registered")
        self._transcripts[transcript.owner] = transcript

    def send(self, message: Message) -> Message:
        """Deliver ``message``: count it and record it in both parties' transcripts."""
        stats = self.train if message.phase == "train" else self.eval
        stats.messages += 1
        if message.receiver == ACTIVE:
            stats.bytes_up += message.nbytes
        else:
            stats.bytes_down += message.nbytes
        self._transcripts[message.sender].record(message)
        self._transcripts[message.receiver].record(message)
        return message
