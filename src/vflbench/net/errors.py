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

    ``party``: the party that failed first (the origin of an abort that other parties passed on);
    ``epoch`` and ``step``: where that party was, when known (-1 otherwise); ``reason``: its words.
    """

    def __init__(self, message: str, *, party: str, epoch: int = -1, step: int = -1, reason: str = "") -> None:
        super().__init__(message)
        self.party = party
        self.epoch = epoch
        self.step = step
        self.reason = reason


class BarrierTimeout(NetError):
    """The start-up barrier's deadline passed before every peer connected and greeted."""
