"""A seeded trusted dealer of Beaver triples (Beaver, CRYPTO'91; CrypTen's trusted third party).

For a bilinear operation ``op`` (elementwise mul, matmul, the im2col matmul of a convolution, or
the transposed convolution of its input gradient) the dealer draws ``a`` and ``b`` uniformly
from Z_2^64, computes ``c = op(a, b)`` and hands each party an additive share of ``(a, b, c)``.

Who may deal. In VMask the weight of a masked layer is shared between the passive party P_k
and the active party P_K, and a Beaver multiplication opens ``delta = W - b`` to both parties.
Whoever knows ``b`` therefore learns ``W``; likewise knowing ``a`` unmasks the passive party's
layer input from ``eps = x - a``. So the dealer must be neither party: not the active party
(it would learn the passive party's inputs, systems.md section 3) and not the passive party
either (it would learn the masked weight, defeating VMask). ``role`` records who runs the
dealer and the constructor refuses ``"active"`` and ``"passive"``.

Triples are single use: reusing ``b`` against a changing weight reveals ``W_t - W_{t-1}``.
Every triple has an id; each party takes its half exactly once (:meth:`Dealer.take`) and the
protocol marks it used exactly once (:meth:`Dealer.consume`); a second use raises
:class:`TripleReuseError`.

In a federation the dealer is a party of its own (:data:`~vflbench.protocol.messages.DEALER`):
:class:`DealerService` answers ``dealer.triple`` requests of P_k (a fresh triple described by the
request's header; the reply is P_k's half and the triple's id) and ``dealer.take`` requests of P_K
(its half of that triple). Each party receives only its own half, through counted messages.

Fixed weight masks (the ``fixed_mask`` protocol of :mod:`vflbench.mpc.parties`, issue 26). P_k knows its
layer input in plaintext and P_K's weight share stays fixed while a layer stays masked, so a product
``op(x, W)`` needs a triple ``(A, B, C = op(A, B))`` whose ``A`` belongs to P_k alone (P_k learns ``A =
x - (x - A)`` from any Beaver opening of its own input anyway) and whose ``B`` belongs to P_K alone and is
fixed for one masking of the layer (it masks only P_K's fixed share; P_k's share, which changes every step,
is never opened). :meth:`Dealer.open_mask` starts a mask for a layer: two fresh seeds from the dealer's
generator, one for P_k (``dealer.mask``) and one for P_K (``dealer.take_mask``, once); ``B`` is drawn from
P_K's seed. Per product :meth:`Dealer.issue_masked` deals a triple with a fresh id ``t``: ``A_t`` drawn
from P_k's seed and ``t``, P_K's share ``C1_t`` from P_K's seed and ``t``, and only P_k's share
``C0_t = op(A_t, B) - C1_t`` travels (CrypTen's trusted third party also sends only the correcting
share). :func:`weight_mask`, :func:`operand_mask` and :func:`output_share` are those draws, made the same way
by the dealer and the party that holds the seed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from vflbench.mpc._service import ServiceHandle
from vflbench.mpc.ring import ring_conv2d, ring_conv2d_input_grad, ring_matmul, uniform
from vflbench.protocol.channel import Endpoint
from vflbench.protocol.messages import ACTIVE, Message
from vflbench.rng import derive_seed

FORBIDDEN_DEALER_ROLES = ("active", "passive")
SEED_MASK = (1 << 63) - 1


Device = torch.device | str | None


def _draw(seed: int, shape: tuple[int, ...] | torch.Size, *path: str | int, device: Device) -> Tensor:
    return uniform(tuple(shape), torch.Generator().manual_seed(derive_seed(seed, *path)), device=device)


def weight_mask(seed: int, shape: tuple[int, ...] | torch.Size, *, device: Device = None) -> Tensor:
    """The fixed mask ``B`` of a masked layer's active share, drawn (on the CPU, then moved to ``device``) from the
    active party's seed of the mask."""
    return _draw(seed, shape, "weight", device=device)


def operand_mask(seed: int, triple_id: int, shape: tuple[int, ...] | torch.Size, *, device: Device = None) -> Tensor:
    """``A_t`` of fixed-mask triple ``triple_id``, drawn from the passive party's seed of the mask."""
    return _draw(seed, shape, "operand", int(triple_id), device=device)


