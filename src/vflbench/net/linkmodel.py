"""A link model: the time a run would take on a given network, from its measured compute time and the frames
and bytes that crossed its links.

The parties' protocol is sequential (every message waits for the previous one: a passive party's embedding for
the active party's request, a cut gradient for the embedding, VMask's secure-layer exchanges one after another),
so each frame pays the link's one-way ``latency`` and its bytes pay the ``bandwidth``::

    projected = measured + frames x latency + 8 x bytes / bandwidth

``measured`` is the wall time on loopback, which already contains the loopback transfers (a small term on these
machines; see docs/performance.md). Frames sent in parallel to several passive parties would overlap on a real
network, so for more than one passive party this is an upper bound.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from vflbench.errors import ConfigError


@dataclass(frozen=True)
class LinkProfile:
    """A network: ``bandwidth_mbit_s`` (Mbit/s, 10^6 bit/s) and one-way ``latency_ms`` (ms) per frame."""

    bandwidth_mbit_s: float
    latency_ms: float
    source: str = ""

    def as_dict(self) -> dict[str, float | str]:
        """Plain values for net.json."""
        return asdict(self)


#: The networks ``vflbench launch`` projects onto: the VMask paper's LAN (Tan et al., NDSS 2025, §VI: two servers
#: on 836 Mbit/s Ethernet; the paper gives no latency, 0.1 ms one-way is a typical switched LAN) and a WAN of
#: 100 Mbit/s with 50 ms one-way delay (the issue's profile).
LINK_PROFILES: dict[str, LinkProfile] = {
    "lan_836mbit": LinkProfile(
        836.0, 0.1, "VMask (NDSS 2025) Table III's testbed: 836 Mbit/s Ethernet; latency assumed 0.1 ms"
    ),
    "wan_100mbit_50ms": LinkProfile(100.0, 50.0, "100 Mbit/s, 50 ms one-way"),
}


def project(seconds: float, frames: int, nbytes: int, profile: LinkProfile) -> float:
    """Projected seconds on ``profile`` of work measured at ``seconds`` that sent ``frames`` frames of ``nbytes``
    bytes in all over its links (see the module docstring)."""
    return seconds + frames * profile.latency_ms / 1e3 + 8 * nbytes / (profile.bandwidth_mbit_s * 1e6)


#: Short names of :data:`LINK_PROFILES` for ``--shape``.
SHAPES = {"lan": "lan_836mbit", "wan": "wan_100mbit_50ms"}


def shape_profile(
    shape: str | None = None, *, bandwidth_mbit: float | None = None, latency_ms: float | None = None
) -> LinkProfile | None:
    """The link a traffic shaper enforces: a named profile (``lan``, ``wan`` or a key of :data:`LINK_PROFILES`), or
    ``bandwidth_mbit`` (Mbit/s) with ``latency_ms`` (one-way ms, default 0); ``None`` when nothing is asked."""
    if shape is not None and (bandwidth_mbit is not None or latency_ms is not None):
        raise ConfigError("give --shape or --bandwidth-mbit/--latency-ms, not both")
    if shape is not None:
        key = SHAPES.get(shape, shape)
        if key not in LINK_PROFILES:
            raise ConfigError(f"unknown link shape {shape!r}; valid: {', '.join([*SHAPES, *LINK_PROFILES])}")
        return LINK_PROFILES[key]
    if bandwidth_mbit is None and latency_ms is None:
        return None
    if bandwidth_mbit is None or bandwidth_mbit <= 0 or (latency_ms is not None and latency_ms < 0):
        raise ConfigError(
            f"a shaped link needs --bandwidth-mbit > 0 (and --latency-ms >= 0), got {bandwidth_mbit} "
            f"Mbit/s and {latency_ms} ms"
        )
    return LinkProfile(float(bandwidth_mbit), float(latency_ms or 0.0), "shaped by hand")
