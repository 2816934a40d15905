"""Errors of the network transport.

Every error names the party it concerns: a frame a peer sent that the protocol does not allow
(:class:`ProtocolError`), a peer that failed, aborted or went silent (:class:`PeerFailed`), or a
start-up barrier that a peer did not reach in time (:class:`BarrierTimeout`).
"""

from __future__ import annotations


class NetError(Exception):
    """A failure of the transport between parties."""


class ProtocolError(NetError):
    """Bytes or a message from a peer that the protocol does not allow; the frame was refused unread."""


class PeerFailed(NetError):
    """A peer failed, aborted, closed its link or stopped answering.

    ``party``: the peer whose link carried the failure (the authenticated peer, never a name taken from a
    frame); ``origin``: the party that failed first as that peer reports it (``party`` itself, or the party whose
    abort it passed on: a claim, not verified); ``epoch`` and ``step``: where the failure happened as reported
    (-1 when unknown); ``reason``: its words.
    """

    def __init__(
        self, message: str, *, party: str, epoch: int = -1, step: int = -1, reason: str = "", origin: str | None = None
    ) -> None:
        super().__init__(message)
        self.party = party
        self.origin = party if origin is None else origin
        self.epoch = epoch
        self.step = step
        self.reason = reason


class BarrierTimeout(NetError):
    """The start-up barrier's deadline passed before every peer connected and greeted."""
