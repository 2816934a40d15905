"""Ring Z_2^64 on torch int64: wraparound, fixed-point encoding, ring matmul and convolution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from vflbench.mpc.ring import (
    LIMB_MAX_INNER,
    RING_BITS,
    RingOverflowError,
    col2im,
    decode,
    encode,
    im2col,
    limb_matmul,
    max_abs,
    ring_conv2d,
    ring_conv2d_input_grad,
    ring_matmul,
    uniform,
)

FAST = settings(max_examples=25, deadline=None)
I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def wrap(v: int) -> int:
    """A Python integer reduced to the signed int64 range (mod 2^64)."""
    return ((v + 2**63) % 2**64) - 2**63


def test_ring_is_64_bits() -> None:
    assert RING_BITS == 64


def test_add_and_mul_wrap_modulo_2_64() -> None:
    big = torch.tensor([2**63 - 1], dtype=torch.int64)
    assert int(big + 1) == -(2**63)
    assert int(torch.tensor([2**62]) * 4) == 0
    assert int(torch.tensor([-(2**63)]) - 1) == 2**63 - 1
    assert int(-torch.tensor([-(2**63)])) == -(2**63)


@FAST
@given(st.lists(I64, min_size=2, max_size=2), st.lists(I64, min_size=2, max_size=2))
def test_elementwise_ops_match_python_mod_2_64(a: list[int], b: list[int]) -> None:
    ta, tb = torch.tensor(a), torch.tensor(b)
    assert (ta + tb).tolist() == [wrap(x + y) for x, y in zip(a, b, strict=True)]
    assert (ta * tb).tolist() == [wrap(x * y) for x, y in zip(a, b, strict=True)]
    assert (ta - tb).tolist() == [wrap(x - y) for x, y in zip(a, b, strict=True)]


@FAST
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 4), st.integers(0, 2**31))
def test_int64_matmul_is_exact_mod_2_64(m: int, k: int, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    a, b = uniform((m, k), g), uniform((k, n), g)
    got = ring_matmul(a, b).tolist()
    al, bl = a.tolist(), b.tolist()
    want = [[wrap(sum(al[i][t] * bl[t][j] for t in range(k))) for j in range(n)] for i in range(m)]
    assert got == want


@FAST
@given(st.integers(1, 5), st.integers(1, 40), st.integers(1, 5), st.integers(0, 2**31))
def test_limb_matmul_equals_int64_matmul(m: int, k: int, n: int, seed: int) -> None:
    """The CUDA path (16-bit limbs multiplied in float64) is exact; checked here on CPU."""
    g = torch.Generator().manual_seed(seed)
    a, b = uniform((m, k), g), uniform((k, n), g)
    assert torch.equal(limb_matmul(a, b), a @ b)


EXTREMES = torch.tensor(
    [
        -(2**63),
        2**63 - 1,
        -1,
        0,
        1,
        2**16 - 1,
        2**16,
        -(2**16),
        2**32 - 1,
        2**48 + 12345,
        -(2**48) - 1,
        2**62,
        -(2**62) + 7,
        0x7FFF_FFFF_FFFF_0001,
    ],
    dtype=torch.int64,
)


def _extreme(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Ring elements drawn from the extreme values (limbs all 0 or all 0xFFFF, sign bit, carries) and uniform ones."""
    pick = torch.randint(0, len(EXTREMES), shape, generator=g)
    return torch.where(torch.rand(shape, generator=g) < 0.7, EXTREMES[pick], uniform(shape, g))


@pytest.mark.parametrize(
    ("m", "k", "n", "batch"), [(1, 1, 1, ()), (7, 300, 5, ()), (3, 64, 9, (2,)), (16, 784, 32, ())]
)
def test_limb_matmul_is_the_int64_product_on_extreme_values(m: int, k: int, n: int, batch: tuple[int, ...]) -> None:
    """The CUDA path against the CPU's int64 product, bit for bit, with the sign bit, all-ones limbs and carries
    across every limb boundary (batched operands too)."""
    g = torch.Generator().manual_seed(m * 1000 + k)
    a, b = _extreme((*batch, m, k), g), _extreme((*batch, k, n), g)
    assert torch.equal(limb_matmul(a, b), a @ b)
    assert torch.equal(ring_matmul(a, b, method="limbs"), ring_matmul(a, b))


