"""``paillier_he``: a Paillier-encrypted interactive layer, the cryptographic baseline of VMask's Table III.

A two-party homomorphic-encryption protocol in the style of ACML (Zhang & Zhu 2020) and BlindFL
(Fu et al. 2022): the passive party's embedding is produced by an *interactive layer* whose
weight, gradient and output the passive party never sees in plaintext, so that it never handles a
plaintext cut gradient. It is a runtime baseline first (VMask, NDSS 2025, Table III compares
ACML, SPNN, SFA and BlindFL; the paper used python-paillier with a 1024-bit key). Requires the
optional ``he`` extra (``pip install 'vflbench[he]'``: phe and gmpy2), imported only when a run
binds the defense.

Model. The passive party's bottom model ``x -> f(x) -> a W + b`` is split at its last
``nn.Linear``: the layers before it are a plaintext feature extractor ``f`` that is **frozen**
(the passive party cannot train it: its input gradient ``d W^T`` would be a plaintext,
label-dependent gradient), the last Linear is the interactive layer. With the ``logreg`` bottom
(one Linear on the raw slice) there is no extractor and the model and its SGD trajectory are
those of plaintext training. Every other model (the active party's bottom, the top) is plaintext.

Keys. The active party (the label holder) generates the Paillier key pair (``key_bits``) and
sends the public key ``n`` (``g = n + 1``); only it can decrypt. ``[[x]]`` is a ciphertext under it.

Fixed point. A real ``x`` at scale ``s`` is the integer ``round(x 2^s)`` in ``Z_n`` (negatives as
``n - |x|``). Plaintext multipliers (the passive inputs ``a``, and ``lr``, momentum, weight decay)
are encoded with ``F = precision`` fractional bits; a ciphertext-times-plaintext product adds the
scales, which each encrypted tensor tracks. Scales of encrypted values cost nothing; the bits of
the plaintext multipliers set the cost of every exponentiation.

Protocol, per batch (A = active party, P = passive party):

1. Setup (once). P encrypts its initial interactive weight and bias, ``[[W]]`` and ``[[b]]``, and
   from then on holds only these ciphertexts (it knows ``W_0``, its own initialisation, and nothing
   after the first update).
2. Forward. P computes ``a = f(x)`` and ``[[h]] = a [[W]] + [[b]]`` homomorphically (ciphertext
   powers and products), draws a share ``S`` from its own generator, and sends A the re-randomised
   ``[[h - S]]``; A decrypts its share ``h - S``. P's embedding message (the loop's ``embedding``)
   carries ``S``; A's top model receives ``S + (h - S) = h`` (a wrapper on A's top adds A's share
   at P's slice), so A sees the embedding exactly as in plaintext VFL, P never sees ``h``.
3. Backward. A computes ``d = dL/dh`` as usual and sends ``[[d]]`` (the loop's ``cut_gradient``
   message is the ciphertext bytes, shape ``(B, k, L)``, ``L = 2 key_bits / 8``). P computes
   ``[[dW]] = a^T [[d]]`` and ``[[db]] = sum_i [[d_i]]``.
4. Update. P applies torch's SGD to the ciphertexts, with the learning rate, momentum and weight
   decay of its own optimizer's parameter group (read when that optimizer steps, so schedules
   apply): ``g = dW + wd W``, ``v = mu v + g`` (``v = g`` at the first step), ``W = W - lr v`` --
   all linear with public coefficients, hence homomorphic. Adam, Nesterov, dampening and
   ``maximize`` are rejected (they are not linear in the encrypted gradient).
5. Rescaling (only with momentum or weight decay, which grow the scales by ``F`` per product):
   when a scale leaves the plaintext space's budget, P masks ``[[x + R]]`` with a fresh
   statistical mask ``R`` (``KAPPA`` = 40 extra bits), A decrypts, shifts right and re-encrypts,
   and P removes ``floor(R / 2^shift)``: exact to one unit in the last place at scale ``F``.

What each party learns (honest-but-curious, no collusion). P receives only ciphertexts under A's
key: ``[[d]]`` and re-encrypted rescaled values; it decrypts nothing and holds no plaintext
``d``, ``dW``, ``W_t`` (t > 0) or ``h``, so gradient-based label inference and model completion
on its bottom model have nothing but the frozen extractor (and ``W_0``) to work with. A decrypts
``h - S`` (and with ``S`` learns the embedding ``h``, exactly as in plaintext VFL) and, when
rescaling, ``x + R`` (statistically hidden); every ciphertext P sends is re-randomised with a fresh
``r^n`` so that A cannot relate it to the ciphertexts ``[[d]]`` it produced. Not hidden: the
frozen extractor's output stays at P, the embedding ``h`` reaches A as in plaintext VFL, and
message sizes and timing are public.

Costs and caveats. Per batch of B rows, ``m`` extractor outputs and ``k`` embedding dimensions:
``2 B m k`` ciphertext-plaintext exponentiations (the forward and weight-gradient products), ``B k``
encryptions at A and ``B k`` re-randomisations at P, ``B k`` decryptions at A; evaluation runs the
encrypted forward too. Keys under 2048 bits are for experiments only (1024 bits, the default and
the paper's setting, is below current recommendations; the tests' 512-bit keys are insecure).
``pool`` parallelises exponentiations and encryptions over worker processes (spawned once,
reused). Ciphertext randomness and rescaling masks come from the operating system's CSPRNG (they
must be secret); ``S`` comes from P's seeded generator (A learns it anyway), so runs are
reproducible up to the last bit of rescaled values.

Use it alone and place it last among defenses: it changes what the embedding and cut-gradient
messages carry (a share and ciphertext bytes), so attacks and defenses that read those messages
see exactly that. Any aggregation works; it is read from ``BindContext.aggregation`` when
given, else inferred (``concat`` from the top model's input width, ``sum`` for VLR).
"""

