"""VMask's masked layers at P_k: a Linear or Conv2d whose weight is secret-shared between the passive
party P_k (party 0, whose bottom model holds the layer) and the active party P_K (party 1).

Layout of :mod:`vflbench.mpc`'s VMask part: this module holds the ``nn.Module`` P_k runs (the shared
layers and their autograd); :mod:`vflbench.mpc.parties` the two parties' state and the messages
between them; :mod:`vflbench.mpc.observation` what P_k's own code can observe; :mod:`vflbench.mpc.masking`
the maskable layers of a bottom model that the VMask defense masks and unmasks.

Layer masking (VMask, NDSS 2025, Algorithm 1). :func:`mask_layer` encodes the plaintext weight and
bias in the ring, P_k keeps one share and sends the other to P_K, and P_K adds Gaussian noise
``N(0, sigma^2)`` to its share (lines 2-6). From then on neither party holds the plaintext
weight: the effective weight is ``W = s_k + s_K`` (= the original weight + noise). :func:`unmask`
reverses it (lines 7-11): P_K first adds fresh noise to its share, then sends it to P_k, who
reconstructs a plaintext ``nn.Linear`` / ``nn.Conv2d``.

Secure forward and backward (VMask Algorithm 5). The layer input ``x`` is plaintext at P_k. P_k
shares it (sends one share to P_K), both parties compute shares of ``x W^T`` with a Beaver triple
against the shared weight (:mod:`vflbench.mpc.protocol`, triples from a :class:`Dealer` that is
neither party), and only P_k receives P_K's output share and reconstructs the output, which it
feeds to the next (plaintext) non-linearity. Backward mirrors it: P_k shares the output gradient
``g``; ``g W`` (the input gradient) is computed with Beaver against the shared weight and
reconstructed to P_k only. The weight gradient ``g^T x`` is computed by P_k in plaintext: P_k knows
both operands (it shared them itself), so computing it on shares as in Algorithm 5 lines 26-29
would hide nothing from P_k. P_k therefore learns every weight gradient, but not the weight.

Weight updates happen on shares. An update ``-lr * d`` of the weight (``d`` a plaintext
direction known to P_k) is linear, so only P_k's share changes: ``s_k -= encode(lr * d)``, with the
rounding residual carried to the next update (error feedback), so updates smaller than
``2^-f`` are not lost. Two ways to drive it:

* With any torch optimizer. Each shared layer has plaintext parameters ``weight_offset`` and
  ``bias_offset`` (P_k's known additive part of the weight, always zero between steps). Autograd
  gives them the plaintext weight gradient; ``optimizer.step()`` moves them (SGD, momentum, Adam...,
  with the optimizer's own state); the next forward (or :meth:`SharedLayer.absorb`) folds them into
  P_k's share and zeroes them. A torch optimizer's ``weight_decay`` decays only the (zero) offsets,
  i.e. has no effect on the masked weight: use :meth:`SharedLayer.decay_` for that.
* With :meth:`SharedLayer.step` (SGD with momentum on the plaintext gradient, P_k's state in
  :class:`PassiveShareHolder`) -- do not also give the offsets to a torch optimizer.

Weight decay needs the weight itself, which is shared. Multiplying both shares by ``1 - lr*wd``
and truncating locally would fail catastrophically with probability ~|W| 2^(2f-64) per element and
step, so the layer instead keeps a public scale ``lambda`` known to both parties: the effective
weight is ``lambda * (s_k + s_K)``; decay multiplies ``lambda`` (a control message, no ring data),
outputs and input gradients are rescaled by P_k in plaintext after reconstruction, and when
``lambda < 1/2`` both parties divide their shares by a power of two (a local SecureML truncation by a
few bits of a value of magnitude ~|W| 2^f, failure probability ~|W| 2^(f-64)) and ``lambda`` grows by it.
:meth:`SharedLayer.step` applies decay decoupled from momentum (SGDW: ``W <- (1 - lr*wd) W - lr*v``,
``v`` the momentum of the plaintext gradients); without momentum this is exactly torch's SGD.

Truncation of the products (``truncation=``): ``"reveal"`` (default) opens the untruncated
product (``2f`` fractional bits) to P_k, who truncates it exactly in plaintext; ``"secureml"``
truncates each share locally before the opening (SecureML, Mohassel & Zhang 2017), which fails
catastrophically with probability ~|y| 2^(2f-64) per output element ``y`` (2.3e-10 for |y|=1 and
f=16; a VGG-sized masked conv sees ~1e11 output elements per training run; one Conv2d(16->32)
forward with |y| up to 1.6e5 already produced one output off by 2^32). The output goes to P_k in
both cases; ``"reveal"`` gives P_k the low ``f`` bits of ``x_enc . W_enc`` as well.

Precision. The effective weight is the original rounded to ``2^-(f+1)``; inputs and gradients are
rounded the same way, so the absolute error of an output is about ``2^-(f+1) sqrt(K/3)`` times the
rms of the other operand (K the fan-in), plus 1 LSB: ~3e-4 for Linear(784->256) on inputs in [-1, 1]
at f=16, ~4e-2 for inputs of magnitude 100 (relative 1e-5); raise ``frac_bits`` for more (products
must stay below ``2^(63-2f)``). Gradients are much smaller than activations (~1e-4 per entry inside
LeNet5 with a mean loss over a batch of 128), where 2^-17 rounding alone is a 20-25% error on the
input gradient. So in the backward pass P_k multiplies the output gradient by a power of two
``2^k`` before encoding it (``k`` chosen so that its largest entry is about ``2^12``, at most
``2^24``) and divides the reconstructed input gradient by ``2^k``: the relative error falls to
~1e-4 whatever the gradient's scale. ``k`` is P_k's private choice and P_K never sees it: it only
receives shares and openings masked by uniformly random ring elements.

What P_k can still infer (measured, not as the paper argues). P_k shared the weight itself, computes
every weight update in plaintext, and receives every masked layer's output and input gradient. The
active party's share (and its ``N(0, sigma^2)`` noise) stays fixed while a layer stays masked, so
the openings are linear equations in one unknown: ``y - x W_known^T - b_known = x R^T + r_b`` (forward,
solved by stacking ``ceil((n_in + 1) / B)`` batches, even with ``B < n_in``) and ``dL/dx - G W_known =
G R`` (backward, one batch when the output width is at most ``B``). VMask's §IV-D argument (``B < n_in``
per batch) does not hold against an honest-but-curious P_k that uses its own updates: the attack
``vmask_weight_recovery`` recovers the masked layers of the Table II TabMNIST runs to a relative error
of ~1e-5 and regains the vanilla leakage (docs/notes/reproduction.md, VMask).
Each masked layer declares the observation point it does this through,
:class:`~vflbench.mpc.observation.ObservationPoint`:
P_k's own code can attach observers that see the plaintext weight when it is masked and every
:class:`Opening` (what P_k fed in and what was reconstructed to it), nothing of P_K's state.

Separation of the parties. :class:`SharedLinear` / :class:`SharedConv2d` (the ``nn.Module`` in P_k's
bottom model) hold only P_k's state (:class:`~vflbench.mpc.parties.PassiveShareHolder`) and two
service handles: an :class:`~vflbench.mpc.parties.ActivePeer` (P_k's endpoint of the channel and the
layer's name: every protocol step is a ``vmask.<step>`` request to P_K, and every Beaver triple a
``dealer.triple`` request to the dealer, all counted by the channel) and P_k's own random source.
P_K's state lives in P_K's :class:`~vflbench.mpc.parties.ActiveShares` service, reached only by
messages. Handles are not copied by ``copy.deepcopy`` (the copy talks through the same endpoint) and
pickle to disconnected stubs, so a deep copy or a pickle of P_k's model never contains P_K's share.
Messages of a layer in training mode are counted in the ``train`` phase, in evaluation mode in ``eval``.

The active party only ever receives shares and Beaver openings (uniformly distributed ring
elements); :func:`~vflbench.mpc.parties.local_session` with ``record_active_inbox=True`` logs them
(``ActiveShareHolder.received``) for tests.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.nn.grad import conv2d_weight

from vflbench.mpc._service import ServiceHandle
from vflbench.mpc.dealer import operand_mask
from vflbench.mpc.observation import ObservationPoint, Opening
from vflbench.mpc.parties import (
    ActivePeer,
    PartyRandomness,
    PassiveShareHolder,
    Protocol,
    on_device,
    resolve_protocol,
    resolve_row_blocks,
)
from vflbench.mpc.protocol import (
    BilinearSpec,
    Meta,
    Stage,
    add_bias_share,
    layer_spec,
    party_combine,
    party_masks,
    shape_meta,
    truncate_public,
    truncate_share,
)
from vflbench.mpc.ring import DEFAULT_FRAC_BITS, decode, encode
from vflbench.mpc.shares import share
from vflbench.protocol.channel import Asked, Endpoint
from vflbench.protocol.messages import Phase

Truncation = Literal["reveal", "secureml"]
TRUNCATIONS: tuple[str, ...] = ("reveal", "secureml")
RENORMALIZE_BELOW = 0.5
"""When the public decay scale falls below this, the shares are divided by a power of two."""
GRAD_TARGET_BITS = 12
"""The backward pass scales the output gradient so that its largest entry is about ``2^12``..."""
GRAD_MAX_SCALE_BITS = 24
"""...by at most ``2^24`` (so ``|sum g w| 2^k`` stays far below the ``2^(63-2f)`` product bound)."""


def gradient_scale_bits(g: Tensor) -> int:
    """The power of two P_k multiplies an output gradient by before sharing it (see the module doc)."""
    peak = float(g.abs().max()) if g.numel() else 0.0
    if peak == 0.0 or not math.isfinite(peak):
        return 0
    return max(0, min(GRAD_MAX_SCALE_BITS, GRAD_TARGET_BITS - math.ceil(math.log2(peak))))


class _SecureLayerFn(torch.autograd.Function):
    """Autograd bridge (FATE's pattern): forward and backward run the two-party protocol."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: Tensor, w_offset: Tensor, b_offset: Tensor | None, layer: SharedLayer
    ) -> Tensor:
        ctx.layer = layer
        ctx.has_bias = b_offset is not None
        ctx.save_for_backward(x)
        return layer._secure_forward(x, backward=bool(ctx.needs_input_grad[0]))

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, Tensor, Tensor | None, None]:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        layer: SharedLayer = ctx.layer
        gw, gb = layer._plain_weight_grads(x, grad_out)
        gx = layer._secure_input_grad(grad_out, x) if ctx.needs_input_grad[0] else None
        return gx, gw, (gb if ctx.has_bias else None), None