def test_limb_matmul_is_exact_at_the_bound_and_chunks_beyond_it() -> None:
    """All-ones limbs (-1) make every limb product its largest, (2^16-1)^2: at k = 2^21 the float64 sums reach
    2^53 - 2^38 and are still exact; one row longer is summed in two chunks (a single float64 sum of it would not
    be exact: k (2^16-1)^2 would pass 2^53)."""
    assert LIMB_MAX_INNER == 2**21
    assert LIMB_MAX_INNER * (2**16 - 1) ** 2 < 2**53 < 2 * LIMB_MAX_INNER * (2**16 - 1) ** 2  # the bound is tight
    for k in (LIMB_MAX_INNER, LIMB_MAX_INNER + 3):
        a = torch.full((1, k), -1, dtype=torch.int64)
        b = torch.full((k, 2), -1, dtype=torch.int64)
        b[-1, 1] = 2**63 - 1
        assert torch.equal(limb_matmul(a, b), a @ b)


def test_ring_matmul_method_is_checked() -> None:
    a = torch.ones(2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="auto, int64 or limbs"):
        ring_matmul(a, a, method="float")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        limb_matmul(a.double(), a.double())


LIMB_CONV_CASES = st.tuples(
    st.integers(1, 2),
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 2),
    st.integers(0, 2),
    st.integers(0, 2**31),
)


@FAST
@given(LIMB_CONV_CASES)
def test_ring_convolutions_through_limbs_equal_the_int64_ones(case: tuple[int, ...]) -> None:
    """The convolution and its input gradient (im2col / col2im around a ring matmul) give the same ring elements
    with the limb product (the CUDA path) as with the int64 one, on extreme values."""
    n, c, o, kh, kw, s, p, seed = case
    h, wd = kh + 4, kw + 3
    g = torch.Generator().manual_seed(seed)
    x, w = _extreme((n, c, h, wd), g), _extreme((o, c, kh, kw), g)
    y = ring_conv2d(x, w, stride=s, padding=p)
    assert torch.equal(ring_conv2d(x, w, stride=s, padding=p, method="limbs"), y)
    gy = _extreme(tuple(y.shape), g)
    want = ring_conv2d_input_grad(gy, w, (h, wd), stride=s, padding=p)
    assert torch.equal(ring_conv2d_input_grad(gy, w, (h, wd), stride=s, padding=p, method="limbs"), want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (benchmarks/gpu_check.py runs it on a GPU)")
def test_ring_products_on_cuda_equal_the_cpu_ones() -> None:
    """On a GPU: the ring matmul and convolutions (limbs in float64 on cuBLAS) equal the CPU's int64 ones."""
    g = torch.Generator().manual_seed(5)
    a, b = _extreme((128, 784), g), _extreme((784, 256), g)
    assert torch.equal(ring_matmul(a.cuda(), b.cuda()).cpu(), a @ b)
    x, w = _extreme((8, 3, 12, 12), g), _extreme((6, 3, 5, 5), g)
    y = ring_conv2d(x, w, stride=1, padding=2)
    assert torch.equal(ring_conv2d(x.cuda(), w.cuda(), stride=1, padding=2).cpu(), y)
    gy = _extreme(tuple(y.shape), g)
    assert torch.equal(
        ring_conv2d_input_grad(gy.cuda(), w.cuda(), (12, 12), stride=1, padding=2).cpu(),
        ring_conv2d_input_grad(gy, w, (12, 12), stride=1, padding=2),
    )
    assert torch.equal(
        uniform((5, 7), torch.Generator().manual_seed(1), device="cuda").cpu(),
        uniform((5, 7), torch.Generator().manual_seed(1)),
    )


def test_uniform_covers_the_whole_ring_and_is_reproducible() -> None:
    x = uniform((20000,), torch.Generator().manual_seed(0))
    assert x.dtype == torch.int64
    assert torch.equal(x, uniform((20000,), torch.Generator().manual_seed(0)))
    frac_negative = float((x < 0).double().mean())
    assert 0.48 < frac_negative < 0.52
    # low and high 32-bit halves both vary: every bit is set about half of the time
    bits = torch.stack([((x >> i) & 1) for i in range(64)]).double().mean(1)
    assert float(bits.min()) > 0.47 and float(bits.max()) < 0.53


@FAST
@given(
    st.integers(min_value=8, max_value=24),
    st.lists(st.floats(min_value=-1.0, max_value=1.0, allow_nan=False), min_size=1, max_size=50),
    st.floats(min_value=1e-3, max_value=0.99),
)
def test_encode_decode_error_is_half_an_lsb(frac_bits: int, unit: list[float], fraction: float) -> None:
    limit = max_abs(frac_bits) * fraction
    x = torch.tensor(unit, dtype=torch.float64) * limit
    err = (decode(encode(x, frac_bits), frac_bits) - x).abs()
    eps = torch.finfo(torch.float64).eps * x.abs()
    assert bool((err <= 2.0 ** (-frac_bits) / 2 + eps).all())


def test_encode_rounds_to_nearest_and_handles_float32() -> None:
    f = 16
    x = torch.tensor([0.0, 1.0, -1.0, 2.0**-17 * 1.01, -(2.0**-17) * 1.01, 3.14159], dtype=torch.float32)
    v = encode(x, f)
    assert v.dtype == torch.int64
    assert v.tolist()[:5] == [0, 2**16, -(2**16), 1, -1]
    assert decode(v, f, dtype=torch.float32).dtype == torch.float32


@pytest.mark.parametrize("frac_bits", [0, 13, 16, 24])
def test_overflow_raises(frac_bits: int) -> None:
    limit = max_abs(frac_bits)
    encode(torch.tensor([limit * 0.999], dtype=torch.float64), frac_bits)
    for bad in (limit, -limit, 2.0 * limit, float("inf"), float("nan")):
        with pytest.raises(RingOverflowError):
            encode(torch.tensor([1.0, bad], dtype=torch.float64), frac_bits)


def test_encode_rejects_int64_and_bad_frac_bits() -> None:
    with pytest.raises(TypeError):
        encode(torch.tensor([1]))
    with pytest.raises(ValueError):
        encode(torch.tensor([1.0]), 63)
    with pytest.raises(TypeError):
        decode(torch.tensor([1.0]))


def _numpy_conv_u64(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], padding: tuple[int, int]) -> np.ndarray:
    """Reference convolution with numpy uint64 arithmetic (wraps mod 2^64)."""
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1])))
    n, _, hp, wp = xp.shape
    o, _, kh, kw = w.shape
    oh, ow = (hp - kh) // stride[0] + 1, (wp - kw) // stride[1] + 1
    out = np.zeros((n, o, oh, ow), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, :, i * stride[0] : i * stride[0] + kh, j * stride[1] : j * stride[1] + kw]
                for oc in range(o):
                    out[:, oc, i, j] = (patch * w[oc][None]).reshape(n, -1).sum(1, dtype=np.uint64)
    return out