def output_share(seed: int, triple_id: int, shape: tuple[int, ...] | torch.Size, *, device: Device = None) -> Tensor:
    """The active party's share ``C1_t`` of ``op(A_t, B)``, drawn from its seed of the mask."""
    return _draw(seed, shape, "output", int(triple_id), device=device)


@dataclass
class WeightMask:
    """A fixed weight mask the dealer holds for one masking of one layer (see the module doc): its id, the passive
    party and layer it belongs to, the weight's shape, the two seeds and whether the active party took its seed."""

    mask_id: int
    owner: str
    layer: str
    shape: tuple[int, ...]
    passive_seed: int = field(repr=False)
    active_seed: int = field(repr=False)
    taken: bool = False

    def as_dict(self) -> dict[str, object]:
        """Plain values for a checkpoint."""
        return {
            "mask_id": self.mask_id,
            "owner": self.owner,
            "layer": self.layer,
            "shape": list(self.shape),
            "passive_seed": self.passive_seed,
            "active_seed": self.active_seed,
            "taken": self.taken,
        }


class TripleReuseError(RuntimeError):
    """A Beaver triple (or one party's half of it) was taken or used twice."""


@dataclass(frozen=True)
class TripleShare:
    """One party's share of a Beaver triple ``(a, b, c = op(a, b))``."""

    triple_id: int
    kind: str
    party: int
    a: Tensor = field(repr=False)
    b: Tensor = field(repr=False)
    c: Tensor = field(repr=False)


