"""The key holder: the active party's half of the Paillier protocol.

It generates the key pair, keeps the private key, and answers the passive parties' requests
(``paillier.*`` messages through the channel; it never holds a passive party's object):

* ``paillier.public_key`` (setup): a passive party announces the width of its encrypted layer and
  receives the public key ``n``;
* ``paillier.share``: ``[[h - S]]`` (ciphertext bytes, ``meta["scale"]``); the holder decrypts
  its share ``h - S`` of that party's embedding and keeps it for its own top model (an empty
  acknowledgement goes back);
* ``paillier.rescale``: masked ``[[x + R]]`` (``meta["shift"]``); the reply is the fresh
  encryption of ``floor((x + R) / 2^shift)``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vflbench.he.encoding import MAG, EncTensor, encode, signed
from vflbench.he.keys import generate_keypair, public_key_to_wire
from vflbench.he.ops import PaillierOps
from vflbench.mpc._service import DisconnectedService
from vflbench.protocol.messages import Message

NAMESPACE = "paillier"
PUBLIC_KEY = f"{NAMESPACE}.public_key"
SHARE = f"{NAMESPACE}.share"
RESCALE = f"{NAMESPACE}.rescale"


def _meta_int(request: Message, key: str) -> int:
    value = request.meta.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(
            f"{request.kind!r} request from {request.sender!r}: meta[{key!r}] must be an integer >= 0, got {value!r}"
        )
    return value


class PaillierKeyHolder:
    """The active party's key pair, decryption and shares of the passive parties' embeddings.

    The private key lives only here (name-mangled; deep copy returns this object, pickling a
    :class:`~vflbench.mpc._service.DisconnectedService`). :meth:`handle` answers the passive
    parties' requests; everything it sends back is a ciphertext or the public key.
    ``decrypted`` counts decrypted values by purpose; ``widths`` holds the embedding width each
    passive party announced at setup (the parties whose embeddings arrive as shares).
    """

    def __init__(self, key_bits: int, *, pool: int = 0) -> None:
        public, private, self.keygen_seconds = generate_keypair(key_bits)
        self.public_key = public
        self.n = int(public.n)
        self.__private = private
        self.ops = PaillierOps(public, pool=pool)
        self.ops.use_factors(private.p, private.q)  # the key holder's ops never leave this object
        self.widths: dict[str, int] = {}
        self.decrypted: dict[str, int] = defaultdict(int)
        self.encrypted = 0
        self.refreshes = 0
        self.seconds: dict[str, float] = defaultdict(float)
        self._shares: dict[str, Tensor] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> PaillierKeyHolder:  # one key pair per run, never duplicated
        return self

    def __reduce__(self) -> tuple[Any, tuple[str]]:  # never pickle the private key
        return (DisconnectedService, ("the active party's Paillier key holder",))

    def handle(self, request: Message) -> Message:
        """Answer one ``paillier.*`` request (the handler the active party serves)."""
        if request.kind == PUBLIC_KEY:
            width = _meta_int(request, "out_features")
            self.widths[request.sender] = width
            return request.reply(public_key_to_wire(self.public_key), meta={"key_bits": self.n.bit_length()})
        if request.sender not in self.widths:
            raise RuntimeError(
                f"paillier_he: {request.sender!r} sent {request.kind!r} without asking for the public "
                f"key first ({PUBLIC_KEY!r} at setup)"
            )
        if request.kind == SHARE:
            cts = self.ops.from_wire(request.payload)
            if cts.ndim != 2 or cts.shape[1] != self.widths[request.sender]:
                raise ValueError(
                    f"paillier_he: {request.sender!r} sent an embedding share of shape {cts.shape}; "
                    f"its encrypted layer has {self.widths[request.sender]} outputs"
                )
            self.accept_share(request.sender, cts, _meta_int(request, "scale"))
            return request.reply()
        if request.kind == RESCALE:
            out = self.rescale(self.ops.from_wire(request.payload), _meta_int(request, "shift"))
            return request.reply(self.ops.to_wire(out))
        raise RuntimeError(
            f"paillier_he: the key holder answers {PUBLIC_KEY!r}, {SHARE!r} and {RESCALE!r} "
            f"requests, not {request.kind!r}"
        )

    def _decrypt(self, cts: np.ndarray, purpose: str) -> list[int]:
        """Unsigned plaintexts in ``[0, n)`` (phe's CRT decryption)."""
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
        vals = [signed(v, self.n) / 2**scale for v in self._decrypt(cts, "embedding_share")]
        if any(abs(v) >= 2.0**MAG for v in vals):
            raise OverflowError(
                "paillier_he: a decrypted embedding left the fixed-point range (|h| >= 2^32); "
                "training diverged or precision/key_bits are too small"
            )
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
        vals = [signed(v, self.n) / 2**x.scale for v in self._decrypt(x.cts, "oracle")]
        return torch.tensor(vals, dtype=torch.float64).reshape(x.shape)
