"""Parties across processes and machines: frames, the protocol's policy, mutual-TLS provisioning and the gRPC
transport (needs the ``net`` extra: grpcio, msgpack, cryptography)."""

from vflbench.net.errors import BarrierTimeout, NetError, PeerFailed, ProtocolError
from vflbench.net.frames import Frame, decode, encode
from vflbench.net.policy import DEFAULT_RULES, SURFACE, Policy, Rule, role_of
from vflbench.net.provision import Credentials, provision
from vflbench.net.transport import NetChannel, NetOptions, WireStats

__all__ = [
    "BarrierTimeout",
    "Credentials",
    "DEFAULT_RULES",
    "Frame",
    "NetChannel",
    "NetError",
    "NetOptions",
    "PeerFailed",
    "Policy",
    "ProtocolError",
    "Rule",
    "SURFACE",
    "WireStats",
    "decode",
    "encode",
    "provision",
    "role_of",
]