from __future__ import annotations

import math
import secrets
import time
import weakref
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from vflbench.defenses import DEFENSES
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.models import init_parameters
from vflbench.models.base import linear_layers
from vflbench.protocol.hooks import BindContext, Defense, StepState
from vflbench.protocol.messages import ACTIVE

HE_EXTRA = ("paillier_he needs the optional 'he' extra (phe>=1.5, gmpy2>=2.1): "
            "pip install 'vflbench[he]'  (or: pip install phe gmpy2)")
KAPPA = 40  #: statistical security bits of the rescaling masks
MAG = 32  #: bits of magnitude allowed for encrypted reals (|W|, |v|, |h| < 2^32)
ENCODE_BITS = 64  #: floats are rounded at 2^-64 before being shifted to larger scales (exact for float64)


class DisconnectedService:
    """What a pickled handle to the other party becomes: any use raises."""

    def __init__(self, description: str) -> None:
        object.__setattr__(self, "_description", description)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"{self._description} was pickled and is disconnected from the other party")


class ServiceHandle:
    """A handle to another party's live state (as :mod:`vflbench.mpc._service`): deep copy returns
    ``self``, pickling a :class:`DisconnectedService`, so no copy or file of one party's model carries
    the other party's state (here: the private key)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> ServiceHandle:
        return self

    def __copy__(self) -> ServiceHandle:
        return self

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (DisconnectedService, (repr(self),))


def _load_phe() -> tuple[Any, Any]:
    """Import phe (required) and gmpy2 (optional, ~10x faster) lazily; a clear error names the extra."""
    try:
        from phe import paillier
    except ImportError as exc:
        raise ConfigError(HE_EXTRA) from exc
    try:
        import gmpy2
    except ImportError:  # pragma: no cover - phe works without it, only slower
        gmpy2 = None
    return paillier, gmpy2


# ----------------------------------------------------------------------------------------------
# Fixed point and raw Paillier arithmetic (g = n + 1) on numpy object arrays of integers


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


def _signed(v: int, n: int) -> int:
    return v - n if v > n // 2 else v


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
    knows the factors) compute the same value modulo ``p^2`` and ``q^2`` and recombine (~3x faster).
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


def _work_lin(n2: int, rows: list[list[int]], cols: list[list[int]], use_gmpy2: bool) -> list[list[int]]:
    mpz, powmod, invert = _math(use_gmpy2)
    return _lin_rows(mpz(n2), rows, [[mpz(c) for c in col] for col in cols], powmod, invert)


def _work_obfuscators(n: int, count: int, use_gmpy2: bool, crt: tuple[int, ...] | None) -> list[int]:
    mpz, powmod, _ = _math(use_gmpy2)
    return [int(v) for v in _obfuscators(mpz(n), count, powmod, None if crt is None else tuple(map(mpz, crt)))]


class PaillierOps:
    """Paillier arithmetic under one public key ``n`` (``g = n + 1``) on raw ciphertext integers.

    Arrays are numpy object arrays of integers (gmpy2 ``mpz`` when available). ``pool`` > 1
    spreads exponentiations and obfuscator generation over that many spawned worker processes.
    """

    def __init__(self, n: int, *, pool: int = 0) -> None:
        _, gmpy2 = _load_phe()
        self.use_gmpy2 = gmpy2 is not None
        self._mpz, self._powmod, self._invert = _math(self.use_gmpy2)
        self.n = self._mpz(n)
        self.n2 = self.n * self.n
        self.pool = pool
        self.nbytes = (int(self.n2).bit_length() + 7) // 8
        self._executor: ProcessPoolExecutor | None = None
        self._crt: tuple[Any, ...] | None = None

    def use_factors(self, p: int, q: int) -> None:
        """Key holder only: compute obfuscators by CRT modulo ``p^2`` and ``q^2``."""
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

    def obfuscators(self, count: int) -> list[Any]:
        """Fresh ``r^n`` values (the expensive half of an encryption)."""
        executor = self._pool()
        if executor is None or count < 2 * self.pool:
            return _obfuscators(self.n, count, self._powmod, self._crt)
        crt = None if self._crt is None else tuple(int(v) for v in self._crt)
        futures = [executor.submit(_work_obfuscators, int(self.n), b - a, self.use_gmpy2, crt)
                   for a, b in self._chunks(count)]
        return [self._mpz(v) for f in futures for v in f.result()]

    def _embed(self, m: int) -> Any:
        """``(1 + m n) mod n^2``: the plaintext ``m`` (any integer, reduced mod ``n``) without randomness."""
        return (1 + (self._mpz(m) % self.n) * self.n) % self.n2

    def encrypt(self, plaintext: np.ndarray) -> np.ndarray:
        """Fresh encryptions of integer plaintexts (object array)."""
        flat = plaintext.ravel().tolist()
        obf = self.obfuscators(len(flat))
        out = np.empty(len(flat), dtype=object)
        out[:] = [self._embed(m) * r % self.n2 for m, r in zip(flat, obf, strict=True)]
        return out.reshape(plaintext.shape)

    def rerandomize(self, cts: np.ndarray) -> np.ndarray:
        """Multiply by fresh encryptions of zero (unlinkable to the inputs, same plaintexts)."""
        flat = cts.ravel().tolist()
        obf = self.obfuscators(len(flat))
        out = np.empty(len(flat), dtype=object)
        out[:] = [c * r % self.n2 for c, r in zip(flat, obf, strict=True)]
        return out.reshape(cts.shape)

    def add_plain(self, cts: np.ndarray, plaintext: np.ndarray) -> np.ndarray:
        """``[[x]] -> [[x + p]]`` for integer plaintexts ``p`` (broadcast)."""
        a, b = np.broadcast_arrays(cts, plaintext)
        out = np.empty(a.shape, dtype=object)
        out.ravel()[:] = [c * self._embed(p) % self.n2 for c, p in zip(a.ravel().tolist(), b.ravel().tolist(),
                                                                       strict=True)]
        return out

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``[[x]], [[y]] -> [[x + y]]`` (broadcast)."""
        a, b = np.broadcast_arrays(x, y)
        out = np.empty(a.shape, dtype=object)
        out.ravel()[:] = [u * v % self.n2 for u, v in zip(a.ravel().tolist(), b.ravel().tolist(), strict=True)]
        return out

    def mul_int(self, cts: np.ndarray, k: int) -> np.ndarray:
        """``[[x]] -> [[k x]]`` for one integer ``k``."""
        if k == 1:
            return cts
        flat = cts.ravel().tolist()
        if k < 0:
            flat = [self._invert(c, self.n2) for c in flat]
            k = -k
        out = np.empty(len(flat), dtype=object)
        out[:] = [self._powmod(c, k, self.n2) for c in flat]
        return out.reshape(cts.shape)

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
            futures = [executor.submit(_work_lin, int(self.n2), rows[a:b], ints, self.use_gmpy2)
                       for a, b in self._chunks(len(rows))]
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
        if wire.dtype != torch.uint8 or wire.shape[-1] != self.nbytes:
            raise ValueError(f"expected Paillier ciphertext bytes (uint8, last dimension {self.nbytes}), got "
                             f"{wire.dtype} of shape {tuple(wire.shape)}")
        raw = wire.contiguous().numpy().tobytes()
        L = self.nbytes
        vals = [self._mpz(int.from_bytes(raw[i : i + L], "big")) for i in range(0, len(raw), L)]
        if any(not 0 < v < self.n2 for v in vals):
            raise ValueError("received a value outside Z_{n^2}: not a ciphertext under this key")
        out = np.empty(len(vals), dtype=object)
        out[:] = vals
        return out.reshape(tuple(wire.shape[:-1]))