conv_cases = st.tuples(
    st.integers(1, 2),  # batch
    st.integers(1, 3),  # in channels
    st.integers(1, 3),  # out channels
    st.integers(1, 3),  # kernel h
    st.integers(1, 3),  # kernel w
    st.integers(1, 3),  # stride
    st.integers(0, 2),  # padding
    st.integers(0, 2**31),
)


@FAST
@given(conv_cases)
def test_ring_conv2d_wraps_exactly(case: tuple[int, ...]) -> None:
    n, c, o, kh, kw, s, p, seed = case
    h, wd = kh + 3, kw + 2
    g = torch.Generator().manual_seed(seed)
    x, w = uniform((n, c, h, wd), g), uniform((o, c, kh, kw), g)
    got = ring_conv2d(x, w, stride=s, padding=p)
    want = _numpy_conv_u64(x.numpy().view(np.uint64), w.numpy().view(np.uint64), (s, s), (p, p)).view(np.int64)
    assert np.array_equal(got.numpy(), want)


@FAST
@given(conv_cases)
def test_ring_conv2d_and_input_grad_match_float_conv(case: tuple[int, ...]) -> None:
    n, c, o, kh, kw, s, p, seed = case
    h, wd = kh + 4, kw + 3
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-50, 50, (n, c, h, wd), generator=g)
    w = torch.randint(-50, 50, (o, c, kh, kw), generator=g)
    y = ring_conv2d(x, w, stride=(s, s), padding=(p, p))
    xf = x.double().requires_grad_(True)
    yf = F.conv2d(xf, w.double(), stride=s, padding=p)
    assert torch.equal(y, yf.round().long())
    gy = torch.randint(-50, 50, tuple(y.shape), generator=g)
    (gx,) = torch.autograd.grad(yf, xf, gy.double())
    assert torch.equal(ring_conv2d_input_grad(gy, w, (h, wd), stride=s, padding=p), gx.round().long())


def test_col2im_is_the_adjoint_of_im2col() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-9, 9, (2, 3, 7, 6), generator=g)
    k, s, p = (3, 2), (2, 1), (1, 2)
    cols = im2col(x, k, s, p)
    r = torch.randint(-9, 9, tuple(cols.shape), generator=g)
    assert int((cols * r).sum()) == int((x * col2im(r, 3, (7, 6), k, s, p)).sum())