class DealtAhead(ServiceHandle):
    """The ``fixed_mask`` triples P_k asked the dealer for before a product needs them, by use: ``"backward"`` (the
    input gradient of the step whose forward asked) and ``"forward"`` (the next training forward). A service
    handle: a deep copy of the layer shares it (a copy never runs a training product)."""

    def __init__(self) -> None:
        self.asked: dict[str, tuple[int, Meta, Asked]] = {}
        """Use -> (weight mask id, the product's triple header, the request whose reply carries the triple)."""

    def __repr__(self) -> str:
        return f"DealtAhead({sorted(self.asked)})"

    def ask(self, use: Stage, spec: BilinearSpec, mask: int, peer: ActivePeer, *, phase: Phase) -> None:
        """Ask for the triple of the product ``use`` will be (``spec`` against weight mask ``mask``), not waiting."""
        self.asked[use] = (mask, dict(spec.triple), peer.ask_masked_triple(spec, mask, phase=phase))

    def take(self, use: Stage, spec: BilinearSpec, mask: int, peer: ActivePeer) -> tuple[int, Tensor] | None:
        """The triple asked for ``use``, its id and ``C0``, if it fits ``spec`` and ``mask``; ``None`` otherwise (one
        that does not fit is taken and dropped)."""
        asked = self.asked.pop(use, None)
        if asked is None:
            return None
        got = peer.masked_triple_answer(asked[2])
        return got if (asked[0], asked[1]) == (mask, spec.triple) else None

    def settle(self, peer: ActivePeer) -> None:
        """Take and drop every triple still asked for."""
        for _, _, asked in self.asked.values():
            peer.masked_triple_answer(asked)
        self.asked.clear()


