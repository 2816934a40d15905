"""The two parties of VMask's masked layers and the messages between them.

Each masked layer's weight is secret-shared between the passive party P_k (party 0, whose bottom
model holds the layer) and the active party P_K (party 1). The parties share no Python objects:

* P_k holds a :class:`PassiveShareHolder` (its shares, inside its model) and, per layer, an
  :class:`ActivePeer`: its endpoint of the channel and the layer's name. Every protocol step is a
  ``vmask.<step>`` request to P_K through that endpoint (counted by the channel under its kind).
* P_K runs an :class:`ActiveShares` service: one :class:`ActiveShareHolder` (its share, the public
  scale, its noise generator) per (passive party, layer), answering those requests.
* Beaver triples come from the dealer, a third party (:class:`~vflbench.mpc.dealer.DealerService`):
  P_k asks for a fresh triple (``dealer.triple``) and gets its half and the triple's id; P_K asks
  for its half of that id (``dealer.take``).

Two protocols compute a masked layer's products (:data:`PROTOCOLS`; the layer's output ``z = op(x, W)``
is reconstructed to P_k in both, and with ``truncation: reveal`` both give the same ring value):

* ``beaver`` (the only protocol before issue 26; the one ``truncation: secureml`` needs, whose local
  truncation depends on how the product is split into shares): per product P_k shares its operand
  ``x`` (it sends ``x1``), both parties take halves of a fresh triple ``(a, b, c)`` from the dealer and
  open ``eps = x - a`` and ``delta = W - b`` to each other, and P_K sends its output share.
* ``fixed_mask`` (the default with ``truncation: reveal``, issue 26): P_k's operand is plaintext at P_k
  and P_K's share ``w1`` stays fixed while the layer stays masked, so only the cross term ``op(x, w1)``
  needs the other party. When the layer is masked (and again after a renormalisation changes ``w1``)
  P_K opens ``D = w1 - B`` to P_k once, under a fixed dealer mask ``B`` known to P_K alone; per product
  P_k takes ``C0_t`` of a triple ``(A_t, B, C_t = op(A_t, B))`` with a fresh ``A_t`` known to P_k alone
  (:mod:`vflbench.mpc.dealer`), sends ``E = x - A_t``, and P_K answers
  ``z1 = op(E, w1) + C1_t`` (+ its bias share; ``E`` travels in row blocks, each answered with its rows of
  ``z1`` as it arrives, so that the link carries one block while P_K computes on another: ``row_blocks``);
  P_k adds ``op(x, w0) + op(A_t, D) + C0_t`` (+ its bias
  share): ``op(x, w0) + op(A_t, w1 - B) + op(A_t, B) + op(x - A_t, w1) = op(x, W)``. What each party sees
  is argued in docs/decisions/vmask.md (issue 26): P_K sees the same kind of opening of P_k's operand as before
  and nothing of P_k's share; P_k sees one uniformly masked ``w1 - B`` per masking where ``beaver`` showed it
  ``W - b`` per product, and P_K's output share, which it can compute from the output it receives anyway.

Requests (P_k -> P_K; the header ``meta`` names the layer, the triple id, the stage):

* ``vmask.share``: P_K's weight (and bias) share (Algorithm 1 lines 2-4) and the layer's public
  geometry; the reply is empty (``beaver``), or ``D`` (``fixed_mask``: the header names the mask, whose seed
  P_K takes from the dealer with ``dealer.take_mask``).
* ``vmask.forward`` / ``vmask.backward``: ``beaver``: P_k's share of the operand and its Beaver openings
  ``e0, d0``; the reply carries P_K's openings ``e1, d1`` and its output share. ``fixed_mask``: a block of
  ``E``'s rows (the header names its first row and the operand's rows, ``row`` and ``rows``, when it is not the
  whole operand); the reply carries those rows of ``z1``.
* ``vmask.decay`` / ``vmask.renormalize``: the public decay factor / the number of bits; empty reply
  (``fixed_mask``'s renormalisation names a new mask and its reply carries the new ``D``).
* ``vmask.release``: the noise scale (Algorithm 1 lines 7-10); the reply carries P_K's noised shares.
* ``vmask.oracle``: EVALUATION ONLY (scoring an attack, ``eval`` phase), never part of the protocol;
  the reply carries P_K's shares.

Every tensor is an int64 ring element (8 bytes) or an 8-byte scalar; with ``beaver`` the channel's byte
counts are what :class:`~vflbench.mpc.comm.Comm` counted when both parties lived in one object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from vflbench.mpc._service import ServiceHandle
from vflbench.mpc.dealer import (
    Dealer,
    DealerService,
    TripleReuseError,
    TripleShare,
    output_share,
    weight_mask,
)
from vflbench.mpc.protocol import (
    BilinearSpec,
    Meta,
    Stage,
    add_bias_share,
    layer_spec,
    meta_shape,
    party_combine,
    party_masks,
    shape_meta,
    truncate_share,
)
from vflbench.mpc.ring import encode
from vflbench.protocol.channel import Asked, Channel, Endpoint
from vflbench.protocol.messages import ACTIVE, DEALER, Message, Phase, Scalar

#: The kinds of VMask's secret-sharing protocol (what ``mpc_bytes`` sums; ``vmask.oracle`` is not one).
PROTOCOL_KINDS = ("vmask.share", "vmask.forward", "vmask.backward", "vmask.decay", "vmask.renormalize", "vmask.release")

Protocol = Literal["fixed_mask", "beaver"]
PROTOCOLS: tuple[str, ...] = ("fixed_mask", "beaver")
"""How a masked layer's products are computed (see the module doc)."""


