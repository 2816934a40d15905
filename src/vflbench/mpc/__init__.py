"""Two-party additive secret sharing over Z_2^64 for VMask's masked layers.

Simulated in one process, with each party's state in separate objects and every value that
crosses between the parties counted (:class:`Comm`). See ``../shared/research/systems.md`` section 3
and ``../shared/DESIGN.md`` ("VMask and secret sharing").

* :mod:`~vflbench.mpc.ring`: fixed-point encoding, ring matmul and convolution (im2col).
* :mod:`~vflbench.mpc.shares`: ``share`` / ``reconstruct``.
* :mod:`~vflbench.mpc.dealer`: the trusted third party issuing single-use Beaver triples.
* :mod:`~vflbench.mpc.comm`: communication accounting.
* :mod:`~vflbench.mpc.protocol`: Beaver multiplication, SecureML truncation.
* :mod:`~vflbench.mpc.layers`: ``SharedLinear`` / ``SharedConv2d``, ``mask_layer`` / ``unmask``.
"""

from vflbench.mpc.comm import Comm
from vflbench.mpc.dealer import Dealer, TripleReuseError, TripleShare
from vflbench.mpc.layers import (
    ActivePeer,
    ActiveShareHolder,
    PassiveShareHolder,
    SharedConv2d,
    SharedLayer,
    SharedLinear,
    mask_layer,
    mask_submodule,
    offset_parameters,
    oracle_effective_weight,
    passive_attacker_copy,
    shared_layers,
    step_shared_layers,
    unmask,
    unmask_submodule,
)
from vflbench.mpc.protocol import (
    beaver_conv2d,
    beaver_conv2d_input_grad,
    beaver_matmul,
    beaver_mul,
    truncate_share,
    truncation_failure_rate,
)
from vflbench.mpc.ring import DEFAULT_FRAC_BITS, RING_BITS, RingOverflowError, decode, encode
from vflbench.mpc.shares import reconstruct, share

__all__ = [
    "DEFAULT_FRAC_BITS",
    "RING_BITS",
    "ActivePeer",
    "ActiveShareHolder",
    "Comm",
    "Dealer",
    "PassiveShareHolder",
    "RingOverflowError",
    "SharedConv2d",
    "SharedLayer",
    "SharedLinear",
    "TripleReuseError",
    "TripleShare",
    "beaver_conv2d",
    "beaver_conv2d_input_grad",
    "beaver_matmul",
    "beaver_mul",
    "decode",
    "encode",
    "mask_layer",
    "mask_submodule",
    "offset_parameters",
    "oracle_effective_weight",
    "passive_attacker_copy",
    "reconstruct",
    "share",
    "shared_layers",
    "step_shared_layers",
    "truncate_share",
    "truncation_failure_rate",
    "unmask",
    "unmask_submodule",
]