class SharedLayer(nn.Module, ABC):
    """Common machinery of :class:`SharedLinear` and :class:`SharedConv2d` (P_k's side).

    ``geometry``: the layer's public description (sent to P_K when it is masked), from which each
    party derives the shared products (:func:`~vflbench.mpc.protocol.layer_spec`); ``protocol``: how the
    products are computed (:data:`~vflbench.mpc.parties.PROTOCOLS`; ``None``: the default for ``truncation``);
    ``row_blocks``: the row blocks a ``fixed_mask`` product's operand travels in
    (:func:`~vflbench.mpc.parties.resolve_row_blocks`; ``None``: the protocol's default).
    """

    passive: PassiveShareHolder

    def __init__(
        self,
        passive: PassiveShareHolder,
        *,
        peer: ActivePeer,
        randomness: PartyRandomness,
        geometry: Meta,
        sigma: float,
        frac_bits: int,
        truncation: Truncation,
        observation: ObservationPoint | None = None,
        protocol: Protocol | None = None,
        row_blocks: int | None = None,
    ) -> None:
        super().__init__()
        if truncation not in TRUNCATIONS:
            raise ValueError(f"unknown truncation {truncation!r}; valid: {', '.join(TRUNCATIONS)}")
        self.protocol: Protocol = resolve_protocol(protocol, truncation)
        self.row_blocks = resolve_row_blocks(row_blocks, self.protocol)
        if (self.protocol == "fixed_mask") != passive.fixed_mask:
            raise ValueError(
                f"protocol {self.protocol!r} needs a share holder "
                f"{'with' if self.protocol == 'fixed_mask' else 'without'} a weight opening"
            )
        self.passive = passive
        self.peer = peer
        self.randomness = randomness
        self.geometry = dict(geometry)
        self.sigma = float(sigma)
        self.frac_bits = frac_bits
        self.truncation: Truncation = truncation
        self.observation = observation
        self.ahead = DealtAhead()

    # -- defined by subclasses ----------------------------------------------------------------------

    @abstractmethod
    def _plain_weight_grads(self, x: Tensor, g: Tensor) -> tuple[Tensor, Tensor | None]:
        """Plaintext weight and bias gradients from the input ``x`` and output gradient ``g``."""

    @abstractmethod
    def _plain_layer(self, weight: Tensor, bias: Tensor | None) -> nn.Module:
        """A plaintext layer of the same shape carrying ``weight`` and ``bias``."""

    def _to_operand(self, x: Tensor) -> Tensor:
        return x

    def _from_output(self, y: Tensor, x: Tensor) -> Tensor:
        return y

    def _input_size(self, x_shape: torch.Size) -> tuple[int, int] | None:
        return None

    @property
    def phase(self) -> Phase:
        """The phase this layer's messages are counted in (``train`` in training mode, else ``eval``)."""
        return "train" if self.training else "eval"

    # -- protocol -----------------------------------------------------------------------------------

    def _secure_product(
        self,
        v_ring: Tensor,
        stage: Stage,
        *,
        input_size: tuple[int, int] | None = None,
        out_factor: float = 1.0,
        backward: bool = False,
        backward_size: tuple[int, int] | None = None,
    ) -> Tensor:
        """P_k's side: share the encoded ``v_ring``, Beaver against the shared weight, reconstruct to P_k.

        Returns the decoded product times the public scale and ``out_factor`` (float64). ``backward``: a forward
        product whose input gradient will be computed (``backward_size``: the input's spatial size, convolutions).
        """
        f = self.frac_bits
        p = self.passive
        spec: BilinearSpec = layer_spec(self.geometry, stage, v_ring.shape, p.weight_share.shape, input_size)
        z = (
            self._fixed_mask_product(v_ring, spec, stage, input_size, backward=backward, backward_size=backward_size)
            if self.protocol == "fixed_mask"
            else self._beaver_product(v_ring, spec, stage, input_size)
        )
        if self.truncation == "reveal":
            z = truncate_public(z, f)
        # decode(z) * scale * out_factor in one multiply: 2^-f * scale * out_factor is exact for a
        # power-of-two out_factor, so the result is the same as multiplying one factor at a time
        return z.to(torch.float64).mul_(float(p.scale) * out_factor / 2.0**f)

    def _fixed_mask_product(
        self,
        v_ring: Tensor,
        spec: BilinearSpec,
        stage: Stage,
        input_size: tuple[int, int] | None,
        *,
        backward: bool = False,
        backward_size: tuple[int, int] | None = None,
    ) -> Tensor:
        """The ``fixed_mask`` protocol at P_k (:mod:`vflbench.mpc.parties`): the untruncated ring product
        ``op(v, W)`` (+ the bias at ``2f`` fractional bits), reconstructed at P_k.

        Dealt ahead (:class:`DealtAhead`): a triple's ``C0`` is data-independent and only its shape is needed to ask
        for it, so a training forward, once its ``E`` is on its way, asks the dealer for its backward product's
        (when an input gradient will follow, ``backward``; its operand has the forward output's shape) and for the
        next training forward's (the same shape), without waiting: the dealer computes and sends them while P_k and
        P_K exchange ``E`` and ``z1`` and the step goes on, and the products that use them take the replies. A
        triple asked ahead that does not fit its product (a new mask, a smaller last batch) goes unused, the
        product takes a fresh one and asks nothing ahead for the next forward. P_k's VMask half settles its layers
        (:meth:`settle`) at each epoch's end, so nothing asked ahead crosses an epoch (a resumed run deals as the
        uninterrupted one). The ids stay in issue order for each layer (forward, its backward, the next forward),
        and every triple is used at most once.

        Pipelined: ``E`` goes out in :attr:`row_blocks` blocks of rows before anything else (the triples asked
        ahead are asked after it), P_K answers each block with its rows of ``z1`` as it arrives, and P_k computes
        its own terms meanwhile; the product is the same ring value whatever the blocks."""
        p = self.passive
        assert p.mask_id is not None and p.mask_seed is not None and p.weight_opening is not None
        dev = v_ring.device
        mask = int(p.mask_id)
        use: Stage | None = stage if self.training else None
        missed = use is not None and use in self.ahead.asked
        taken = self.ahead.take(use, spec, mask, self.peer) if use is not None else None
        missed = missed and taken is None
        triple_id, c0 = taken if taken is not None else self.peer.masked_triple(spec, mask, phase=self.phase)
        a = operand_mask(int(p.mask_seed), triple_id, v_ring.shape, device=dev)
        e = v_ring - a
        n = e.shape[0]
        block = -(-n // self.row_blocks)
        whole = block >= n
        sent = [
            (
                r,
                self.peer.ask_product(
                    stage,
                    e[r : r + block],
                    triple_id,
                    phase=self.phase,
                    input_size=input_size,
                    row=r,
                    rows=None if whole else n,
                ),
            )
            for r in range(0, n, block)
        ]
        if use == "forward":
            if backward:
                after = layer_spec(self.geometry, "backward", c0.shape, p.weight_share.shape, backward_size)
                self.ahead.ask("backward", after, mask, self.peer, phase=self.phase)
            if not missed:  # a batch unlike the last (an epoch's short last batch) is not dealt ahead
                self.ahead.ask("forward", spec, mask, self.peer, phase=self.phase)
        # P_k computes its own terms while P_K computes z1 and the link carries E and z1
        z = spec.op(v_ring, spec.weight_operand(p.weight_share.to(dev)))
        z += spec.op(a, spec.weight_operand(p.weight_opening.to(dev)))
        z += c0.to(dev)
        for r, asked in sent:  # Reconstruct, at P_k only
            z1 = self.peer.product_answer(asked).to(dev)
            z[r : r + z1.shape[0]] += z1
        b0 = p.bias_share.to(dev) if (spec.bias_view is not None and p.bias_share is not None) else None
        return add_bias_share(z, b0, spec, 0, self.truncation, self.frac_bits)

    def _beaver_product(
        self, v_ring: Tensor, spec: BilinearSpec, stage: Stage, input_size: tuple[int, int] | None
    ) -> Tensor:
        """The ``beaver`` protocol at P_k: a fresh triple per product, both operands opened; the product
        reconstructed at P_k (untruncated with ``reveal``, from locally truncated shares with ``secureml``)."""
        f = self.frac_bits
        p = self.passive
        dev = v_ring.device
        phase = self.phase
        v0, v1 = share(v_ring, self.randomness.generator)
        t0 = on_device(self.peer.triple(spec, phase=phase), dev)
        e0, d0 = party_masks(v0, spec.weight_operand(p.weight_share.to(dev)), t0)
        e1, d1, z1 = self.peer.bilinear(stage, v1, e0, d0, t0.triple_id, phase=phase, input_size=input_size)
        eps, delta = e0 + e1, d0 + d1
        z0 = party_combine(0, eps, delta, t0, spec.op)
        b0 = p.bias_share.to(dev) if (spec.bias_view is not None and p.bias_share is not None) else None
        z = add_bias_share(z0, b0, spec, 0, self.truncation, f)
        z += z1  # Reconstruct, at P_k only
        return z

    def _secure_forward(self, x: Tensor, *, backward: bool = False) -> Tensor:
        xo = self._to_operand(x)
        x_ring = encode(xo, self.frac_bits)
        y = self._secure_product(x_ring, "forward", backward=backward, backward_size=self._input_size(x.shape))
        if self.observation is not None and self.observation.observers:
            self._emit("forward", decode(x_ring, self.frac_bits), y, 2.0**-self.frac_bits)
        return self._from_output(y, x).to(x.dtype)

    def _secure_input_grad(self, g: Tensor, x: Tensor) -> Tensor:
        bits = gradient_scale_bits(g)
        go = self._to_operand(g)
        g_ring = encode(go, self.frac_bits + bits)  # = encode(g * 2^bits): the scaling is exact
        gx = self._secure_product(g_ring, "backward", input_size=self._input_size(x.shape), out_factor=2.0**-bits)
        if self.observation is not None and self.observation.observers:
            self._emit("backward", decode(g_ring, self.frac_bits + bits), gx, 2.0 ** -(self.frac_bits + bits))
        return gx.reshape(x.shape).to(g.dtype)

    def _emit(self, stage: Stage, operand: Tensor, opened: Tensor, step: float) -> None:
        """Pass one opening to P_k's observers (only what P_k itself fed in and received)."""
        assert self.observation is not None
        p = self.passive
        scale = float(p.scale)
        self.observation.opened(
            Opening(stage, operand, opened, step * scale, p.weight_share, p.bias_share, self.frac_bits, scale)
        )

    def forward(self, x: Tensor) -> Tensor:
        """The layer's output for ``x``, computed with P_K by the secret-shared protocol."""
        self.passive.absorb()
        return _SecureLayerFn.apply(x, self.passive.weight_offset, self.passive.bias_offset, self)

    def settle(self) -> None:
        """Take and drop the triples dealt ahead that no product used (at an epoch's end; see
        :meth:`_fixed_mask_product`)."""
        self.ahead.settle(self.peer)

    # -- updates ------------------------------------------------------------------------------------

    def absorb(self) -> None:
        """Fold the plaintext offsets (moved by a torch optimizer) into P_k's share."""
        self.passive.absorb()

    @torch.no_grad()
    def decay_(self, factor: float) -> None:
        """Multiply the effective weight (and bias) by ``factor`` in (0, 1] via the public scale."""
        if not 0 < factor <= 1:
            raise ValueError(f"decay factor must be in (0, 1], got {factor}")
        if factor == 1:
            return
        self.passive.absorb()
        p = self.passive
        p.scale.mul_(factor)
        self.peer.decay(factor, phase=self.phase)
        if float(p.scale) < RENORMALIZE_BELOW:
            bits = int(math.floor(-math.log2(float(p.scale))))
            p.weight_share.copy_(truncate_share(p.weight_share, 0, bits))
            p.residual_weight.div_(2.0**bits)
            if p.bias_share is not None and p.residual_bias is not None:
                p.bias_share.copy_(truncate_share(p.bias_share, 0, bits))
                p.residual_bias.div_(2.0**bits)
            p.scale.mul_(2.0**bits)
            if self.protocol == "fixed_mask":  # P_K's share changes: a fresh mask opens its new value
                mask_id, seed = self.peer.open_mask(p.weight_share.shape, phase=self.phase)
                opening = self.peer.renormalize(bits, phase=self.phase, mask=mask_id)
                assert opening is not None
                p.set_opening(mask_id, seed, opening)
            else:
                self.peer.renormalize(bits, phase=self.phase)

    @torch.no_grad()
    def step(
        self,
        lr: float,
        *,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        """SGD on shares: ``W <- (1 - lr*wd) W - lr * v``, ``v`` the momentum of P_k's plaintext gradients.

        Reads the gradients from ``weight_offset.grad`` / ``bias_offset.grad`` (left in place, as a
        torch optimizer does). Momentum follows torch's SGD (first buffer = gradient, dampening,
        Nesterov); weight decay is decoupled from momentum (identical to torch SGD when momentum is 0).
        """
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        p = self.passive
        p.absorb()
        if weight_decay:
            self.decay_(1.0 - lr * weight_decay)
        for which, share_t, off in p.entries():
            if share_t is None or off is None or off.grad is None:
                continue
            d = off.grad
            if momentum:
                buf = getattr(p, f"momentum_{which}")
                if buf is None:
                    buf = d.detach().clone()
                    setattr(p, f"momentum_{which}", buf)
                else:
                    buf.mul_(momentum).add_(d, alpha=1 - dampening)
                d = d.add(buf, alpha=momentum) if nesterov else buf
            p.apply_update(which, -lr * d.to(torch.float64))

    # -- views --------------------------------------------------------------------------------------

    @torch.no_grad()
    def passive_view_weight(self) -> Tensor:
        """What P_k decodes from its own weight share alone (times the public scale): random-looking.

        This is the masked layer's weight in the attacker's copy of P_k's model (Algorithm 1 line 7).
        """
        self.passive.absorb()
        return decode(self.passive.weight_share, self.frac_bits) * float(self.passive.scale)

    @torch.no_grad()
    def passive_view_bias(self) -> Tensor | None:
        """What P_k decodes from its own bias share alone (None without bias)."""
        self.passive.absorb()
        b = self.passive.bias_share
        return None if b is None else decode(b, self.frac_bits) * float(self.passive.scale)

    def passive_view_module(self) -> nn.Module:
        """A plaintext layer carrying P_k's own-share view of the weights (see :meth:`passive_view_weight`)."""
        return self._plain_layer(self.passive_view_weight(), self.passive_view_bias())


class SharedLinear(SharedLayer):
    """A masked ``nn.Linear`` in P_k's bottom model (input ``(..., in_features)``)."""

    def __init__(self, passive: PassiveShareHolder, *, in_features: int, out_features: int, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(passive, **kwargs)
        self.in_features = in_features
        self.out_features = out_features

    def extra_repr(self) -> str:  # noqa: D102
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.passive.bias_share is not None}, frac_bits={self.frac_bits}, "
            f"truncation={self.truncation}, sigma={self.sigma}"
        )

    def _to_operand(self, x: Tensor) -> Tensor:
        return x.reshape(-1, x.shape[-1])

    def _from_output(self, y: Tensor, x: Tensor) -> Tensor:
        return y.reshape(*x.shape[:-1], self.out_features)

    def _plain_weight_grads(self, x: Tensor, g: Tensor) -> tuple[Tensor, Tensor | None]:
        g2 = g.reshape(-1, self.out_features)
        x2 = x.reshape(-1, self.in_features).to(g2.dtype)
        gw = (g2.t() @ x2).to(self.passive.weight_offset.dtype)
        gb = None if self.passive.bias_offset is None else g2.sum(0).to(self.passive.bias_offset.dtype)
        return gw, gb

    def _plain_layer(self, weight: Tensor, bias: Tensor | None) -> nn.Linear:
        dtype = self.passive.weight_offset.dtype
        layer = nn.Linear(self.in_features, self.out_features, bias=bias is not None, device=weight.device, dtype=dtype)
        with torch.no_grad():
            layer.weight.copy_(weight)
            if bias is not None and layer.bias is not None:
                layer.bias.copy_(bias)
        return layer


def _conv_padding(layer: nn.Conv2d) -> tuple[int, int]:
    pad = layer.padding
    if isinstance(pad, str):
        if pad == "valid":
            return (0, 0)
        k = layer.kernel_size
        if layer.stride != (1, 1) or k[0] % 2 == 0 or k[1] % 2 == 0:
            raise ValueError("padding='same' is supported only for stride 1 and odd kernels")
        return (k[0] // 2, k[1] // 2)
    return (int(pad[0]), int(pad[1]))


class SharedConv2d(SharedLayer):
    """A masked ``nn.Conv2d`` (dilation 1, groups 1, zero padding) in P_k's bottom model."""

    def __init__(
        self,
        passive: PassiveShareHolder,
        *,
        in_channels: int,
        out_channels: int,
        kernel_size: tuple[int, int],
        stride: tuple[int, int],
        padding: tuple[int, int],
        **kwargs: Any,
    ) -> None:
        super().__init__(passive, **kwargs)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding

    def extra_repr(self) -> str:  # noqa: D102
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, bias={self.passive.bias_share is not None}, frac_bits={self.frac_bits}, "
            f"truncation={self.truncation}, sigma={self.sigma}"
        )

    def _input_size(self, x_shape: torch.Size) -> tuple[int, int] | None:
        return (int(x_shape[2]), int(x_shape[3]))

    def _plain_weight_grads(self, x: Tensor, g: Tensor) -> tuple[Tensor, Tensor | None]:
        w_shape = list(self.passive.weight_share.shape)
        gw = conv2d_weight(x.to(g.dtype), w_shape, g, stride=self.stride, padding=self.padding)
        bo = self.passive.bias_offset
        return gw.to(self.passive.weight_offset.dtype), (None if bo is None else g.sum((0, 2, 3)).to(bo.dtype))

    def _plain_layer(self, weight: Tensor, bias: Tensor | None) -> nn.Conv2d:
        dtype = self.passive.weight_offset.dtype
        layer = nn.Conv2d(
            self.in_channels,
            self.out_channels,
            self.kernel_size,
            stride=self.stride,
            padding=self.padding,
            bias=bias is not None,
            device=weight.device,
            dtype=dtype,
        )
        with torch.no_grad():
            layer.weight.copy_(weight)
            if bias is not None and layer.bias is not None:
                layer.bias.copy_(bias)
        return layer


# ------------------------------------------------------------------------------------------------
# Masking and unmasking (Algorithm 1)


def mask_layer(
    layer: nn.Linear | nn.Conv2d,
    *,
    link: Endpoint,
    generator_passive: torch.Generator,
    sigma: float = 0.01,
    frac_bits: int = DEFAULT_FRAC_BITS,
    truncation: Truncation = "reveal",
    name: str = "",
    observation: ObservationPoint | None = None,
    phase: Phase = "setup",
    protocol: Protocol | None = None,
    row_blocks: int | None = None,
) -> SharedLinear | SharedConv2d:
    """Mask a plaintext layer of P_k's bottom model (VMask Algorithm 1, lines 2-6).

    P_k (whose endpoint is ``link``) encodes the weight and bias, shares them with
    ``generator_passive`` and sends P_K its share in a ``vmask.share`` request (with the layer's
    public geometry); P_K adds ``N(0, sigma^2)`` noise. The returned module holds only P_k's share.
    The plaintext ``layer`` is not modified: the caller (P_k) must drop it, e.g. by replacing it in
    the model (see :func:`mask_submodule`). ``name`` identifies the layer in P_k's requests (unique per
    party); ``observation``: P_k's observation point of the layer (told about the masking, then about
    every opening); ``phase``: the phase the masking's messages are counted in; ``protocol``: how the
    products are computed (:func:`~vflbench.mpc.parties.resolve_protocol`; ``fixed_mask`` first asks the
    dealer for a weight mask, ``dealer.mask``, and keeps P_K's opening of its share under it); ``row_blocks``: the
    row blocks each product's operand travels in (:func:`~vflbench.mpc.parties.resolve_row_blocks`).
    """
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    if truncation not in TRUNCATIONS:
        raise ValueError(f"unknown truncation {truncation!r}; valid: {', '.join(TRUNCATIONS)}")
    chosen = resolve_protocol(protocol, truncation)
    resolve_row_blocks(row_blocks, chosen)  # refused before any message
    geometry: Meta
    if isinstance(layer, nn.Conv2d):
        if layer.dilation != (1, 1) or layer.groups != 1 or layer.padding_mode != "zeros":
            raise ValueError("SharedConv2d supports dilation 1, groups 1 and zero padding only")
        geometry = {"kind": "conv", "stride": shape_meta(layer.stride), "padding": shape_meta(_conv_padding(layer))}
    elif isinstance(layer, nn.Linear):
        geometry = {"kind": "linear"}
    else:
        raise TypeError(f"only nn.Linear and nn.Conv2d can be masked, got {type(layer).__name__}")
    with torch.no_grad():
        w_ring = encode(layer.weight, frac_bits)
        b_ring = None if layer.bias is None else encode(layer.bias, frac_bits)
    w0, w1 = share(w_ring, generator_passive)
    b0, b1 = (None, None) if b_ring is None else share(b_ring, generator_passive)
    peer = ActivePeer(link, name or type(layer).__name__)
    mask = peer.open_mask(w0.shape, phase=phase) if chosen == "fixed_mask" else None
    opening = peer.share_weights(
        w1,
        b1,
        geometry=geometry,
        sigma=sigma,
        frac_bits=frac_bits,
        truncation=truncation,
        phase=phase,
        mask=None if mask is None else mask[0],
    )
    passive = PassiveShareHolder(w0, b0, frac_bits=frac_bits, dtype=layer.weight.dtype, fixed_mask=mask is not None)
    if mask is not None and opening is not None:
        passive.set_opening(mask[0], mask[1], opening)
    common = {
        "peer": peer,
        "randomness": PartyRandomness(generator_passive, party=link.owner),
        "geometry": geometry,
        "sigma": sigma,
        "frac_bits": frac_bits,
        "truncation": truncation,
        "observation": observation,
        "protocol": chosen,
        "row_blocks": row_blocks,
    }
    if observation is not None:
        with torch.no_grad():
            observation.masked(layer.weight.detach(), None if layer.bias is None else layer.bias.detach(), w0, b0)
    return _shared(layer, passive, common)


def restored_layer(
    layer: nn.Linear | nn.Conv2d,
    *,
    link: Endpoint,
    generator_passive: torch.Generator,
    sigma: float,
    frac_bits: int = DEFAULT_FRAC_BITS,
    truncation: Truncation = "reveal",
    name: str = "",
    observation: ObservationPoint | None = None,
    protocol: Protocol | None = None,
    row_blocks: int | None = None,
) -> SharedLinear | SharedConv2d:
    """P_k's side of a layer that was masked before a checkpoint, rebuilt without a message: its share buffers
    (and, with ``fixed_mask``, its weight opening and mask) are zero here, for the checkpoint's state dict to fill
    (the active party restores its own share from its own checkpoint). ``generator_passive`` carries on P_k's
    input-share draws (its state restored by the caller)."""
    if truncation not in TRUNCATIONS:
        raise ValueError(f"unknown truncation {truncation!r}; valid: {', '.join(TRUNCATIONS)}")
    chosen = resolve_protocol(protocol, truncation)
    geometry: Meta = (
        {"kind": "conv", "stride": shape_meta(layer.stride), "padding": shape_meta(_conv_padding(layer))}
        if isinstance(layer, nn.Conv2d)
        else {"kind": "linear"}
    )
    zeros = torch.zeros(layer.weight.shape, dtype=torch.int64, device=layer.weight.device)
    bias = None if layer.bias is None else torch.zeros(layer.bias.shape, dtype=torch.int64, device=layer.weight.device)
    passive = PassiveShareHolder(
        zeros, bias, frac_bits=frac_bits, dtype=layer.weight.dtype, fixed_mask=chosen == "fixed_mask"
    )
    common = {
        "peer": ActivePeer(link, name or type(layer).__name__),
        "randomness": PartyRandomness(generator_passive, party=link.owner),
        "geometry": geometry,
        "sigma": sigma,
        "frac_bits": frac_bits,
        "truncation": truncation,
        "observation": observation,
        "protocol": chosen,
        "row_blocks": row_blocks,
    }
    return _shared(layer, passive, common)


def _shared(
    layer: nn.Linear | nn.Conv2d, passive: PassiveShareHolder, common: dict[str, Any]
) -> SharedLinear | SharedConv2d:
    if isinstance(layer, nn.Conv2d):
        return SharedConv2d(
            passive,
            in_channels=layer.in_channels,
            out_channels=layer.out_channels,
            kernel_size=(int(layer.kernel_size[0]), int(layer.kernel_size[1])),
            stride=(int(layer.stride[0]), int(layer.stride[1])),
            padding=_conv_padding(layer),
            **common,
        )
    return SharedLinear(passive, in_features=layer.in_features, out_features=layer.out_features, **common)


@torch.no_grad()
def unmask(layer: SharedLayer, *, sigma: float | None = None, phase: Phase | None = None) -> nn.Linear | nn.Conv2d:
    """Reconstruct a masked layer to P_k for plaintext use (VMask Algorithm 1, lines 7-11).

    P_K adds fresh ``N(0, sigma^2)`` noise (default: the layer's ``sigma``) to its share and sends it
    (``vmask.release``); P_k reconstructs. P_K forgets its share, so ``layer`` can no longer be used.
    """
    layer.settle()
    layer.passive.absorb()
    if layer.observation is not None:
        layer.observation.unmasked()
    w1, b1 = layer.peer.release(sigma=layer.sigma if sigma is None else float(sigma), phase=phase or layer.phase)
    p = layer.passive
    scale = float(p.scale)
    w = decode(p.weight_share + w1.to(p.weight_share.device), layer.frac_bits) * scale + p.residual_weight * scale
    b = None
    if p.bias_share is not None and p.residual_bias is not None and b1 is not None:
        b = decode(p.bias_share + b1.to(p.bias_share.device), layer.frac_bits) * scale + p.residual_bias * scale
    return layer._plain_layer(w, b)  # type: ignore[return-value]


@torch.no_grad()
def oracle_effective_weight(layer: SharedLayer) -> tuple[Tensor, Tensor | None]:
    """The effective plaintext (weight, bias) the forward pass uses: both shares combined, as float64.

    Excludes P_k's sub-resolution update residual (|.| <= 2^-(f+1), applied with later updates and
    by :func:`unmask`). A simulation oracle for tests and evaluation (e.g. the attacker's upper bound):
    it asks P_K for its shares in a ``vmask.oracle`` request of the ``eval`` phase, which is not part
    of the protocol and is available to neither party's inference.
    """
    layer.passive.absorb()
    w1, b1 = layer.peer.oracle_shares()
    p = layer.passive
    scale = float(p.scale)
    w = decode(p.weight_share + w1.to(p.weight_share.device), layer.frac_bits) * scale
    b = None
    if p.bias_share is not None and b1 is not None:
        b = decode(p.bias_share + b1.to(p.bias_share.device), layer.frac_bits) * scale
    return w, b


# ------------------------------------------------------------------------------------------------
# Model-level helpers


def shared_layers(model: nn.Module) -> list[tuple[str, SharedLayer]]:
    """All masked layers of ``model`` with their qualified names."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, SharedLayer)]


def offset_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The plaintext offset parameters of all masked layers (to exclude from, or give wd=0 in, an optimizer)."""
    out: list[nn.Parameter] = []
    for _, m in shared_layers(model):
        out.extend(p for p in (m.passive.weight_offset, m.passive.bias_offset) if p is not None)
    return out


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def mask_submodule(model: nn.Module, name: str, **kwargs) -> SharedLinear | SharedConv2d:  # type: ignore[no-untyped-def]
    """Replace ``model.<name>`` (``nn.Linear`` / ``nn.Conv2d``) by its masked version (kwargs: :func:`mask_layer`)."""
    layer = model.get_submodule(name)
    shared = mask_layer(layer, name=kwargs.pop("name", name), **kwargs)  # type: ignore[arg-type]
    _set_submodule(model, name, shared)
    return shared


def unmask_submodule(model: nn.Module, name: str, *, sigma: float | None = None) -> nn.Linear | nn.Conv2d:
    """Replace the masked layer ``model.<name>`` by its reconstructed plaintext layer (:func:`unmask`)."""
    layer = model.get_submodule(name)
    if not isinstance(layer, SharedLayer):
        raise TypeError(f"{name!r} is not a masked layer")
    plain = unmask(layer, sigma=sigma)
    _set_submodule(model, name, plain)
    return plain


def step_shared_layers(
    model: nn.Module,
    *,
    lr: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
) -> None:
    """:meth:`SharedLayer.step` on every masked layer of ``model``."""
    for _, m in shared_layers(model):
        m.step(lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)


def passive_attacker_copy(model: nn.Module) -> nn.Module:
    """A deep copy of P_k's model with every masked layer replaced by P_k's own-share view.

    This is what an honest-but-curious P_k running the model completion attack holds
    (Algorithm 1 line 7: the masked layer's parameters are P_k's share).
    """
    clone = copy.deepcopy(model)
    for name, m in shared_layers(clone):
        _set_submodule(clone, name, m.passive_view_module())
    return clone