@dataclass
class EncTensor:
    """Ciphertexts of reals at a fixed-point ``scale`` (``value = plaintext / 2^scale``)."""

    cts: np.ndarray
    scale: int

    @property
    def shape(self) -> tuple[int, ...]:  # noqa: D102
        return tuple(self.cts.shape)


def _align(ops: PaillierOps, x: EncTensor, scale: int) -> EncTensor:
    if scale < x.scale:
        raise ValueError("cannot lower a ciphertext's scale without the key holder (use rescaling)")
    return x if scale == x.scale else EncTensor(ops.mul_int(x.cts, 1 << (scale - x.scale)), scale)


def _add(ops: PaillierOps, x: EncTensor, y: EncTensor) -> EncTensor:
    s = max(x.scale, y.scale)
    return EncTensor(ops.add(_align(ops, x, s).cts, _align(ops, y, s).cts), s)


def _scale_by(ops: PaillierOps, x: EncTensor, c: float, bits: int) -> EncTensor:
    k = int(round(c * 2**bits))
    return EncTensor(ops.mul_int(x.cts, k), x.scale + bits)


# ----------------------------------------------------------------------------------------------
# The active party: key holder and decryption service


@dataclass
class HEComm:
    """Bytes and messages of the protocol's side exchanges (the loop's channel counts the rest)."""

    bytes_up: int = 0
    bytes_down: int = 0
    messages: int = 0
    by_tag: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def send(self, direction: str, nbytes: int, tag: str) -> None:
        """Record one message (``up`` = passive to active)."""
        self.messages += 1
        if direction == "up":
            self.bytes_up += nbytes
        else:
            self.bytes_down += nbytes
        self.by_tag[tag] += nbytes


