"""Two-party additive secret sharing over Z_2^64 for VMask's masked layers.

Simulated in one process, with each party's state in separate objects; in VMask the parties (and
the dealer) exchange only messages through the federation's channel, which counts them.
:class:`Comm` counts the standalone two-party simulations of :mod:`~vflbench.mpc.protocol`. See
``../shared/research/systems.md`` section 3 and ``../shared/DESIGN.md`` ("VMask and secret sharing").

* :mod:`~vflbench.mpc.ring`: fixed-point encoding, ring matmul and convolution (im2col).
* :mod:`~vflbench.mpc.shares`: ``share`` / ``reconstruct``.
* :mod:`~vflbench.mpc.dealer`: the trusted third party issuing single-use Beaver triples (and
  its service at the dealer's endpoint).
* :mod:`~vflbench.mpc.comm`: communication accounting.
* :mod:`~vflbench.mpc.protocol`: Beaver multiplication, SecureML truncation.
* :mod:`~vflbench.mpc.parties`: the two parties' state for a masked layer (P_k's
  ``PassiveShareHolder``, P_K's ``ActiveShares`` service) and the ``vmask.*`` messages between them.
* :mod:`~vflbench.mpc.layers`: ``SharedLinear`` / ``SharedConv2d`` (P_k's modules and autograd),
  ``mask_layer`` / ``unmask``.
* :mod:`~vflbench.mpc.observation`: what P_k's own code can observe of a masked layer.
* :mod:`~vflbench.mpc.masking`: the maskable layers of a bottom model (``make_maskable``,
  ``VMaskBottom``) that the VMask defense masks and unmasks.
"""

from vflbench.mpc.comm import Comm
from vflbench.mpc.dealer import Dealer, DealerService, TripleReuseError, TripleShare
from vflbench.mpc.layers import (
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
from vflbench.mpc.parties import ActivePeer, ActiveShareHolder, ActiveShares, PassiveShareHolder, local_session
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
    "ActiveShares",
    "Comm",
    "Dealer",
    "DealerService",
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
    "local_session",
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