def resolve_protocol(protocol: str | None, truncation: str) -> Protocol:
    """The protocol a masked layer uses: ``protocol``, or by default ``fixed_mask`` with ``truncation: reveal`` and
    ``beaver`` with ``secureml`` (the only one that keeps secureml's numbers: its local truncation depends on how
    the product is split into shares). ``fixed_mask`` with ``secureml`` is refused."""
    if protocol is None:
        return "fixed_mask" if truncation == "reveal" else "beaver"
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown masked-layer protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    if protocol == "fixed_mask" and truncation != "reveal":
        raise ValueError(
            f"the fixed_mask protocol reconstructs the untruncated product (truncation 'reveal'); "
            f"truncation {truncation!r} needs protocol 'beaver'"
        )
    return "fixed_mask" if protocol == "fixed_mask" else "beaver"


ROW_BLOCKS = 4
"""The row blocks a ``fixed_mask`` product's operand travels in by default (docs/performance.md, issue 26)."""


def resolve_row_blocks(row_blocks: int | None, protocol: Protocol) -> int:
    """The row blocks each product's operand travels in (see the module doc): ``row_blocks``, or by default
    :data:`ROW_BLOCKS` with ``fixed_mask`` and one with ``beaver``, whose products open both operands at once
    (more than one is refused there)."""
    if row_blocks is None:
        return ROW_BLOCKS if protocol == "fixed_mask" else 1
    if isinstance(row_blocks, bool) or not isinstance(row_blocks, int) or row_blocks < 1:
        raise ValueError(f"row_blocks must be a whole number >= 1, got {row_blocks!r}")
    if protocol != "fixed_mask" and row_blocks != 1:
        raise ValueError(
            f"row_blocks {row_blocks} needs the fixed_mask protocol; the {protocol} protocol sends each operand whole"
        )
    return row_blocks


def on_device(t: TripleShare, device: torch.device) -> TripleShare:
    """A triple half moved to ``device``."""
    if t.a.device == device:
        return t
    return TripleShare(t.triple_id, t.kind, t.party, t.a.to(device), t.b.to(device), t.c.to(device))


def triple_half(reply: Message, party: int) -> TripleShare:
    """The triple half a dealer reply carries."""
    a, b, c = reply.tensors
    return TripleShare(int(reply.meta["triple"]), str(reply.meta["kind"]), party, a, b, c)  # type: ignore[arg-type]


class PartyRandomness(ServiceHandle):
    """A party's private random source (a ``torch.Generator``), shared by all copies of its model.

    Deep-copying a ``torch.Generator`` clones its state; two copies of a model would then draw the
    same input shares and the other party could subtract them. As a service handle this object is
    never cloned.
    """

    def __init__(self, generator: torch.Generator, *, party: str) -> None:
        self.generator = generator
        self.party = party

    def __repr__(self) -> str:
        return f"PartyRandomness({self.party})"


# ------------------------------------------------------------------------------------------------
# The active party


