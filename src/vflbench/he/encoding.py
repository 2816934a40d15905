"""Fixed-point encoding of reals as Paillier plaintexts, and encrypted tensors with their scale.

A real ``x`` at scale ``s`` is the integer ``round(x 2^s)`` in ``Z_n`` (negatives as
``n - |x|``). A ciphertext-times-plaintext product adds the scales, which each
:class:`EncTensor` tracks; only the key holder can lower a scale (masked rescaling).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import Tensor

KAPPA = 40  #: statistical security bits of the rescaling masks
MAG = 32  #: bits of magnitude allowed for encrypted reals (|W|, |v|, |h| < 2^32)
ENCODE_BITS = 64  #: floats are rounded at 2^-64 before being shifted to larger scales (exact for float64)


def encode(x: np.ndarray | Tensor, bits: int) -> np.ndarray:
    """``round(x 2^bits)`` as Python integers (an object array of ``x``'s shape)."""
    arr = x.detach().double().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x, dtype=np.float64)
    if not np.isfinite(arr).all():
        raise FloatingPointError("paillier_he cannot encode non-finite values (training diverged?)")
    b0 = min(bits, ENCODE_BITS)
    shift = bits - b0
    flat = [int(v) << shift for v in np.rint(arr * 2.0**b0).ravel().tolist()]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(arr.shape)


def signed(v: int, n: int) -> int:
    """A plaintext in ``[0, n)`` read as a signed integer (``n - |x|`` is ``-|x|``)."""
    return v - n if v > n // 2 else v


@dataclass
class EncTensor:
    """Ciphertexts of reals at a fixed-point ``scale`` (``value = plaintext / 2^scale``)."""

    cts: np.ndarray
    scale: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the encrypted tensor."""
        return tuple(self.cts.shape)
