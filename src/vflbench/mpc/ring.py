"""Fixed-point arithmetic over the ring Z_2^64, stored in ``torch.int64``.

A real number ``x`` is encoded as ``round(x * 2^f)`` (``f`` fractional bits, 16 by default as in
CrypTen) and read as a two's-complement element of Z_2^64. Ring addition, negation,
multiplication and matrix multiplication are the int64 ones: torch wraps int64 overflow modulo
2^64 (checked in ``tests/mpc``), so no explicit ``mod`` is ever taken.

The product of two encodings carries ``2f`` fractional bits and must be truncated by ``2^f``
(see :mod:`vflbench.mpc.protocol`); before truncation ``|x * y|`` must stay below
``2^(63 - 2f)`` (2^31 for ``f = 16``).

torch has no int64 convolution or ``F.unfold`` (im2col) on CPU, so :func:`ring_conv2d` and
:func:`ring_conv2d_input_grad` are built from ``Tensor.unfold`` views (im2col, one strided copy),
an int64 matmul and an ``index_add_`` (col2im). CUDA has no int64 matmul either (``"addmm_cuda" not
implemented for 'Long'``) nor an int64 convolution; :func:`ring_matmul` then splits both operands into
four 16-bit limbs and multiplies them exactly in float64 (:func:`limb_matmul`, CrypTen's approach), and
the convolutions, built on :func:`ring_matmul`, follow. On CPU that is slower than torch's int64 matmul
(vectorized; ~16 G multiply-adds/s on one AVX-512 core for a 128x392x256 product, vs ~20 G for float64,
which would need 10 limb products), so the CPU path stays int64. Every other ring operation (add, sub,
elementwise mul, shifts, ``index_add_``, padding, ``unfold``) exists for int64 on CUDA, wraps modulo
2^64 there as on the CPU, and is used as is.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import torch
from torch import Tensor

from vflbench.errors import VFLBenchError

RING_BITS = 64
"""Bit width of the ring: shares and encodings are elements of Z_2^64 (``torch.int64``)."""

DEFAULT_FRAC_BITS = 16
"""Default number of fractional bits of the fixed-point encoding (CrypTen's default)."""

_LIMB_BITS = 16
_LIMB_MASK = (1 << _LIMB_BITS) - 1
_LIMBS = RING_BITS // _LIMB_BITS
LIMB_MAX_INNER = 1 << (53 - 2 * _LIMB_BITS)
"""The longest inner dimension one float64 limb product sums exactly (2^21; see :func:`limb_matmul`); longer
ones are summed in chunks of this length."""

MatmulMethod = Literal["auto", "int64", "limbs"]
"""How :func:`ring_matmul` multiplies: ``int64`` (torch's int64 matmul, CPU only), ``limbs`` (:func:`limb_matmul`,
any device) or ``auto`` (int64 on the CPU, limbs elsewhere)."""


class RingOverflowError(VFLBenchError, OverflowError):
    """A value does not fit the fixed-point range of the ring.

    In training this means the secret-shared computation diverged (the plaintext run would show
    inf/NaN) or its inputs are far outside the fixed-point range: lower the learning rate, scale
    the features, or give the masked layers more integer bits (fewer ``frac_bits``).
    """


def max_abs(frac_bits: int = DEFAULT_FRAC_BITS) -> float:
    """The largest magnitude :func:`encode` accepts: ``2^(63 - f)`` (exclusive)."""
    return float(2 ** (RING_BITS - 1 - frac_bits))


def encode(x: Tensor, frac_bits: int = DEFAULT_FRAC_BITS) -> Tensor:
    """Encode a float tensor as fixed point in Z_2^64: ``round(x * 2^frac_bits)`` as int64.

    Rounds to nearest (ties to even), computed in float64 so that float32 inputs are scaled
    exactly. Raises :class:`RingOverflowError` for non-finite values or ``|x| >= 2^(63 - f)``.
    """
    if not 0 <= frac_bits < RING_BITS - 1:
        raise ValueError(f"frac_bits must be in [0, {RING_BITS - 2}], got {frac_bits}")
    if x.dtype == torch.int64:
        raise TypeError("encode expects a floating-point tensor; int64 tensors are already ring elements")
    xd = x.detach().to(torch.float64)
    if xd.numel():
        # one reduction checks both: max(|x|) is nan if any entry is nan and inf if any is infinite
        biggest = float(xd.abs().max())
        if not math.isfinite(biggest):
            raise RingOverflowError("cannot encode non-finite values (nan/inf) in the fixed-point ring")
        limit = max_abs(frac_bits)
        if biggest >= limit:
            raise RingOverflowError(
                f"value of magnitude {biggest:.4g} does not fit the ring Z_2^{RING_BITS} with {frac_bits} "
                f"fractional bits (|x| must be < 2^{RING_BITS - 1 - frac_bits} = {limit:.4g})"
            )
    return torch.round(xd * float(2**frac_bits)).to(torch.int64)


def decode(v: Tensor, frac_bits: int = DEFAULT_FRAC_BITS, *, dtype: torch.dtype = torch.float64) -> Tensor:
    """Decode int64 ring elements (two's complement) with ``frac_bits`` fractional bits to floats.

    Exact in float64 up to magnitude ``2^(53 - f)``; larger values (e.g. a single random share)
    are rounded to the nearest float64.
    """
    if v.dtype != torch.int64:
        raise TypeError(f"decode expects an int64 ring tensor, got {v.dtype}")
    return (v.to(torch.float64) / float(2**frac_bits)).to(dtype)


def uniform(
    shape: torch.Size | tuple[int, ...], generator: torch.Generator, *, device: torch.device | str | None = None
) -> Tensor:
    """Uniformly random elements of Z_2^64 drawn from ``generator``.

    ``random_(-2^63, None)`` on an int64 tensor is torch's full-64-bit-range draw: each element is
    one 64-bit output of the generator reinterpreted as int64, so all 2^64 values are exactly
    equally likely (``torch.randint`` over ``[-2^63, 2^63 - 1)`` reduces modulo ``2^64 - 1`` instead,
    and is ~13% slower). Draws on the generator's device (the CPU: every generator of a run is a CPU
    generator, so that draws are the same on every device), then moves to ``device``.
    """
    out = torch.empty(tuple(shape), dtype=torch.int64, device=generator.device)
    out.random_(-(2**63), None, generator=generator)
    return out if device is None else out.to(device)


def shift_right(v: Tensor, bits: int) -> Tensor:
    """Arithmetic (sign-extending) right shift: ``floor(v / 2^bits)`` for int64 ``v``."""
    return v >> bits if bits else v


def _limbs(v: Tensor) -> list[Tensor]:
    """The four unsigned 16-bit limbs of ``v``'s two's-complement bits, as float64 (``v = sum_i limb_i 2^16i``
    mod 2^64; ``>>`` is arithmetic, and the mask keeps exactly bits 16i..16i+15)."""
    return [((v >> (_LIMB_BITS * i)) & _LIMB_MASK).to(torch.float64) for i in range(_LIMBS)]


def limb_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` in Z_2^64 from 16-bit limbs multiplied in float64: equal to the int64 product bit for bit.

    Why it is exact. Write each operand as ``x = sum_i x_i 2^(16 i)`` (mod 2^64) with limbs
    ``0 <= x_i <= 2^16 - 1``. Then ``a @ b = sum_{i,j} 2^(16 (i+j)) (a_i @ b_j)`` mod 2^64, and every term
    with ``i + j >= 4`` is a multiple of 2^64: the 10 limb products with ``i + j <= 3`` suffice. One entry of
    ``a_i @ b_j`` is a sum of ``k`` (the inner dimension) products, each at most ``(2^16 - 1)^2 < 2^32``, so
    the sum, and every partial sum whatever order or blocking a BLAS or cuBLAS kernel uses, is an integer
    below ``k 2^32 <= 2^53`` for ``k <= 2^21`` (:data:`LIMB_MAX_INNER`). Integers below 2^53 are float64
    numbers, so every addition and fused multiply-add returns its exact result (IEEE 754 rounds a
    representable result to itself): the float64 product is the exact integer, its conversion to int64 is
    exact, and the shifts and sums that combine the terms wrap modulo 2^64 like every int64 ring
    operation. A longer inner dimension is cut into chunks of at most 2^21, each exact, summed in the ring.

    The 10 products are made as 4: limb ``i`` of ``a`` against limbs ``0..3-i`` of ``b`` side by side. This is
    the CUDA path of :func:`ring_matmul` (CUDA has no int64 matmul); the CPU keeps the int64 product, which
    is as fast there, and the tests compare the two on the CPU. Batched operands (``(..., m, k) @ (..., k, n)``)
    are allowed.
    """
    if a.dtype != torch.int64 or b.dtype != torch.int64:
        raise TypeError("limb_matmul expects int64 tensors")
    k = a.shape[-1]
    if k > LIMB_MAX_INNER:
        out = limb_matmul(a[..., :LIMB_MAX_INNER], b[..., :LIMB_MAX_INNER, :])
        for start in range(LIMB_MAX_INNER, k, LIMB_MAX_INNER):
            out += limb_matmul(a[..., start : start + LIMB_MAX_INNER], b[..., start : start + LIMB_MAX_INNER, :])
        return out
    n = b.shape[-1]
    al = _limbs(a)
    bl = torch.cat(_limbs(b), -1)  # (..., k, 4n): limb j of b in columns j*n..(j+1)*n
    result: Tensor | None = None
    for i in range(_LIMBS):
        products = (al[i] @ bl[..., : (_LIMBS - i) * n]).to(torch.int64)  # a_i @ b_j for j = 0..3-i, exact
        for j in range(_LIMBS - i):
            term = products[..., j * n : (j + 1) * n] << (_LIMB_BITS * (i + j))
            result = term if result is None else result.add_(term)
    assert result is not None
    return result


def ring_matmul(a: Tensor, b: Tensor, *, method: MatmulMethod = "auto") -> Tensor:
    """``a @ b`` in Z_2^64: torch's int64 matmul on the CPU, exact 16-bit-limb float64 products
    (:func:`limb_matmul`) elsewhere (CUDA); ``method`` forces one (``int64`` exists on the CPU only)."""
    if a.dtype != torch.int64 or b.dtype != torch.int64:
        raise TypeError("ring_matmul expects int64 tensors")
    if method not in ("auto", "int64", "limbs"):
        raise ValueError(f"method must be auto, int64 or limbs, got {method!r}")
    if method == "limbs" or (method == "auto" and a.device.type != "cpu"):
        return limb_matmul(a, b)
    return a @ b


# ----------------------------------------------------------------------------------------------
# Convolution in the ring via im2col (index gather) and col2im (index_add_).


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def conv_output_size(
    size: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int]
) -> tuple[int, int]:
    """Spatial output size of a (dilation 1) convolution."""
    oh = (size[0] + 2 * padding[0] - kernel[0]) // stride[0] + 1
    ow = (size[1] + 2 * padding[1] - kernel[1]) // stride[1] + 1
    if oh <= 0 or ow <= 0:
        raise ValueError(f"convolution of input {size} with kernel {kernel}, padding {padding} has empty output")
    return oh, ow


@lru_cache(maxsize=64)
def _im2col_index(
    channels: int,
    size: tuple[int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    device: torch.device,
) -> Tensor:
    """Flat indices into the padded ``(C, H+2p, W+2p)`` input: shape ``(L, C*kh*kw)``, L = oh*ow, on ``device``
    (cached per device: a GPU run does not copy them for every product)."""
    hp, wp = size[0] + 2 * padding[0], size[1] + 2 * padding[1]
    oh, ow = conv_output_size(size, kernel, stride, padding)
    c = torch.arange(channels).view(channels, 1, 1)
    ki = torch.arange(kernel[0]).view(1, kernel[0], 1)
    kj = torch.arange(kernel[1]).view(1, 1, kernel[1])
    patch = (c * hp + ki) * wp + kj  # (C, kh, kw) offsets relative to the patch's top-left corner
    oi = torch.arange(oh).view(oh, 1) * stride[0]
    oj = torch.arange(ow).view(1, ow) * stride[1]
    corner = (oi * wp + oj).reshape(-1, 1)  # (L, 1)
    return (corner + patch.reshape(1, -1)).to(device)


def _patches(x: Tensor, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int]) -> Tensor:
    """``(N, C, oh, ow, kh, kw)`` view of the zero-padded input (``Tensor.unfold``, no copy but the padding)."""
    conv_output_size((int(x.shape[2]), int(x.shape[3])), kernel, stride, padding)  # raises for an empty output
    xp = torch.nn.functional.pad(x, (padding[1], padding[1], padding[0], padding[0])) if any(padding) else x
    return xp.unfold(2, kernel[0], stride[0]).unfold(3, kernel[1], stride[1])


def im2col(x: Tensor, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int]) -> Tensor:
    """``(N, C, H, W)`` -> ``(N, L, C*kh*kw)`` patches (works for int64, zero padding)."""
    n = x.shape[0]
    patches = _patches(x, kernel, stride, padding)
    return patches.permute(0, 2, 3, 1, 4, 5).reshape(n, patches.shape[2] * patches.shape[3], -1)


def col2im(
    cols: Tensor,
    channels: int,
    size: tuple[int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
) -> Tensor:
    """Adjoint of :func:`im2col`: ``(N, L, C*kh*kw)`` -> ``(N, C, H, W)``, summing overlaps (ring sums)."""
    n = cols.shape[0]
    hp, wp = size[0] + 2 * padding[0], size[1] + 2 * padding[1]
    idx = _im2col_index(channels, size, kernel, stride, padding, cols.device)
    out = torch.zeros(n, channels * hp * wp, dtype=cols.dtype, device=cols.device)
    out.index_add_(1, idx.reshape(-1), cols.reshape(n, -1))
    out = out.view(n, channels, hp, wp)
    return out[:, :, padding[0] : padding[0] + size[0], padding[1] : padding[1] + size[1]]


def ring_conv2d(
    x: Tensor,
    w: Tensor,
    *,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    method: MatmulMethod = "auto",
) -> Tensor:
    """Cross-correlation ``conv2d(x, w)`` in Z_2^64 (no bias, dilation 1, groups 1).

    ``x``: ``(N, C, H, W)``, ``w``: ``(O, C, kh, kw)`` -> ``(N, O, oh, ow)``. The patches are laid
    out as ``(C*kh*kw, N*L)`` columns and multiplied as ``W (O, C*kh*kw) @ cols``: with few output
    channels this orientation is ~2.5x faster for torch's int64 matmul than ``(N*L, C*kh*kw) @ W^T``
    (2.3 vs 5.8 ms for LeNet5's first layer at batch 128, one thread). ``method``: :func:`ring_matmul`'s.
    """
    stride, padding = _pair(stride), _pair(padding)
    kernel = (int(w.shape[2]), int(w.shape[3]))
    n, o = x.shape[0], w.shape[0]
    patches = _patches(x, kernel, stride, padding)  # (N, C, oh, ow, kh, kw)
    oh, ow = patches.shape[2], patches.shape[3]
    cols = patches.permute(1, 4, 5, 0, 2, 3).reshape(-1, n * oh * ow)  # (C*kh*kw, N*L)
    out = ring_matmul(w.reshape(o, -1), cols, method=method)  # (O, N*L)
    return out.view(o, n, oh, ow).permute(1, 0, 2, 3).contiguous()


def ring_conv2d_input_grad(
    g: Tensor,
    w: Tensor,
    input_size: tuple[int, int],
    *,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    method: MatmulMethod = "auto",
) -> Tensor:
    """Gradient of ``conv2d`` with respect to its input (a transposed convolution) in Z_2^64.

    ``g``: ``(N, O, oh, ow)`` output gradient, ``w``: ``(O, C, kh, kw)`` -> ``(N, C, H, W)``.
    Bilinear in ``(g, w)``, so it can be evaluated on shares with a Beaver triple. ``method``: :func:`ring_matmul`'s.
    """
    stride, padding = _pair(stride), _pair(padding)
    kernel = (int(w.shape[2]), int(w.shape[3]))
    n, o = g.shape[0], g.shape[1]
    gm = g.permute(0, 2, 3, 1).reshape(-1, o)  # (N*L, O)
    cols = ring_matmul(gm, w.reshape(o, -1), method=method)  # (N*L, CK)
    return col2im(
        cols.view(n, -1, cols.shape[-1]),
        int(w.shape[1]),
        (int(input_size[0]), int(input_size[1])),
        kernel,
        stride,
        padding,
    )