class ActiveShareHolder:
    """P_K's state for one masked layer: its weight and bias shares, the public scale, the layer's
    public geometry and P_K's noise generator. Its methods are P_K's side of each protocol step."""

    def __init__(
        self,
        *,
        name: str,
        geometry: Meta,
        frac_bits: int,
        truncation: str,
        generator: torch.Generator,
        record_received: bool = False,
    ) -> None:
        self.name = name
        self.geometry = dict(geometry)
        self.frac_bits = frac_bits
        self.truncation = truncation
        self.generator = generator
        self.weight_share: Tensor | None = None
        self.bias_share: Tensor | None = None
        self.scale = 1.0
        self.mask_id: int | None = None
        """The dealer's fixed weight mask of the ``fixed_mask`` protocol (``None``: ``beaver``)."""
        self.mask_seed: int | None = None
        """P_K's seed of that mask (its ``B`` and its output shares ``C1_t``)."""
        self.last_triple = -1
        """The last fixed-mask triple used: every product needs a later one (triple ids only grow)."""
        self._next_row = 0
        self._rows = 0
        self._output_share: Tensor | None = None
        """``C1`` of the product whose row blocks are coming (its rows ``_next_row`` to ``_rows`` are to come)."""
        self.record_received = record_received
        self.received: list[tuple[str, Tensor]] = []
        """What P_K received (tag, ring tensor), logged when ``record_received``."""

    def __repr__(self) -> str:
        return f"ActiveShareHolder({self.name})"

    def _log(self, tag: str, *tensors: Tensor) -> None:
        if self.record_received:
            self.received.extend((tag, t.detach().clone()) for t in tensors)

    def require(self) -> Tensor:
        """P_K's weight share (an error once the layer is unmasked)."""
        if self.weight_share is None:
            raise RuntimeError(f"layer {self.name!r} has no active share (not masked, or already unmasked)")
        return self.weight_share

    def _noise(self, shape: torch.Size, sigma: float) -> Tensor:
        """Encoded ``N(0, sigma^2)`` noise in the effective weight's units (divided by the scale)."""
        if sigma == 0:
            return torch.zeros(shape, dtype=torch.int64)
        r = torch.randn(tuple(shape), generator=self.generator, dtype=torch.float64) * sigma / self.scale
        return encode(r, self.frac_bits)

    def accept_shares(self, w1: Tensor, b1: Tensor | None, *, sigma: float) -> None:
        """Algorithm 1 lines 4-6: keep P_K's share of the weight (and bias) plus Gaussian noise."""
        self._log("weight_share", w1, *(() if b1 is None else (b1,)))
        self.weight_share = w1 + self._noise(w1.shape, sigma).to(w1.device)
        self.bias_share = None if b1 is None else b1 + self._noise(b1.shape, sigma).to(b1.device)

    def spec(self, stage: Stage, operand: torch.Size, input_size: tuple[int, int] | None) -> BilinearSpec:
        """The layer's shared product of ``stage`` (derived by P_K from public values only)."""
        return layer_spec(self.geometry, stage, operand, self.require().shape, input_size)

    def bilinear(
        self, spec: BilinearSpec, x1: Tensor, e0: Tensor, d0: Tensor, t1: TripleShare, *, tag: str
    ) -> tuple[Tensor, Tensor, Tensor]:
        """P_K's side of a shared product: returns its openings ``(e1, d1)`` and its output share."""
        self._log(tag, x1, e0, d0)
        w1 = self.require().to(x1.device)
        t1 = on_device(t1, x1.device)
        e1, d1 = party_masks(x1, spec.weight_operand(w1), t1)
        eps, delta = e0 + e1, d0 + d1
        z1 = party_combine(1, eps, delta, t1, spec.op)
        b1 = self.bias_share.to(x1.device) if (spec.bias_view is not None and self.bias_share is not None) else None
        z1 = add_bias_share(z1, b1, spec, 1, self.truncation, self.frac_bits)
        return e1, d1, z1

    def set_mask(self, mask_id: int, seed: int) -> Tensor:
        """Start the ``fixed_mask`` protocol under the dealer's mask ``mask_id`` (P_K's ``seed``): returns the
        opening ``D = w1 - B`` for P_k, the only time P_K's current share is opened."""
        w1 = self.require()
        self.mask_id, self.mask_seed = int(mask_id), int(seed)
        return w1 - weight_mask(seed, w1.shape, device=w1.device)

    def masked_product(
        self, spec: BilinearSpec, e: Tensor, triple_id: int, *, tag: str, row: int = 0, rows: int | None = None
    ) -> Tensor:
        """P_K's side of a ``fixed_mask`` product: ``op(E, w1) + C1_t`` (+ its bias share) for P_k.

        ``e`` is the operand's rows ``row`` to ``row + len(e)`` of ``rows`` (``None``: all of them, ``e`` is the
        whole operand): a product's row blocks come in order, each row once, and each is answered alone."""
        self._log(tag, e)
        if self.mask_seed is None:
            raise RuntimeError(f"layer {self.name!r} uses the beaver protocol; a fixed_mask product needs a mask")
        n = e.shape[0] if rows is None else int(rows)
        stop = row + e.shape[0]
        if not 0 <= row < stop <= n:
            raise ValueError(f"layer {self.name!r}: rows {row}..{stop} are not a block of an operand of {n} rows")
        if row == 0:
            if triple_id <= self.last_triple:
                raise TripleReuseError(
                    f"layer {self.name!r}: triple {triple_id} is not later than the last one used "
                    f"({self.last_triple}); a triple is used once"
                )
            self._output_share = None
        elif not (triple_id == self.last_triple and row == self._next_row and n == self._rows):
            raise TripleReuseError(
                f"layer {self.name!r}: rows {row}..{stop} of {n} of triple {triple_id} do not follow the last rows "
                f"used (up to row {self._next_row} of {self._rows} of triple {self.last_triple}); a triple's rows "
                "come once, in order"
            )
        self.last_triple, self._next_row, self._rows = int(triple_id), stop, n
        w1 = self.require().to(e.device)
        z1 = spec.op(e, spec.weight_operand(w1))
        if self._output_share is None:
            self._output_share = output_share(self.mask_seed, triple_id, (n, *z1.shape[1:]), device=e.device)
        z1 += self._output_share[row:stop]
        if stop == n:
            self._output_share = None
        b1 = self.bias_share.to(e.device) if (spec.bias_view is not None and self.bias_share is not None) else None
        return add_bias_share(z1, b1, spec, 1, "reveal", self.frac_bits)

    def decay(self, factor: float) -> None:
        """Public decay of the effective weight: the scale is multiplied by ``factor``."""
        self.scale *= factor

    def renormalize(self, bits: int) -> None:
        """Divide P_K's shares by ``2^bits`` (SecureML local truncation) as the scale grows by it."""
        self.weight_share = truncate_share(self.require(), 1, bits)
        if self.bias_share is not None:
            self.bias_share = truncate_share(self.bias_share, 1, bits)
        self.scale *= 2.0**bits

    def release(self, *, sigma: float) -> tuple[Tensor, Tensor | None]:
        """Algorithm 1 lines 9-10: add fresh noise to P_K's shares, hand them over and forget them."""
        w1 = self.require()
        w1 = w1 + self._noise(w1.shape, sigma).to(w1.device)
        b1 = (
            None
            if self.bias_share is None
            else self.bias_share + self._noise(self.bias_share.shape, sigma).to(w1.device)
        )
        self.weight_share, self.bias_share = None, None
        self.mask_id = self.mask_seed = None
        return w1, b1


