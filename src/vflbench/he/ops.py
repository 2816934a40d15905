"""Vectorised Paillier arithmetic (``g = n + 1``) on numpy object arrays of raw ciphertexts.

python-paillier (``phe``) provides the keys, encryption of single values (``raw_encrypt``) and
decryption (``raw_decrypt``, by CRT). Its arithmetic works one ``EncryptedNumber`` object at a
time; a layer needs whole tensors of ciphertexts (a batch times a weight matrix), so the products,
sums, re-randomisations and the wire format are here, on raw integers (gmpy2 ``mpz`` when
installed), optionally spread over worker processes. The key holder, which knows the factors,
encrypts by CRT modulo ``p^2`` and ``q^2`` (faster than phe's encryption; see
``docs/notes/performance_history.md``); a party with the public key only uses phe's ``raw_encrypt``.
"""

from __future__ import annotations

import secrets
import weakref
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vflbench.he.encoding import EncTensor
from vflbench.he.keys import has_gmpy2


def _lin_rows(n2: Any, rows: list[list[int]], cols: list[list[Any]], powmod: Any, invert: Any) -> list[list[Any]]:
    """``rows @ C`` homomorphically: ``out[i][c] = prod_j C[j][c] ^ rows[i][j] mod n^2`` (cols[c][j] = C[j][c])."""
    out = []
    for row in rows:
        nz = [(j, e) for j, e in enumerate(row) if e]
        res = []
        for col in cols:
            pos, neg = 1, 1
            for j, e in nz:
                if e > 0:
                    pos = pos * powmod(col[j], e, n2) % n2
                else:
                    neg = neg * powmod(col[j], -e, n2) % n2
            res.append(pos if neg == 1 else pos * invert(neg, n2) % n2)
        out.append(res)
    return out


def _obfuscators(n: Any, count: int, powmod: Any, crt: tuple[Any, ...] | None = None) -> list[Any]:
    """``count`` fresh ``r^n mod n^2`` with ``r`` uniform in ``[1, n)`` from the OS CSPRNG.

    ``crt`` = ``(p^2, q^2, n mod p(p-1), n mod q(q-1), (q^2)^-1 mod p^2)`` lets the key holder (who
    knows the factors) compute the same value modulo ``p^2`` and ``q^2`` and recombine.
    """
    n2 = n * n
    if crt is None:
        return [powmod(1 + secrets.randbelow(int(n) - 1), n, n2) for _ in range(count)]
    p2, q2, ep, eq, q2inv = crt
    out = []
    for _ in range(count):
        r = 1 + secrets.randbelow(int(n) - 1)
        a, b = powmod(r, ep, p2), powmod(r, eq, q2)
        out.append(b + q2 * ((a - b) * q2inv % p2))
    return out


def _math(use_gmpy2: bool) -> tuple[Any, Any, Any]:
    if use_gmpy2:
        import gmpy2

        return gmpy2.mpz, gmpy2.powmod, gmpy2.invert
    return int, pow, lambda a, m: pow(a, -1, m)


def work_lin(n2: int, rows: list[list[int]], cols: list[list[int]], use_gmpy2: bool) -> list[list[int]]:
    """A pool worker's share of :meth:`PaillierOps.matmul` (plain integers in and out)."""
    mpz, powmod, invert = _math(use_gmpy2)
    return _lin_rows(mpz(n2), rows, [[mpz(c) for c in col] for col in cols], powmod, invert)


def work_obfuscators(n: int, count: int, use_gmpy2: bool, crt: tuple[int, ...] | None) -> list[int]:
    """A pool worker's share of :meth:`PaillierOps.obfuscators`."""
    mpz, powmod, _ = _math(use_gmpy2)
    return [int(v) for v in _obfuscators(mpz(n), count, powmod, None if crt is None else tuple(map(mpz, crt)))]