class PaillierKeyHolder:
    """The active party's side of the protocol: the key pair, decryption, its shares of embeddings.

    The private key lives only here (name-mangled); everything the passive party gets from this
    object is a ciphertext. ``decrypted`` counts decrypted values by purpose.
    """

    def __init__(self, key_bits: int, *, pool: int = 0) -> None:
        paillier, _ = _load_phe()
        tic = time.perf_counter()
        public, private = paillier.generate_paillier_keypair(n_length=key_bits)
        self.keygen_seconds = time.perf_counter() - tic
        self.n = int(public.n)
        self.__private = private
        self.ops = PaillierOps(self.n, pool=pool)
        self.ops.use_factors(private.p, private.q)  # the key holder's ops never leave this object
        self.comm = HEComm()
        self.decrypted: dict[str, int] = defaultdict(int)
        self.encrypted = 0
        self.refreshes = 0
        self.seconds: dict[str, float] = defaultdict(float)
        self._shares: dict[str, Tensor] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> PaillierKeyHolder:  # one key pair per run, never duplicated
        return self

    def __reduce__(self) -> tuple[Any, tuple[str]]:  # never pickle the private key
        return (DisconnectedService, ("the active party's Paillier key holder",))

    def _decrypt(self, cts: np.ndarray, purpose: str) -> list[int]:
        """Unsigned plaintexts in ``[0, n)``."""
        out = []
        for c in cts.ravel().tolist():
            out.append(int(self.__private.raw_decrypt(int(c))))
        self.decrypted[purpose] += len(out)
        return out

    def encrypt_reals(self, x: Tensor, bits: int) -> np.ndarray:
        """``[[round(x 2^bits)]]``: how the active party encrypts a cut gradient."""
        tic = time.perf_counter()
        cts = self.ops.encrypt(encode(x, bits))
        self.encrypted += cts.size
        self.seconds["encrypt"] += time.perf_counter() - tic
        return cts

    def accept_share(self, party: str, cts: np.ndarray, scale: int) -> None:
        """Decrypt the passive party's ``[[h - S]]``: the active party's share of its embedding."""
        tic = time.perf_counter()
        vals = [_signed(v, self.n) / 2**scale for v in self._decrypt(cts, "embedding_share")]
        if any(abs(v) >= 2.0**MAG for v in vals):
            raise OverflowError("paillier_he: a decrypted embedding left the fixed-point range (|h| >= 2^32); "
                                "training diverged or precision/key_bits are too small")
        self._shares[party] = torch.tensor(vals, dtype=torch.float64).reshape(cts.shape)
        self.seconds["decrypt"] += time.perf_counter() - tic

    def take_share(self, party: str) -> Tensor | None:
        """The active party's share of ``party``'s last embedding (used once)."""
        return self._shares.pop(party, None)

    def rescale(self, cts: np.ndarray, shift: int) -> np.ndarray:
        """Decrypt masked values ``x + R``, divide by ``2^shift`` (floor), re-encrypt."""
        tic = time.perf_counter()
        vals = self._decrypt(cts, "rescale")
        arr = np.empty(len(vals), dtype=object)
        arr[:] = [v >> shift for v in vals]
        out = self.ops.encrypt(arr.reshape(cts.shape))
        self.refreshes += 1
        self.seconds["rescale"] += time.perf_counter() - tic
        return out

    def reveal(self, x: EncTensor) -> Tensor:
        """Test and evaluation oracle (not a protocol step): the plaintext of ``x``."""
        vals = [_signed(v, self.n) / 2**x.scale for v in self._decrypt(x.cts, "oracle")]
        return torch.tensor(vals, dtype=torch.float64).reshape(x.shape)


