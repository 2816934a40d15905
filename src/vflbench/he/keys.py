"""Paillier keys from python-paillier (``phe``), imported lazily, and the public key's wire format.

The key pair is phe's (``generate_paillier_keypair``: ``g = n + 1``, primes from the operating
system's CSPRNG). Only the key holder (the active party) calls :func:`generate_keypair`; every
other party rebuilds the public key from ``n`` (:func:`public_key_from_wire`), which is all that
ever leaves the key holder.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from vflbench.errors import ConfigError

HE_EXTRA = (
    "paillier_he needs the optional 'he' extra (phe>=1.5, gmpy2>=2.1): "
    "pip install 'vflbench[he]'  (or: pip install phe gmpy2)"
)


def load_phe() -> Any:
    """``phe.paillier`` (a clear error names the extra when it is missing)."""
    try:
        from phe import paillier
    except ImportError as exc:
        raise ConfigError(HE_EXTRA) from exc
    return paillier


def has_gmpy2() -> bool:
    """Whether gmpy2 is installed (about 10x faster big-integer arithmetic; phe uses it too)."""
    try:
        import gmpy2  # noqa: F401
    except ImportError:  # pragma: no cover - phe works without it, only slower
        return False
    return True


def generate_keypair(key_bits: int) -> tuple[Any, Any, float]:
    """A fresh phe key pair of ``key_bits`` bits: ``(public, private, seconds it took)``."""
    paillier = load_phe()
    tic = time.perf_counter()
    public, private = paillier.generate_paillier_keypair(n_length=key_bits)
    return public, private, time.perf_counter() - tic


def public_key_to_wire(public: Any) -> Tensor:
    """The public key as the bytes that travel: ``n`` big-endian in a uint8 tensor."""
    n = int(public.n)
    return torch.frombuffer(bytearray(n.to_bytes((n.bit_length() + 7) // 8, "big")), dtype=torch.uint8)


def public_key_from_wire(wire: Tensor) -> Any:
    """phe's public key for the ``n`` that :func:`public_key_to_wire` sent."""
    if wire.dtype != torch.uint8 or wire.dim() != 1 or not len(wire):
        raise ValueError(
            f"expected a Paillier public key as uint8 bytes, got {wire.dtype} of shape {tuple(wire.shape)}"
        )
    return load_phe().PaillierPublicKey(int.from_bytes(wire.cpu().numpy().tobytes(), "big"))