NoiseSource = Callable[[str, str], torch.Generator]
"""``(passive party, layer name) -> generator`` of P_K's noise for a layer being masked."""


class ActiveShares:
    """P_K's side of every masked layer: answers P_k's ``vmask.*`` requests (see the module doc).

    ``noise``: P_K's noise generator for a newly masked layer; ``sigma``: P_K's noise scale (``None``:
    the scale the request names, for standalone use); ``triples``: the Beaver triples P_K took.
    P_K fetches its triple halves from the dealer through ``link``. :meth:`serve` registers
    :meth:`handle` for the ``vmask`` namespace; a defense that serves more ``vmask`` requests calls
    :meth:`handle` from its own handler instead.
    """

    def __init__(
        self, link: Endpoint, *, noise: NoiseSource, sigma: float | None = None, record_received: bool = False
    ) -> None:
        self.link = link
        self.noise = noise
        self.sigma = sigma
        self.record_received = record_received
        self.holders: dict[tuple[str, str], ActiveShareHolder] = {}
        self.triples = 0

    def serve(self) -> ActiveShares:
        """Answer ``vmask.*`` requests at ``link`` with :meth:`handle`."""
        self.link.serve("vmask", self.handle)
        return self

    def holder(self, party: str, layer: str) -> ActiveShareHolder:
        """P_K's holder of ``party``'s layer ``layer``."""
        try:
            return self.holders[(party, layer)]
        except KeyError:
            raise KeyError(f"no masked layer {layer!r} of {party!r} at the active party") from None

    def _sigma(self, requested: float) -> float:
        return requested if self.sigma is None else self.sigma

    def _open(self, holder: ActiveShareHolder, request: Message) -> Message:
        """The reply of a ``fixed_mask`` (re)masking: P_K takes its seed of the mask the header names from the
        dealer and answers with ``D`` (``beaver``: an empty reply)."""
        if request.meta.get("mask") is None:
            return request.reply()
        mask_id = int(request.meta["mask"])  # type: ignore[arg-type]
        taken = self.link.call(
            "dealer.take_mask",
            DEALER,
            meta={"mask": mask_id, "party": request.sender, "layer": str(request.meta["layer"])},
            phase=request.phase,
        )
        return request.reply(holder.set_mask(mask_id, int(taken.payload[0])))

    def handle(self, request: Message) -> Message:
        """Answer one ``vmask.<step>`` request of a passive party."""
        meta, step = request.meta, request.kind.split(".", 1)[1]
        name = str(meta["layer"])
        if step == "share":
            holder = ActiveShareHolder(
                name=f"{request.sender}.{name}",
                geometry={k: v for k, v in meta.items() if k in ("kind", "stride", "padding")},
                frac_bits=int(meta["frac_bits"]),  # type: ignore[arg-type]
                truncation=str(meta["truncation"]),  # type: ignore[arg-type]
                generator=self.noise(request.sender, name),
                record_received=self.record_received,
            )
            w1, *rest = request.tensors
            holder.accept_shares(w1, rest[0] if meta.get("bias") else None, sigma=self._sigma(float(meta["sigma"])))  # type: ignore[arg-type]
            self.holders[(request.sender, name)] = holder
            return self._open(holder, request)
        holder = self.holder(request.sender, name)
        if step in ("forward", "backward"):
            operand = request.tensors[0]
            size = meta_shape(meta["input_size"]) if meta.get("input_size") else None
            spec = holder.spec(step, operand.shape, None if size is None else (size[0], size[1]))  # type: ignore[arg-type]
            if holder.mask_seed is not None:
                row = int(meta.get("row", 0))  # type: ignore[arg-type]
                z1 = holder.masked_product(
                    spec,
                    operand,
                    int(meta["triple"]),  # type: ignore[arg-type]
                    tag=step,
                    row=row,
                    rows=None if meta.get("rows") is None else int(meta["rows"]),  # type: ignore[arg-type]
                )
                self.triples += row == 0  # a triple's first row block
                return request.reply(z1)
            x1, e0, d0 = request.tensors
            taken = self.link.call("dealer.take", DEALER, meta={"triple": meta["triple"]}, phase=request.phase)
            self.triples += 1
            e1, d1, z1 = holder.bilinear(spec, x1, e0, d0, triple_half(taken, 1), tag=step)
            return request.reply(e1, d1, z1)
        if step == "decay":
            holder.decay(float(request.payload))
            return request.reply()
        if step == "renormalize":
            holder.renormalize(int(request.payload))
            return self._open(holder, request)
        if step == "release":
            w1, b1 = holder.release(sigma=self._sigma(float(request.payload)))
            return request.reply(w1, *(() if b1 is None else (b1,)))
        if step == "oracle":
            w1 = holder.require().clone()
            return request.reply(w1, *(() if holder.bias_share is None else (holder.bias_share.clone(),)))
        raise ValueError(
            f"unknown VMask request {request.kind!r}; valid: {', '.join((*PROTOCOL_KINDS, 'vmask.oracle'))}"
        )