class KeyHolderPeer(ServiceHandle):
    """The passive party's handle to the active party's key holder: each call is a counted message.

    Deep copy returns the same handle; pickling yields a disconnected stub. The holder (and its
    private key) is not reachable through public attributes.
    """

    def __init__(self, holder: PaillierKeyHolder, party: str) -> None:
        self.__holder = holder
        self.party = party
        self.n = holder.n
        self.comm = holder.comm
        #: every value this party received from the active party through this handle (for audits)
        self.received: list[np.ndarray] = []

    def __repr__(self) -> str:
        return f"KeyHolderPeer({self.party})"

    def send_share(self, cts: np.ndarray, scale: int, nbytes: int) -> None:
        """P -> A: ``[[h - S]]`` (A keeps the decryption)."""
        self.comm.send("up", cts.size * nbytes, "embedding_share")
        self.__holder.accept_share(self.party, cts, scale)

    def rescale(self, cts: np.ndarray, shift: int, nbytes: int) -> np.ndarray:
        """P -> A: masked ``[[x + R]]``; A -> P: fresh ``[[floor((x + R) / 2^shift)]]``."""
        self.comm.send("up", cts.size * nbytes, "rescale")
        out = self.__holder.rescale(cts, shift)
        self.comm.send("down", out.size * nbytes, "rescale")
        self.received.append(out)
        return out


# ----------------------------------------------------------------------------------------------
# The passive party: the encrypted interactive layer