class Dealer(ServiceHandle):
    """Seeded trusted third party issuing fresh single-use Beaver triples.

    Args:
        seed: an int seed or a ``torch.Generator`` (all of the dealer's randomness comes from it).
        name: a label for logs and errors.
        role: who runs the dealer; anything but ``"active"`` or ``"passive"`` (see module doc).
        device: where the triples are computed and delivered. The random ring elements are drawn on the CPU
            from the (CPU) generator and moved there, so a triple is the same on every device; ``c = op(a, b)``
            is computed there (exact ring arithmetic: int64 on the CPU, 16-bit limbs on CUDA).
    """

    def __init__(
        self,
        seed: int | torch.Generator,
        *,
        name: str = "dealer",
        role: str = "third_party",
        device: torch.device | str | None = None,
    ) -> None:
        if role in FORBIDDEN_DEALER_ROLES:
            raise ValueError(
                f"the Beaver-triple dealer cannot be the {role} party: knowing the triples' masks it would "
                "unmask the other party's shares (active: the passive party's layer inputs; passive: the "
                "masked weights). Use a third party (role='third_party')."
            )
        assert role not in FORBIDDEN_DEALER_ROLES
        self.name = name
        self.role = role
        self.device = torch.device(device) if device is not None else None
        self._gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(int(seed))
        self._next_id = 0
        self._retired = 0  # ids below this were issued before a checkpoint this dealer was restored from
        self._pending: dict[tuple[int, int], TripleShare] = {}
        self._taken: set[tuple[int, int]] = set()
        self._used: set[tuple[int, int]] = set()
        self.issued: dict[str, int] = defaultdict(int)
        """Number of triples issued, per kind (``mul``, ``matmul``, ``conv2d``, ``conv2d_input_grad``)."""
        self.issued_elements = 0
        """Total ring elements in all issued ``(a, b, c)`` (one party's share; a fixed-mask triple counts ``a`` and
        ``c``, its ``b`` is the mask's)."""
        self._masks: dict[int, WeightMask] = {}
        self._current: dict[tuple[str, str], int] = {}
        self._next_mask = 0
        self._weights: dict[int, Tensor] = {}

    def __repr__(self) -> str:
        return f"Dealer(name={self.name!r}, role={self.role!r}, issued={dict(self.issued)})"

    # -- issuing -----------------------------------------------------------------------------

    def _issue(
        self, kind: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...], op: Callable[[Tensor, Tensor], Tensor]
    ) -> int:
        g = self._gen
        dev = self.device
        a = uniform(a_shape, g, device=dev)
        b = uniform(b_shape, g, device=dev)
        c = op(a, b)
        a0, b0, c0 = uniform(a.shape, g, device=dev), uniform(b.shape, g, device=dev), uniform(c.shape, g, device=dev)
        tid = self._next_id
        self._next_id += 1
        # a, b, c are fresh and not used again: party 1's halves are computed in place (c may be a
        # strided view, e.g. the cropped col2im output; it is then copied into a compact tensor)
        c1 = c.sub_(c0) if c.is_contiguous() else c - c0
        halves = ((a0, b0, c0), (a.sub_(a0), b.sub_(b0), c1))
        for party, (sa, sb, sc) in enumerate(halves):
            self._pending[(tid, party)] = TripleShare(tid, kind, party, sa, sb, sc)
        self.issued[kind] += 1
        self.issued_elements += a.numel() + b.numel() + c.numel()
        return tid

    def issue_mul(self, shape: tuple[int, ...]) -> int:
        """A triple for the elementwise product of two tensors of ``shape``; returns its id."""
        return self._issue("mul", tuple(shape), tuple(shape), torch.mul)

    def issue_matmul(self, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> int:
        """A triple for ``x @ y`` with ``x`` of ``a_shape`` and ``y`` of ``b_shape``; returns its id."""
        return self._issue("matmul", tuple(a_shape), tuple(b_shape), ring_matmul)

    def issue_conv2d(
        self,
        x_shape: tuple[int, ...],
        w_shape: tuple[int, ...],
        *,
        stride: int | tuple[int, int],
        padding: int | tuple[int, int],
    ) -> int:
        """A triple for ``conv2d(x, w)`` (the im2col matmul): ``a`` input-shaped, ``b`` weight-shaped."""

        def op(a: Tensor, b: Tensor) -> Tensor:
            return ring_conv2d(a, b, stride=stride, padding=padding)

        return self._issue("conv2d", tuple(x_shape), tuple(w_shape), op)

    def issue_conv2d_input_grad(
        self,
        g_shape: tuple[int, ...],
        w_shape: tuple[int, ...],
        input_size: tuple[int, int],
        *,
        stride: int | tuple[int, int],
        padding: int | tuple[int, int],
    ) -> int:
        """A triple for the input gradient of a convolution (im2col matmul followed by col2im)."""

        def op(a: Tensor, b: Tensor) -> Tensor:
            return ring_conv2d_input_grad(
                a, b, (int(input_size[0]), int(input_size[1])), stride=stride, padding=padding
            )

        return self._issue("conv2d_input_grad", tuple(g_shape), tuple(w_shape), op)

    # -- fixed weight masks (see the module doc) ------------------------------------------------

    def open_mask(self, owner: str, layer: str, shape: tuple[int, ...]) -> tuple[int, int]:
        """A fresh fixed mask for ``owner``'s layer ``layer`` of weight shape ``shape``, which retires the layer's
        previous mask; returns its id and the passive party's seed."""
        seeds = uniform((2,), self._gen) & SEED_MASK
        mask = WeightMask(self._next_mask, owner, layer, tuple(int(n) for n in shape), int(seeds[0]), int(seeds[1]))
        self._next_mask += 1
        old = self._current.pop((owner, layer), None)
        if old is not None:
            self._masks.pop(old, None)
            self._weights.pop(old, None)
        self._masks[mask.mask_id] = mask
        self._current[(owner, layer)] = mask.mask_id
        return mask.mask_id, mask.passive_seed

    def _mask(self, mask_id: int) -> WeightMask:
        try:
            return self._masks[int(mask_id)]
        except KeyError:
            raise KeyError(
                f"{self.name}: no current weight mask {mask_id} (never opened, or retired by a newer mask of its layer)"
            ) from None

    def take_mask(self, mask_id: int, owner: str, layer: str) -> int:
        """The active party's seed of mask ``mask_id`` of ``owner``'s layer ``layer`` (taken once)."""
        mask = self._mask(mask_id)
        if (mask.owner, mask.layer) != (owner, layer):
            raise PermissionError(
                f"{self.name}: weight mask {mask_id} belongs to layer {mask.layer!r} of "
                f"{mask.owner!r}, not to layer {layer!r} of {owner!r}"
            )
        if mask.taken:
            raise TripleReuseError(f"{self.name}: the active party already took its seed of weight mask {mask_id}")
        mask.taken = True
        return mask.active_seed

    def issue_masked(self, owner: str, mask_id: int, meta: Mapping[str, object]) -> tuple[int, Tensor]:
        """A fixed-mask triple for ``owner``'s product that ``meta`` describes (as :func:`issue_from_meta`, plus
        ``transpose``: the product uses the transposed weight) against mask ``mask_id``: returns its id ``t`` and
        P_k's share ``C0_t = op(A_t, B) - C1_t`` (``A_t`` and ``C1_t`` are the seeded draws of the module doc)."""
        mask = self._mask(mask_id)
        if mask.owner != owner:
            raise PermissionError(f"{self.name}: {owner!r} asked for a triple against {mask.owner!r}'s weight mask")
        kind, op = _operation(meta)
        a_shape, b_shape = _shape(meta["a"]), _shape(meta["b"])
        dev = self.device
        weight = self._weights.get(mask.mask_id)
        if weight is None:
            weight = self._weights[mask.mask_id] = weight_mask(mask.active_seed, mask.shape, device=dev)
        b = weight.t() if meta.get("transpose") else weight
        if tuple(b.shape) != b_shape:
            raise ValueError(
                f"{self.name}: a triple with a weight operand of shape {b_shape} against weight mask "
                f"{mask_id} of shape {mask.shape}"
            )
        tid = self._next_id
        self._next_id += 1
        a = operand_mask(mask.passive_seed, tid, a_shape, device=dev)
        c = op(a, b)
        c0 = c - output_share(mask.active_seed, tid, c.shape, device=dev)
        self.issued[kind] += 1
        self.issued_elements += a.numel() + c.numel()
        return tid, c0

    # -- delivering --------------------------------------------------------------------------

    def take(self, triple_id: int, party: int) -> TripleShare:
        """Deliver ``party``'s half of triple ``triple_id`` (each half can be taken once)."""
        key = (int(triple_id), int(party))
        if 0 <= key[0] < self._retired:
            raise TripleReuseError(
                f"{self.name}: triple {triple_id} was issued before the checkpoint this dealer "
                "resumed from; a triple is never dealt twice"
            )
        if key in self._taken:
            raise TripleReuseError(f"{self.name}: party {party} already took its half of triple {triple_id}")
        try:
            half = self._pending.pop(key)
        except KeyError:
            raise KeyError(f"{self.name}: no triple {triple_id} for party {party}") from None
        self._taken.add(key)
        return half

    def consume(self, half: TripleShare) -> None:
        """Mark ``half`` as used by the protocol; a second use raises :class:`TripleReuseError`."""
        key = (half.triple_id, half.party)
        if key in self._used:
            raise TripleReuseError(
                f"{self.name}: triple {half.triple_id} ({half.kind}) used twice by party {half.party}"
            )
        self._used.add(key)

    def pair(self, triple_id: int) -> tuple[TripleShare, TripleShare]:
        """Both halves of a triple (for the one-function simulations in :mod:`vflbench.mpc.protocol`)."""
        return self.take(triple_id, 0), self.take(triple_id, 1)

    def state_dict(self) -> dict[str, object]:
        """The dealer's generator and counters, for a checkpoint between products (no half may be pending)."""
        if self._pending:
            raise RuntimeError(
                f"{self.name}: {len(self._pending)} triple halves are issued but not taken; a "
                "checkpoint is taken between products (at an epoch boundary)"
            )
        return {
            "generator": self._gen.get_state(),
            "next_id": self._next_id,
            "issued": dict(self.issued),
            "issued_elements": self.issued_elements,
            "next_mask": self._next_mask,
            "masks": [m.as_dict() for m in self._masks.values()],
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Continue from :meth:`state_dict`: new triples get fresh ids, and every id issued before the checkpoint
        is refused (:class:`TripleReuseError`) if asked for again."""
        self._gen.set_state(state["generator"])  # type: ignore[arg-type]
        self._next_id = self._retired = int(state["next_id"])  # type: ignore[call-overload]
        self.issued = defaultdict(int, {str(k): int(v) for k, v in state["issued"].items()})  # type: ignore[attr-defined]
        self.issued_elements = int(state["issued_elements"])  # type: ignore[call-overload]
        self._pending.clear()
        self._taken.clear()
        self._used.clear()
        self._next_mask = int(state.get("next_mask", 0))  # type: ignore[call-overload]
        masks = [
            WeightMask(
                int(m["mask_id"]),
                str(m["owner"]),
                str(m["layer"]),
                tuple(int(n) for n in m["shape"]),
                int(m["passive_seed"]),
                int(m["active_seed"]),
                bool(m["taken"]),
            )
            for m in state.get("masks", [])  # type: ignore[attr-defined]
        ]
        self._masks = {m.mask_id: m for m in masks}
        self._current = {(m.owner, m.layer): m.mask_id for m in masks}
        self._weights.clear()

    @property
    def retired_below(self) -> int:
        """Ids below this were issued before the checkpoint this dealer was restored from (0: none)."""
        return self._retired

    @property
    def next_triple(self) -> int:
        """The id the next triple gets (the number of triples this dealer and those it continues have issued)."""
        return self._next_id

    @property
    def pending(self) -> int:
        """Halves issued but not yet taken."""
        return len(self._pending)

    @property
    def consumed(self) -> int:
        """Halves marked used by the protocol."""
        return len(self._used)


def _shape(text: object) -> tuple[int, ...]:
    return tuple(int(n) for n in str(text).split(",") if n)


def _operation(meta: Mapping[str, object]) -> tuple[str, Callable[[Tensor, Tensor], Tensor]]:
    """The kind and the ring operation of the product a triple request's header describes."""
    op = meta["op"]
    if op == "matmul":
        return "matmul", ring_matmul
    if op == "mul":
        return "mul", torch.mul
    stride, padding = _shape(meta["stride"]), _shape(meta["padding"])
    st, pd = (stride[0], stride[1]), (padding[0], padding[1])
    if op == "conv2d":
        return "conv2d", lambda a, b: ring_conv2d(a, b, stride=st, padding=pd)
    if op == "conv2d_input_grad":
        size = _shape(meta["size"])
        return "conv2d_input_grad", lambda a, b: ring_conv2d_input_grad(a, b, (size[0], size[1]), stride=st, padding=pd)
    raise ValueError(f"unknown triple operation {op!r}; valid: matmul, mul, conv2d, conv2d_input_grad")


def issue_from_meta(dealer: Dealer, meta: Mapping[str, object]) -> int:
    """Issue the triple a ``dealer.triple`` request describes (``op``, shapes ``a``/``b`` as ``"4,6"``,
    and for convolutions ``stride``, ``padding`` and, for the input gradient, the input ``size``)."""
    op, a, b = meta["op"], _shape(meta["a"]), _shape(meta["b"])
    if op == "matmul":
        return dealer.issue_matmul(a, b)
    if op == "mul":
        return dealer.issue_mul(a)
    stride, padding = _shape(meta["stride"]), _shape(meta["padding"])
    if op == "conv2d":
        return dealer.issue_conv2d(a, b, stride=(stride[0], stride[1]), padding=(padding[0], padding[1]))
    if op == "conv2d_input_grad":
        size = _shape(meta["size"])
        return dealer.issue_conv2d_input_grad(
            a, b, (size[0], size[1]), stride=(stride[0], stride[1]), padding=(padding[0], padding[1])
        )
    raise ValueError(f"unknown triple operation {op!r}; valid: matmul, mul, conv2d, conv2d_input_grad")


class DealerService:
    """The trusted dealer as a party of the channel: serves ``dealer.*`` requests at ``link``.

    ``dealer.triple`` (from a passive party P_k, the product's party 0): issue a triple as the
    header describes and reply with P_k's half ``(a0, b0, c0)``, the id in the header.
    ``dealer.take`` (from the active party, party 1): reply with its half of triple ``meta["triple"]``.
    A half is delivered once, to its own party only, and counts as used when delivered.
    Fixed weight masks (see the module doc): ``dealer.mask`` (from P_k: a new mask for its layer ``meta["layer"]``
    of weight shape ``meta["shape"]``; the reply carries P_k's seed, the id in the header), ``dealer.take_mask``
    (from the active party: its seed of mask ``meta["mask"]`` of the passive party ``meta["party"]``'s layer
    ``meta["layer"]``, once) and ``dealer.triple`` with a ``mask`` in
    the header (from the mask's P_k: a fixed-mask triple; the reply carries ``C0_t``, the id in the header).
    """

    def __init__(self, dealer: Dealer, link: Endpoint) -> None:
        self.dealer = dealer
        self.link = link
        self._issuer: dict[int, str] = {}
        self.save: Callable[[int, dict[str, object]], None] | None = None
        """Where ``dealer.checkpoint`` writes the dealer's state of an epoch (``None``: it keeps no checkpoints)."""
        self.load: Callable[[int], Mapping[str, object]] | None = None
        """Where ``dealer.resume`` reads it back (``None``: the dealer was not started to resume)."""
        link.serve("dealer", self.handle)

    def _checkpoint(self, request: Message) -> Message:
        """``dealer.checkpoint`` / ``dealer.resume`` of the active party at an epoch boundary: write, or continue
        from, the dealer's generator and counters (:meth:`Dealer.state_dict`); a restored dealer refuses every
        triple it issued before."""
        if request.sender != ACTIVE:
            raise PermissionError(
                f"{request.sender!r} asked the dealer for {request.kind}; only the active party coordinates checkpoints"
            )
        if request.kind == "dealer.checkpoint":
            if self.save is None:
                return request.reply(meta={"committed": -1})
            self.save(request.epoch, self.dealer.state_dict())
            return request.reply(meta={"committed": request.epoch})
        if self.load is None:
            raise RuntimeError(
                f"{self.dealer.name} was asked to resume from epoch {request.epoch} but was started "
                "without --resume and --out"
            )
        self.dealer.load_state_dict(self.load(request.epoch))
        self._issuer.clear()
        return request.reply(meta={"resumed": request.epoch, "next_triple": self.dealer.retired_below})

    def __repr__(self) -> str:
        return f"DealerService({self.dealer.name})"

    def handle(self, request: Message) -> Message:
        """Answer one ``dealer.*`` request."""
        if request.kind in ("dealer.checkpoint", "dealer.resume"):
            return self._checkpoint(request)
        if request.kind in ("dealer.mask", "dealer.take_mask") or "mask" in request.meta:
            return self._fixed_mask(request)
        if request.kind == "dealer.triple":
            if request.sender == ACTIVE:
                raise PermissionError(
                    "the active party is party 1 of VMask's products; it takes its halves with dealer.take"
                )
            tid = issue_from_meta(self.dealer, request.meta)
            self._issuer[tid] = request.sender
            half = self.dealer.take(tid, 0)
        elif request.kind == "dealer.take":
            if request.sender != ACTIVE:
                raise PermissionError(
                    f"{request.sender!r} asked for party 1's half of a triple; only the active party may take it"
                )
            tid = int(request.meta["triple"])  # type: ignore[arg-type]
            if tid < self.dealer.retired_below:
                raise TripleReuseError(
                    f"{self.dealer.name}: triple {tid} was issued before the checkpoint this "
                    "dealer resumed from; a triple is never dealt twice"
                )
            if tid not in self._issuer:
                raise KeyError(f"{self.dealer.name}: no triple {tid} was issued")
            half = self.dealer.take(tid, 1)
        else:
            raise ValueError(f"unknown dealer request {request.kind!r}; valid: {', '.join(DEALER_KINDS)}")
        self.dealer.consume(half)
        return request.reply(half.a, half.b, half.c, meta={"triple": half.triple_id, "kind": half.kind})

    def _fixed_mask(self, request: Message) -> Message:
        """``dealer.mask``, ``dealer.take_mask`` and a fixed-mask ``dealer.triple`` (see the class doc)."""
        meta = request.meta
        if request.kind == "dealer.take_mask":
            if request.sender != ACTIVE:
                raise PermissionError(
                    f"{request.sender!r} asked for the active party's seed of a weight mask; only "
                    "the active party may take it"
                )
            seed = self.dealer.take_mask(int(meta["mask"]), str(meta["party"]), str(meta["layer"]))  # type: ignore[arg-type]
            return request.reply(torch.tensor([seed], dtype=torch.int64))
        if request.sender == ACTIVE:
            raise PermissionError(
                f"the active party sent {request.kind}; weight masks and their triples are asked "
                "for by the passive party whose layer is masked"
            )
        if request.kind == "dealer.mask":
            mask_id, seed = self.dealer.open_mask(request.sender, str(meta["layer"]), _shape(meta["shape"]))
            return request.reply(torch.tensor([seed], dtype=torch.int64), meta={"mask": mask_id})
        if request.kind == "dealer.triple":
            tid, c0 = self.dealer.issue_masked(request.sender, int(meta["mask"]), meta)  # type: ignore[arg-type]
            return request.reply(c0, meta={"triple": tid})
        raise ValueError(
            f"unknown dealer request {request.kind!r} with a weight mask; valid: dealer.mask, "
            "dealer.take_mask, dealer.triple"
        )


DEALER_KINDS = ("dealer.triple", "dealer.take", "dealer.mask", "dealer.take_mask", "dealer.checkpoint", "dealer.resume")
"""The requests :class:`DealerService` answers."""
