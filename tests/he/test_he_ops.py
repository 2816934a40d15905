"""vflbench.he: fixed point, vectorised homomorphic arithmetic, key and ciphertext wire formats.

512-bit keys: TEST-ONLY (fast and insecure).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("phe", reason="vflbench.he needs the optional 'he' extra (pip install 'vflbench[he]')")

from vflbench.he import (
    EncTensor,
    PaillierKeyHolder,
    PaillierOps,
    encode,
    public_key_from_wire,
    public_key_to_wire,
)
from vflbench.he.ops import add, scale_by, work_lin, work_obfuscators

TEST_KEY_BITS = 512


@pytest.fixture(scope="module")
def holder():
    return PaillierKeyHolder(TEST_KEY_BITS)


def test_fixed_point_encoding_and_homomorphic_matmul(holder):
    ops = holder.ops
    a = torch.tensor([[0.5, -1.25, 0.0], [2.0, 0.125, -3.0]], dtype=torch.float64)
    w = torch.tensor([[0.1, -0.2], [0.3, 0.4], [-0.5, 0.6]], dtype=torch.float64)
    enc_w = ops.encrypt(encode(w, 20))
    prod = EncTensor(ops.matmul(encode(a, 20), enc_w), 40)
    torch.testing.assert_close(holder.reveal(prod), a @ w, atol=1e-5, rtol=0)
    wire = ops.to_wire(enc_w)
    assert wire.shape == (3, 2, 2 * TEST_KEY_BITS // 8)
    assert [int(c) for c in ops.from_wire(wire).ravel()] == [int(c) for c in enc_w.ravel()]
    with pytest.raises(ValueError, match="ciphertext"):
        ops.from_wire(torch.zeros(3, 2, 7, dtype=torch.uint8))
    with pytest.raises(ValueError, match="outside"):
        ops.from_wire(torch.zeros(1, ops.nbytes, dtype=torch.uint8))  # 0 is not a ciphertext


def test_the_public_key_alone_encrypts_with_phe_and_the_holder_decrypts(holder):
    """The passive party rebuilds phe's public key from the wire and encrypts with phe's raw_encrypt
    (no factors); the key holder's CRT encryptions decrypt the same."""
    public = public_key_from_wire(public_key_to_wire(holder.public_key))
    assert public == holder.public_key and len(public_key_to_wire(public)) == TEST_KEY_BITS // 8
    passive = PaillierOps(public)
    assert passive._crt is None and holder.ops._crt is not None
    x = torch.tensor([[1.5, -2.25], [0.0, 3.0]], dtype=torch.float64)
    for ops in (passive, holder.ops):
        cts = ops.encrypt(encode(x, 16))
        torch.testing.assert_close(holder.reveal(EncTensor(cts, 16)), x, rtol=0, atol=0)
        again = ops.rerandomize(cts)
        assert all(int(u) != int(v) for u, v in zip(cts.ravel(), again.ravel(), strict=True))
        torch.testing.assert_close(holder.reveal(EncTensor(again, 16)), x, rtol=0, atol=0)


def test_linear_operations_on_encrypted_tensors(holder):
    ops = holder.ops
    x = EncTensor(ops.encrypt(encode(torch.tensor([1.0, -0.5]), 8)), 8)
    y = EncTensor(ops.encrypt(encode(torch.tensor([0.25, 2.0]), 16)), 16)
    total = add(ops, x, y)
    assert total.scale == 16
    torch.testing.assert_close(holder.reveal(total), torch.tensor([1.25, 1.5], dtype=torch.float64))
    scaled = scale_by(ops, x, -0.75, 8)
    assert scaled.scale == 16
    torch.testing.assert_close(holder.reveal(scaled), torch.tensor([-0.75, 0.375], dtype=torch.float64))
    plus_one = ops.add_plain(ops.encrypt(encode(torch.eye(2), 4)), encode(torch.ones(2), 4))  # [[2, 1], [1, 2]]
    column_sums = EncTensor(ops.sum_rows(plus_one), 4)
    torch.testing.assert_close(holder.reveal(column_sums), torch.tensor([3.0, 3.0], dtype=torch.float64))


def test_worker_functions_of_the_pool_compute_the_same_ciphertext_products(holder):
    ops = holder.ops
    x = encode(torch.tensor([[1.5, -2.0], [0.0, 0.25]]), 8)
    w = ops.encrypt(encode(torch.tensor([[0.5], [-1.0]]), 8))
    rows = work_lin(int(ops.n2), x.tolist(), [[int(c) for c in w[:, 0]]], ops.use_gmpy2)
    arr = ops.matmul(x, w)
    assert [[int(v) for v in r] for r in rows] == [[int(v) for v in r] for r in arr.tolist()]
    expected = torch.tensor([2.75, -0.25], dtype=torch.float64)
    torch.testing.assert_close(holder.reveal(EncTensor(arr, 16)).flatten(), expected)
    obf = work_obfuscators(int(ops.n), 3, ops.use_gmpy2, None)
    assert len(set(obf)) == 3 and all(0 < v < int(ops.n2) for v in obf)