class PaillierLinear(nn.Module):
    """The passive party's interactive layer ``a -> a W + b``, held only as ciphertexts under A's key.

    ``forward`` returns the passive party's share ``S`` of the embedding and sends ``[[h - S]]``
    through ``peer``; :meth:`receive_gradient` turns ``[[d]]`` into encrypted parameter gradients;
    the update is applied when the passive party's optimizer steps (it holds ``marker``, an empty
    parameter through which the layer finds its parameter group: lr, momentum, weight decay; the
    defense registers the step hook on that party's optimizer in ``attach_optimizer``).
    """

    def attacker_module(self) -> nn.Module:
        """What the passive party can run alone: its weights are ciphertexts under the active party's
        key, so an attacker re-initialises the layer (a fresh ``nn.Linear`` of the same shape)."""
        fresh = nn.Linear(self.in_features, self.out_features, bias="bias" in self.params)
        return init_parameters(fresh, torch.Generator().manual_seed(self.in_features * 1_000_003 + self.out_features))

    def __init__(self, linear: nn.Linear, *, peer: KeyHolderPeer, precision: int, pool: int = 0) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.precision = precision
        self.ops = PaillierOps(peer.n, pool=pool)
        self.peer = peer
        self.generator: torch.Generator | None = None
        self.marker = nn.Parameter(torch.zeros(0, dtype=linear.weight.dtype))
        f = precision
        key_bits = int(self.ops.n).bit_length()
        # Budget: a forward product (scale s + f, m + 1 terms of magnitude < 2^MAG) and a rescaling mask
        # (s + MAG + KAPPA + 1 bits) must stay below n / 2. An update grows a scale by at most 2f (weight
        # decay and momentum products), so parameters are rescaled once they exceed ``rescale_above``;
        # plain SGD keeps them at 3f and never rescales.
        max_scale = key_bits - 2 - KAPPA - MAG - 1 - f - math.ceil(math.log2(self.in_features + 2))
        self.rescale_above = max_scale - 2 * f
        if self.rescale_above < 3 * f:
            need = key_bits - self.rescale_above + 3 * f
            raise ConfigError(f"paillier_he: key_bits={key_bits} leaves no room for precision={precision} with "
                              f"{self.in_features} inputs (need key_bits >= {need}); use a larger key or less "
                              "precision")
        with torch.no_grad():
            self.params: dict[str, EncTensor] = {"weight": self._encrypt_initial(linear.weight.T, f)}
            if linear.bias is not None:
                self.params["bias"] = self._encrypt_initial(linear.bias, f)
        self.buffers_: dict[str, EncTensor] = {}
        self._inputs: np.ndarray | None = None
        self._pending: dict[str, EncTensor] | None = None
        self.steps = 0
        self.rescales = 0
        self.seconds: dict[str, float] = defaultdict(float)

    def _encrypt_initial(self, x: Tensor, f: int) -> EncTensor:
        return EncTensor(self.ops.encrypt(encode(x, f)), f)

    def extra_repr(self) -> str:  # noqa: D102
        return (f"in_features={self.in_features}, out_features={self.out_features}, encrypted, "
                f"precision={self.precision}")

    # checkpoints carry the ciphertexts (plain integers), never a key
    def get_extra_state(self) -> dict[str, Any]:  # noqa: D102
        return {name: {"cts": [int(c) for c in t.cts.ravel().tolist()], "shape": list(t.shape), "scale": t.scale}
                for name, t in self.params.items()}

    def set_extra_state(self, state: dict[str, Any]) -> None:  # noqa: D102
        for name, t in state.items():
            arr = np.empty(len(t["cts"]), dtype=object)
            arr[:] = [self.ops._mpz(c) for c in t["cts"]]
            self.params[name] = EncTensor(arr.reshape(t["shape"]), t["scale"])
        self.buffers_ = {}

    def forward(self, a: Tensor) -> Tensor:  # noqa: D102
        if self.generator is None:
            raise RuntimeError("paillier_he: the passive party's defense instance has not bound this layer "
                               "(its generator is missing)")
        f = self.precision
        tic = time.perf_counter()
        x = encode(a.detach().reshape(len(a), -1), f)
        w = self.params["weight"]
        h = EncTensor(self.ops.matmul(x, w.cts), w.scale + f)
        if "bias" in self.params:
            h = _add(self.ops, h, self.params["bias"])
        share = torch.randn((len(a), self.out_features), generator=self.generator, dtype=torch.float64)
        masked = self.ops.rerandomize(self.ops.add_plain(h.cts, -encode(share, h.scale)))
        self.seconds["forward"] += time.perf_counter() - tic
        self.peer.send_share(masked, h.scale, self.ops.nbytes)
        if self.training:
            self._inputs = x
            self._pending = None
        return share.to(a.dtype) + self.marker.sum()

    def receive_gradient(self, d: np.ndarray, scale: int) -> None:
        """``[[d]]`` (B, k) at ``scale`` -> pending ``[[a^T d]]`` and ``[[sum_i d_i]]``."""
        if self._inputs is None:
            raise RuntimeError("paillier_he: a cut gradient arrived without a training forward pass")
        if d.shape != (self._inputs.shape[0], self.out_features):
            raise ValueError(f"paillier_he: encrypted gradient of shape {d.shape}, expected "
                             f"{(self._inputs.shape[0], self.out_features)}")
        tic = time.perf_counter()
        x, self._inputs = self._inputs, None
        pending = {"weight": EncTensor(self.ops.matmul(x.T, d), scale + self.precision)}
        if "bias" in self.params:
            pending["bias"] = EncTensor(self.ops.sum_rows(d), scale)
        self._pending = pending
        self.seconds["backward"] += time.perf_counter() - tic

    def apply_update(self, optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> None:
        """torch's SGD step on the ciphertexts, with ``group``'s hyperparameters (called after ``optimizer.step``)."""
        if self._pending is None:
            return
        if not isinstance(optimizer, torch.optim.SGD) or group.get("nesterov") or group.get("dampening", 0) \
                or group.get("maximize"):
            raise CompatibilityError(
                f"paillier_he updates its encrypted layer with SGD (momentum and weight decay allowed); the passive "
                f"party's optimizer is {type(optimizer).__name__} with nesterov={group.get('nesterov')}, "
                f"dampening={group.get('dampening')}, maximize={group.get('maximize')}. Use train.optimizer: sgd.")
        tic = time.perf_counter()
        ops, f = self.ops, self.precision
        lr, mu, wd = float(group["lr"]), float(group.get("momentum", 0.0)), float(group.get("weight_decay", 0.0))
        pending, self._pending = self._pending, None
        for name, grad in pending.items():
            p = self.params[name]
            if wd:
                grad = _add(ops, grad, _scale_by(ops, p, wd, f))
            if mu:
                buf = self.buffers_.get(name)
                grad = grad if buf is None else _add(ops, _scale_by(ops, buf, mu, f), grad)
                self.buffers_[name] = grad
            self.params[name] = _add(ops, p, _scale_by(ops, grad, -lr, f))
        self.steps += 1
        self.seconds["update"] += time.perf_counter() - tic
        for store in (self.params, self.buffers_):
            for name, t in store.items():
                if t.scale > self.rescale_above:
                    store[name] = self._rescale(t)

    def _rescale(self, x: EncTensor) -> EncTensor:
        """Masked truncation with the key holder: back to scale ``precision`` (error < 1 ulp)."""
        f, shift = self.precision, x.scale - self.precision
        tic = time.perf_counter()
        top = x.scale + MAG
        masks = np.empty(x.cts.size, dtype=object)
        masks[:] = [(1 << top) + secrets.randbits(top + KAPPA) for _ in range(x.cts.size)]
        masks = masks.reshape(x.shape)
        masked = self.ops.rerandomize(self.ops.add_plain(x.cts, masks))
        back = self.peer.rescale(masked, shift, self.ops.nbytes)
        unmask = np.empty(masks.size, dtype=object)
        unmask[:] = [-(r >> shift) for r in masks.ravel().tolist()]
        self.rescales += 1
        self.seconds["rescale"] += time.perf_counter() - tic
        return EncTensor(self.ops.add_plain(back, unmask.reshape(x.shape)), f)


def _replace_last_linear(model: nn.Module, make: Any) -> PaillierLinear:
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not layers or linear_layers(model)[-1] is not layers[-1]:
        raise CompatibilityError("paillier_he needs a bottom model whose last layer is an nn.Linear "
                                 "(the interactive layer); zoo models logreg, mlp2, mlp3, lenet5 qualify")
    last = layers[-1]
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is last:
                layer = make(last)
                setattr(parent, name, layer)
                return layer
    raise CompatibilityError("paillier_he could not locate the bottom model's last Linear layer")


class _ShareCombiningTop(nn.Module):
    """The active party's top model behind the addition of its embedding shares ``h - S``."""

    def __init__(self, top: nn.Module, holder: _HolderRef, layout: list[tuple[str, int, int]], how: str,
                 parts: int) -> None:
        super().__init__()
        self.top = top
        self.holder = holder
        self.layout = layout
        self.how = how
        self.parts = parts

    def forward(self, z: Tensor) -> Tensor:  # noqa: D102
        if not self.layout:
            return self.top(z)
        add = torch.zeros_like(z)
        for party, start, end in self.layout:
            share = self.holder.take_share(party)
            if share is None or share.shape[0] != z.shape[0]:
                raise RuntimeError(f"paillier_he: no decrypted embedding share of {party} for this batch of "
                                   f"{z.shape[0]} rows (the top model must follow that party's forward pass)")
            share = share.to(z.dtype)
            if self.how == "concat":
                add[:, start:end] += share
            else:
                add += share / (self.parts if self.how == "mean" else 1)
        return self.top(z + add)


class _HolderRef(ServiceHandle):
    """The top wrapper's handle on its own party's key holder (not copied into deep copies or pickles)."""

    def __init__(self, holder: PaillierKeyHolder) -> None:
        self.__holder = holder

    def take_share(self, party: str) -> Tensor | None:  # noqa: D102
        return self.__holder.take_share(party)


# ----------------------------------------------------------------------------------------------
# The defense


@DEFENSES.register(summary="Paillier-encrypted interactive layer (ACML/BlindFL-style HE baseline): the "
                                          "passive party never sees its cut gradient, layer weights or their gradients")
class PaillierHE(Defense):
    """A Paillier-HE VFL training protocol (see the module docstring for the protocol).

    ``key_bits``: Paillier modulus size (1024 default and the VMask paper's setting, for
    experiments; 2048+ for production; 512 in tests only). ``precision``: fractional bits of the
    fixed-point encoding (the cost of each exponentiation grows with it). ``pool``: worker
    processes for exponentiations and encryptions (0 or 1: none).

    The active-side instance generates the keys at ``bind``, installs the encrypted interactive
    layer into each passive bottom model (``wrap_bottom``, the public-key hand-over), wraps the
    top model to add its decrypted embedding shares, and encrypts cut gradients; each passive
    party's instance drives its layer's encrypted backward from the ciphertext it receives.
    """

    name = "paillier_he"
    side = "both"
    paper = ("Zhang & Zhu, Additively Homomorphical Encryption based Deep Neural Network for Asymmetrically "
             "Collaborative Machine Learning (ACML, 2020); Fu et al., BlindFL (SIGMOD 2022); the HE baselines "
             "of Table III in VMask (Tan et al., NDSS 2025)")
    protects = ("labels",)
    threat = ("label inference by the passive party from cut gradients, its bottom model's updates or weights "
              "(cryptographic protection; the price is runtime)")
    strength_param = None

    def __init__(self, *, key_bits: int = 1024, precision: int = 32, pool: int = 0) -> None:
        if not isinstance(key_bits, int) or key_bits < 512 or key_bits % 8:
            raise ValueError(f"key_bits must be a multiple of 8 and >= 512 (2048 for production), got {key_bits}")
        if not isinstance(precision, int) or not 8 <= precision <= 128:
            raise ValueError(f"precision (fractional bits) must be an integer in [8, 128], got {precision}")
        if not isinstance(pool, int) or pool < 0:
            raise ValueError(f"pool must be a number of worker processes >= 0, got {pool}")
        self.key_bits = key_bits
        self.precision = precision
        self.pool = pool

    def bind(self, context: BindContext) -> None:  # noqa: D102
        super().bind(context)
        _load_phe()
        if context.party == ACTIVE:
            self.holder_: PaillierKeyHolder | None = PaillierKeyHolder(self.key_bits, pool=self.pool)
            self.layers_: dict[str, PaillierLinear] = {}
            self.widths_: dict[str, int | None] = {}
        else:
            self.holder_ = None
            self.layer_: PaillierLinear | None = None

    @property
    def _is_active(self) -> bool:
        return self.context_.party == ACTIVE

    def attach_optimizer(self, optimizer: torch.optim.Optimizer, party: str) -> None:
        """Apply the encrypted layer's pending update whenever its party's optimizer steps."""
        layer = getattr(self, "layer_", None) if party == self.context_.party != ACTIVE else None
        if layer is None:
            return

        def after_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            for group in opt.param_groups:
                if any(p is layer.marker for p in group["params"]):
                    layer.apply_update(opt, group)

        optimizer.register_step_post_hook(after_step)

    def wrap_bottom(self, model: nn.Module, party: str) -> nn.Module:  # noqa: D102
        if self._is_active:
            if party == ACTIVE:
                layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
                self.widths_[party] = layers[-1].out_features if layers else None
                return model
            assert self.holder_ is not None
            peer = KeyHolderPeer(self.holder_, party)
            layer = _replace_last_linear(
                model, lambda lin: PaillierLinear(lin, peer=peer, precision=self.precision, pool=self.pool))
            for p in model.parameters():
                if p is not layer.marker:
                    p.requires_grad_(False)  # the plaintext extractor is frozen (see the module docstring)
            self.layers_[party] = layer
            self.widths_[party] = layer.out_features
            return model
        if party != self.context_.party:
            return model
        found = [m for m in model.modules() if isinstance(m, PaillierLinear)]
        if len(found) != 1:
            raise CompatibilityError("paillier_he: the passive party's bottom model has no encrypted layer; the "
                                     "active party's paillier_he instance must wrap it first")
        self.layer_ = found[0]
        self.layer_.generator = self.context_.generator
        return model

    def wrap_top(self, model: nn.Module) -> nn.Module:  # noqa: D102
        assert self.holder_ is not None
        passives = [p for p in self.widths_ if p != ACTIVE]
        order = ([ACTIVE] if ACTIVE in self.widths_ else []) + passives
        how = self.context_.aggregation or ("sum" if self.context_.algorithm == "vlr" else None)
        if how is None:
            layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
            widths = [self.widths_[p] for p in order]
            in_dim = layers[0].in_features if layers else None
            if in_dim is not None and None not in widths and in_dim == sum(w for w in widths if w is not None):
                how = "concat"
            elif len(order) == 1:
                how = "concat"
            else:
                raise CompatibilityError("paillier_he supports concat aggregation (vhnn/vsnn) and sum (vlr); it cannot "
                                         "tell sum from mean here (BindContext.aggregation is not set)")
        layout: list[tuple[str, int, int]] = []
        start = 0
        for party in order:
            width = self.widths_[party] or 0
            if party != ACTIVE:
                layout.append((party, start, start + width) if how == "concat" else (party, 0, 0))
            start += width
        return _ShareCombiningTop(model, _HolderRef(self.holder_), layout, how, len(order))

    def transform_cut_gradient(self, gradient: Tensor, state: StepState) -> Tensor:  # noqa: D102
        if self.holder_ is None or state.receiver not in self.layers_:
            return gradient
        cts = self.holder_.encrypt_reals(gradient.reshape(len(gradient), -1), self.precision)
        return self.holder_.ops.to_wire(cts)

    def on_received_gradient(self, gradient: Tensor, state: StepState) -> Tensor | None:  # noqa: D102
        layer = self.layer_
        if layer is None:
            return gradient
        if gradient.dtype != torch.uint8:
            raise RuntimeError("paillier_he: the passive party received a plaintext cut gradient; the active "
                               "party's paillier_he instance must be last among its defenses")
        layer.receive_gradient(layer.ops.from_wire(gradient), self.precision)
        assert state.embedding is not None
        return torch.zeros_like(state.embedding)  # the share S has no plaintext gradient; the update is encrypted

    def on_epoch_end(self, epoch: int) -> dict[str, Any]:  # noqa: D102
        if self.holder_ is not None:
            h = self.holder_
            out: dict[str, Any] = {"side_bytes_up": h.comm.bytes_up, "side_bytes_down": h.comm.bytes_down,
                                   "decrypted": sum(v for k, v in h.decrypted.items() if k != "oracle"),
                                   "encrypted": h.encrypted, "rescales": h.refreshes}
            if epoch == 0:
                out["keygen_seconds"] = h.keygen_seconds
            return out
        if getattr(self, "layer_", None) is not None:
            return {f"{k}_seconds": v for k, v in self.layer_.seconds.items()}
        return {}

    def reveal(self, party: str) -> dict[str, Tensor]:
        """Oracle for tests and evaluation (not a protocol step): ``party``'s plaintext ``W`` (in, out) and ``b``."""
        assert self.holder_ is not None
        layer = self.layers_[party]
        return {name: self.holder_.reveal(t) for name, t in layer.params.items()}