class PaillierOps:
    """Paillier arithmetic under one phe public key on raw ciphertext integers.

    Arrays are numpy object arrays of integers (gmpy2 ``mpz`` when available). ``pool`` > 1
    spreads exponentiations and obfuscator generation over that many spawned worker processes.
    """

    def __init__(self, public_key: Any, *, pool: int = 0) -> None:
        self.public_key = public_key
        self.use_gmpy2 = has_gmpy2()
        self._mpz, self._powmod, self._invert = _math(self.use_gmpy2)
        self.n = self._mpz(int(public_key.n))
        self.n2 = self.n * self.n
        self.pool = pool
        self.nbytes = (int(self.n2).bit_length() + 7) // 8
        self._executor: ProcessPoolExecutor | None = None
        self._crt: tuple[Any, ...] | None = None

    def use_factors(self, p: int, q: int) -> None:
        """Key holder only: encrypt and re-randomise by CRT modulo ``p^2`` and ``q^2``."""
        p, q = self._mpz(p), self._mpz(q)
        p2, q2 = p * p, q * q
        self._crt = (p2, q2, self.n % (p * (p - 1)), self.n % (q * (q - 1)), self._invert(q2, p2))

    # pickling / copying never carries the worker pool
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_executor"] = None
        for k in ("_mpz", "_powmod", "_invert"):
            state.pop(k)
        state["n"], state["n2"] = int(self.n), int(self.n2)
        state["_crt"] = None if self._crt is None else tuple(int(v) for v in self._crt)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._mpz, self._powmod, self._invert = _math(self.use_gmpy2)
        self.n, self.n2 = self._mpz(state["n"]), self._mpz(state["n2"])
        if self._crt is not None:
            self._crt = tuple(self._mpz(v) for v in self._crt)

    def _pool(self) -> ProcessPoolExecutor | None:
        if self.pool <= 1:
            return None
        if self._executor is None:
            import multiprocessing

            self._executor = ProcessPoolExecutor(self.pool, mp_context=multiprocessing.get_context("spawn"))
            weakref.finalize(self, self._executor.shutdown, wait=False, cancel_futures=True)
        return self._executor

    def _chunks(self, total: int) -> list[tuple[int, int]]:
        parts = max(1, min(total, self.pool))
        bounds = np.linspace(0, total, parts + 1).astype(int)
        return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]

    def _pooled(self, count: int) -> ProcessPoolExecutor | None:
        executor = self._pool()
        return None if executor is None or count < 2 * self.pool else executor

    def obfuscators(self, count: int) -> list[Any]:
        """Fresh ``r^n`` values (the expensive half of an encryption)."""
        executor = self._pooled(count)
        if executor is None:
            return _obfuscators(self.n, count, self._powmod, self._crt)
        crt = None if self._crt is None else tuple(int(v) for v in self._crt)
        futures = [
            executor.submit(work_obfuscators, int(self.n), b - a, self.use_gmpy2, crt) for a, b in self._chunks(count)
        ]
        return [self._mpz(v) for f in futures for v in f.result()]

    def _embed(self, m: int) -> Any:
        """``(1 + m n) mod n^2``: the plaintext ``m`` (any integer, reduced mod ``n``) without randomness."""
        return (1 + (self._mpz(m) % self.n) * self.n) % self.n2

    def _array(self, values: list[Any], shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out.reshape(shape)

    def encrypt(self, plaintext: np.ndarray) -> np.ndarray:
        """Fresh encryptions of integer plaintexts (object array): phe's ``raw_encrypt`` with the
        public key alone, CRT obfuscators at the key holder (or over the worker pool)."""
        flat = plaintext.ravel().tolist()
        if self._crt is None and self._pooled(len(flat)) is None:
            n = int(self.n)
            cts = [self._mpz(self.public_key.raw_encrypt(int(m) % n)) for m in flat]
        else:
            obf = self.obfuscators(len(flat))
            cts = [self._embed(m) * r % self.n2 for m, r in zip(flat, obf, strict=True)]
        return self._array(cts, plaintext.shape)

    def rerandomize(self, cts: np.ndarray) -> np.ndarray:
        """Multiply by fresh encryptions of zero (unlinkable to the inputs, same plaintexts)."""
        flat = cts.ravel().tolist()
        obf = self.obfuscators(len(flat))
        return self._array([c * r % self.n2 for c, r in zip(flat, obf, strict=True)], cts.shape)

    def add_plain(self, cts: np.ndarray, plaintext: np.ndarray) -> np.ndarray:
        """``[[x]] -> [[x + p]]`` for integer plaintexts ``p`` (broadcast)."""
        a, b = np.broadcast_arrays(cts, plaintext)
        return self._array(
            [c * self._embed(p) % self.n2 for c, p in zip(a.ravel().tolist(), b.ravel().tolist(), strict=True)], a.shape
        )

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``[[x]], [[y]] -> [[x + y]]`` (broadcast)."""
        a, b = np.broadcast_arrays(x, y)
        return self._array(
            [u * v % self.n2 for u, v in zip(a.ravel().tolist(), b.ravel().tolist(), strict=True)], a.shape
        )

    def mul_int(self, cts: np.ndarray, k: int) -> np.ndarray:
        """``[[x]] -> [[k x]]`` for one integer ``k``."""
        if k == 1:
            return cts
        flat = cts.ravel().tolist()
        if k < 0:
            flat = [self._invert(c, self.n2) for c in flat]
            k = -k
        return self._array([self._powmod(c, k, self.n2) for c in flat], cts.shape)

    def sum_rows(self, cts: np.ndarray) -> np.ndarray:
        """``[[X]] (r, k) -> [[sum_i X_i]] (k,)``."""
        out = np.empty(cts.shape[1], dtype=object)
        for c in range(cts.shape[1]):
            acc = self._mpz(1)
            for v in cts[:, c].tolist():
                acc = acc * v % self.n2
            out[c] = acc
        return out

    def matmul(self, plain: np.ndarray, cts: np.ndarray) -> np.ndarray:
        """``P @ [[C]]``: ``P`` an (r, s) integer array, ``[[C]]`` (s, k) ciphertexts -> (r, k) ciphertexts."""
        rows = plain.tolist()
        cols = cts.T.tolist()
        executor = self._pool()
        if executor is None or len(rows) < 2:
            result = _lin_rows(self.n2, rows, cols, self._powmod, self._invert)
        else:
            ints = [[int(c) for c in col] for col in cols]
            futures = [
                executor.submit(work_lin, int(self.n2), rows[a:b], ints, self.use_gmpy2)
                for a, b in self._chunks(len(rows))
            ]
            result = [[self._mpz(v) for v in row] for f in futures for row in f.result()]
        out = np.empty((len(rows), cts.shape[1]), dtype=object)
        for i, row in enumerate(result):
            out[i, :] = row
        return out

    # wire format ---------------------------------------------------------------------------

    def to_wire(self, cts: np.ndarray) -> Tensor:
        """Ciphertexts as the bytes that travel: a uint8 tensor of shape ``(*cts.shape, nbytes)``."""
        raw = b"".join(int(c).to_bytes(self.nbytes, "big") for c in cts.ravel().tolist())
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(*cts.shape, self.nbytes)

    def from_wire(self, wire: Tensor) -> np.ndarray:
        """Parse :meth:`to_wire`'s bytes back into ciphertexts (checked to lie in ``[1, n^2)``)."""
        if wire.dtype != torch.uint8 or wire.dim() < 1 or wire.shape[-1] != self.nbytes:
            raise ValueError(
                f"expected Paillier ciphertext bytes (uint8, last dimension {self.nbytes}), got "
                f"{wire.dtype} of shape {tuple(wire.shape)}"
            )
        raw = wire.cpu().contiguous().numpy().tobytes()
        L = self.nbytes
        vals = [self._mpz(int.from_bytes(raw[i : i + L], "big")) for i in range(0, len(raw), L)]
        if any(not 0 < v < self.n2 for v in vals):
            raise ValueError("received a value outside Z_{n^2}: not a ciphertext under this key")
        return self._array(vals, tuple(wire.shape[:-1]))


def align(ops: PaillierOps, x: EncTensor, scale: int) -> EncTensor:
    """``x`` at the larger ``scale`` (a homomorphic multiplication by ``2^(scale - x.scale)``)."""
    if scale < x.scale:
        raise ValueError("cannot lower a ciphertext's scale without the key holder (use rescaling)")
    return x if scale == x.scale else EncTensor(ops.mul_int(x.cts, 1 << (scale - x.scale)), scale)


def add(ops: PaillierOps, x: EncTensor, y: EncTensor) -> EncTensor:
    """``[[x + y]]`` at the larger of the two scales."""
    s = max(x.scale, y.scale)
    return EncTensor(ops.add(align(ops, x, s).cts, align(ops, y, s).cts), s)


def scale_by(ops: PaillierOps, x: EncTensor, c: float, bits: int) -> EncTensor:
    """``[[c x]]`` with the public real ``c`` encoded at ``bits`` fractional bits (the scale grows by ``bits``)."""
    k = int(round(c * 2**bits))
    return EncTensor(ops.mul_int(x.cts, k), x.scale + bits)