def _mask_meta(mask: int | None) -> dict[str, int]:
    """The header naming a weight mask (none for ``beaver``, whose messages stay as they were)."""
    return {} if mask is None else {"mask": int(mask)}


class ActivePeer(ServiceHandle):
    """P_k's handle to the active party for one masked layer: its own endpoint and the layer's name.

    Every call is a request through the channel (arguments travel as the request's tensors and
    header, results come back in the reply), counted under its kind. It holds nothing of P_K's
    state. Deep copy returns the same handle; pickling yields a disconnected stub.
    """

    def __init__(self, link: Endpoint, layer: str) -> None:
        self.link = link
        self.layer = layer

    def __repr__(self) -> str:
        return f"ActivePeer({self.link.owner}.{self.layer})"

    def _call(self, step: str, *tensors: Tensor, phase: Phase, **meta: int | float | str | bool | None) -> Message:
        return self.link.call(f"vmask.{step}", ACTIVE, *tensors, meta={"layer": self.layer, **meta}, phase=phase)

    def share_weights(
        self,
        w1: Tensor,
        b1: Tensor | None,
        *,
        geometry: Meta,
        sigma: float,
        frac_bits: int,
        truncation: str,
        phase: Phase,
        mask: int | None = None,
    ) -> Tensor | None:
        """P_k sends P_K its weight (and bias) share and the layer's public geometry (Algorithm 1). With the dealer's
        weight mask ``mask`` (``fixed_mask``) P_K answers with the opening ``D`` of its share, returned."""
        reply = self._call(
            "share",
            w1,
            *(() if b1 is None else (b1,)),
            phase=phase,
            bias=b1 is not None,
            sigma=sigma,
            frac_bits=frac_bits,
            truncation=truncation,
            **_mask_meta(mask),
            **geometry,
        )
        return None if mask is None else reply.payload

    def open_mask(self, shape: torch.Size | tuple[int, ...], *, phase: Phase) -> tuple[int, int]:
        """A fresh fixed weight mask for this layer from the dealer (``fixed_mask``): its id and P_k's seed."""
        reply = self.link.call(
            "dealer.mask", DEALER, meta={"layer": self.layer, "shape": shape_meta(shape)}, phase=phase
        )
        return int(reply.meta["mask"]), int(reply.payload[0])  # type: ignore[arg-type]

    def triple(self, spec: BilinearSpec, *, phase: Phase) -> TripleShare:
        """P_k's half of a fresh Beaver triple for ``spec``, from the dealer."""
        return triple_half(self.link.call("dealer.triple", DEALER, meta=spec.triple, phase=phase), 0)

    def masked_triple(self, spec: BilinearSpec, mask: int, *, phase: Phase) -> tuple[int, Tensor]:
        """A fresh fixed-mask triple for ``spec`` against weight mask ``mask``: its id and P_k's share ``C0_t``."""
        return self.masked_triple_answer(self.ask_masked_triple(spec, mask, phase=phase))

    def ask_masked_triple(self, spec: BilinearSpec, mask: int, *, phase: Phase) -> Asked:
        """Ask the dealer for a fixed-mask triple as :meth:`masked_triple` does, without waiting for it: the dealer
        deals it while P_k goes on (:meth:`masked_triple_answer` takes it)."""
        return self.link.ask(
            "dealer.triple", DEALER, meta={**spec.triple, "mask": mask, "transpose": spec.transpose}, phase=phase
        )

    def masked_triple_answer(self, asked: Asked) -> tuple[int, Tensor]:
        """The id and ``C0_t`` of the triple :meth:`ask_masked_triple` asked for."""
        reply = self.link.answer(asked)
        return int(reply.meta["triple"]), reply.payload  # type: ignore[arg-type]

    def product(
        self, stage: Stage, e: Tensor, triple_id: int, *, phase: Phase, input_size: tuple[int, int] | None = None
    ) -> Tensor:
        """One ``fixed_mask`` product: P_k sends its masked operand ``E``; P_K answers with ``z1``."""
        return self.product_answer(self.ask_product(stage, e, triple_id, phase=phase, input_size=input_size))

    def ask_product(
        self,
        stage: Stage,
        e: Tensor,
        triple_id: int,
        *,
        phase: Phase,
        input_size: tuple[int, int] | None = None,
        row: int = 0,
        rows: int | None = None,
    ) -> Asked:
        """:meth:`product`'s request, without waiting for P_K's answer (:meth:`product_answer` takes it). ``e`` may
        be the operand's rows ``row`` to ``row + len(e)`` of ``rows`` (a row block; ``rows=None``: the whole
        operand)."""
        size = "" if input_size is None else f"{input_size[0]},{input_size[1]}"
        meta: dict[str, Scalar] = {"layer": self.layer, "triple": triple_id, "input_size": size}
        if rows is not None:
            meta.update(row=row, rows=rows)
        return self.link.ask(f"vmask.{stage}", ACTIVE, e, meta=meta, phase=phase)

    def product_answer(self, asked: Asked) -> Tensor:
        """P_K's output share ``z1`` of the product :meth:`ask_product` sent."""
        return self.link.answer(asked).payload

    def bilinear(
        self,
        stage: Stage,
        x1: Tensor,
        e0: Tensor,
        d0: Tensor,
        triple_id: int,
        *,
        phase: Phase,
        input_size: tuple[int, int] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One shared product: P_k sends its share ``x1`` of the operand and its Beaver openings; P_K
        answers with its openings and its output share."""
        size = "" if input_size is None else f"{input_size[0]},{input_size[1]}"
        reply = self._call(stage, x1, e0, d0, phase=phase, triple=triple_id, input_size=size)
        e1, d1, z1 = reply.tensors
        return e1, d1, z1

    def decay(self, factor: float, *, phase: Phase) -> None:
        """Tell P_K the public decay factor (a control message)."""
        self._call("decay", torch.tensor([factor], dtype=torch.float64), phase=phase)

    def renormalize(self, bits: int, *, phase: Phase, mask: int | None = None) -> Tensor | None:
        """Ask P_K to divide its shares by ``2^bits`` (a control message); with a new weight mask ``mask``
        (``fixed_mask``: P_K's share changed) P_K answers with its new opening ``D``, returned."""
        reply = self._call("renormalize", torch.tensor([bits], dtype=torch.int64), phase=phase, **_mask_meta(mask))
        return None if mask is None else reply.payload

    def release(self, *, sigma: float, phase: Phase) -> tuple[Tensor, Tensor | None]:
        """Unmasking: P_K adds fresh noise and sends its shares to P_k."""
        reply = self._call("release", torch.tensor([sigma], dtype=torch.float64), phase=phase)
        w1, *rest = reply.tensors
        return w1, (rest[0] if rest else None)

    def oracle_shares(self) -> tuple[Tensor, Tensor | None]:
        """EVALUATION ONLY: P_K's current shares (a simulation oracle to score an attack, counted as
        ``vmask.oracle`` in the evaluation phase; not part of the protocol, never used by inference)."""
        reply = self._call("oracle", phase="eval")
        w1, *rest = reply.tensors
        return w1, (rest[0] if rest else None)


# ------------------------------------------------------------------------------------------------
# The passive party


class PassiveShareHolder(nn.Module):
    """P_k's state for one masked layer.

    Buffers: ``weight_share`` / ``bias_share`` (int64 ring shares of the weight divided by the
    public ``scale``), ``scale`` (float64, public), ``residual_*`` (the part of past updates below
    the ring's resolution, float64, |.| <= 2^-(f+1)), ``momentum_*`` (the momentum of the plaintext
    gradients, used by :meth:`~vflbench.mpc.layers.SharedLayer.step`). Parameters: ``weight_offset`` /
    ``bias_offset``, P_k's plaintext additive part of the weight, zero except between a torch
    optimizer's step and the next forward (see :mod:`vflbench.mpc.layers`). With ``fixed_mask``
    (the ``fixed_mask`` protocol, see the module doc) also ``weight_opening`` (``D = w1 - B``, int64),
    ``mask_id`` and ``mask_seed`` (P_k's seed of the dealer's mask; int64 scalars).
    """

    weight_share: Tensor
    bias_share: Tensor | None
    scale: Tensor
    residual_weight: Tensor
    residual_bias: Tensor | None
    momentum_weight: Tensor | None
    momentum_bias: Tensor | None
    weight_offset: nn.Parameter
    bias_offset: nn.Parameter | None
    weight_opening: Tensor | None
    mask_id: Tensor | None
    mask_seed: Tensor | None

    def __init__(
        self,
        weight_share: Tensor,
        bias_share: Tensor | None,
        *,
        frac_bits: int,
        dtype: torch.dtype,
        fixed_mask: bool = False,
    ) -> None:
        super().__init__()
        self.frac_bits = frac_bits
        self.fixed_mask = fixed_mask
        self.register_buffer("weight_share", weight_share)
        self.register_buffer("bias_share", bias_share)
        self.register_buffer("scale", torch.tensor(1.0, dtype=torch.float64, device=weight_share.device))
        self.register_buffer(
            "residual_weight", torch.zeros(weight_share.shape, dtype=torch.float64, device=weight_share.device)
        )
        self.register_buffer(
            "residual_bias",
            None
            if bias_share is None
            else torch.zeros(bias_share.shape, dtype=torch.float64, device=bias_share.device),
        )
        self.register_buffer("momentum_weight", None)
        self.register_buffer("momentum_bias", None)
        self.weight_offset = nn.Parameter(torch.zeros(weight_share.shape, dtype=dtype, device=weight_share.device))
        self.bias_offset = (
            None
            if bias_share is None
            else nn.Parameter(torch.zeros(bias_share.shape, dtype=dtype, device=bias_share.device))
        )
        self.register_buffer("weight_opening", torch.zeros_like(weight_share) if fixed_mask else None)
        self.register_buffer("mask_id", torch.tensor(-1, dtype=torch.int64) if fixed_mask else None)
        self.register_buffer("mask_seed", torch.tensor(0, dtype=torch.int64) if fixed_mask else None)

    @torch.no_grad()
    def set_opening(self, mask_id: int, seed: int, opening: Tensor) -> None:
        """Keep a new weight mask's id, P_k's seed and P_K's opening ``D`` (``fixed_mask``)."""
        if self.weight_opening is None or self.mask_id is None or self.mask_seed is None:
            raise RuntimeError("this layer uses the beaver protocol: it keeps no weight opening")
        self.weight_opening.copy_(opening)
        self.mask_id.fill_(int(mask_id))
        self.mask_seed.fill_(int(seed))

    def entries(self) -> Iterator[tuple[str, Tensor | None, nn.Parameter | None]]:
        """``(suffix, share, offset)`` for the weight and the bias."""
        yield "weight", self.weight_share, self.weight_offset
        yield "bias", self.bias_share, self.bias_offset

    @torch.no_grad()
    def apply_update(self, which: str, delta: Tensor) -> None:
        """Add ``delta`` (float, in effective-weight units) to the shared weight via P_k's share only."""
        share_t: Tensor = getattr(self, f"{which}_share")
        resid: Tensor = getattr(self, f"residual_{which}")
        scale = float(self.scale)
        # float32 + float64 promotes exactly, so ``resid + delta`` needs no separate cast
        r = resid + (delta if scale == 1.0 else delta.to(torch.float64) / scale)
        q = encode(r, self.frac_bits)
        share_t.add_(q)
        # the residual r - q 2^-f is exactly representable, so computing it in one op changes nothing
        torch.sub(r, q.to(torch.float64), alpha=2.0**-self.frac_bits, out=resid)

    @torch.no_grad()
    def absorb(self) -> None:
        """Fold the plaintext offsets into P_k's share and zero them."""
        for which, share_t, off in self.entries():
            if share_t is None or off is None or not bool(off.any()):
                continue
            self.apply_update(which, off)
            off.zero_()


# ------------------------------------------------------------------------------------------------
# A two-party session outside a federation (tests, benchmarks)


@dataclass
class LocalSession:
    """A channel joining one passive party, the active party's :class:`ActiveShares` and a dealer.

    For masked layers used outside a federation: pass ``passive`` to
    :func:`~vflbench.mpc.layers.mask_layer`; ``channel.stats`` counts the traffic by kind.
    """

    channel: Channel
    passive: Endpoint
    active: ActiveShares
    dealer: Dealer


def local_session(
    dealer: Dealer | int,
    *,
    noise: NoiseSource | torch.Generator | None = None,
    record_active_inbox: bool = False,
    passive: str = "passive_1",
) -> LocalSession:
    """Connect a passive party, the active party and the dealer ``dealer`` (or a seed) by a channel.

    ``noise``: the active party's noise generator (one for all layers) or a per-layer source
    (default: seeded 0).
    """
    channel = Channel()
    source: NoiseSource
    if noise is None or isinstance(noise, torch.Generator):
        shared = noise if noise is not None else torch.Generator().manual_seed(0)

        def source(party: str, layer: str) -> torch.Generator:
            return shared
    else:
        source = noise
    dealer = dealer if isinstance(dealer, Dealer) else Dealer(dealer)
    DealerService(dealer, channel.endpoint(DEALER))
    active = ActiveShares(channel.endpoint(ACTIVE), noise=source, record_received=record_active_inbox).serve()
    return LocalSession(channel, channel.endpoint(passive), active, dealer)
