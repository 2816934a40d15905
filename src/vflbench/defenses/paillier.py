"""``paillier_he``: a Paillier-encrypted interactive layer, the cryptographic baseline of VMask's Table III.

A two-party homomorphic-encryption protocol in the style of ACML (Zhang & Zhu 2020) and BlindFL
(Fu et al. 2022): the passive party's embedding is produced by an *interactive layer* whose
weight, gradient and output the passive party never sees in plaintext, so that it never handles a
plaintext cut gradient. It is a runtime baseline first (VMask, NDSS 2025, Table III compares
ACML, SPNN, SFA and BlindFL; the paper used python-paillier with a 1024-bit key). Requires the
optional ``he`` extra (``pip install 'vflbench[he]'``: phe and gmpy2), imported only when a run
binds the defense. The cryptography lives in :mod:`vflbench.he`; this module is the defense: one
class per role (:class:`PaillierHEActive`, the key holder; :class:`PaillierHEPassive`), each party
building only its own half, the halves talking only through ``paillier.*`` messages on their
parties' channel endpoints (counted with all other traffic in ``result.json``'s ``comm``).

Model. The passive party's bottom model ``x -> f(x) -> a W + b`` is split at its last
``nn.Linear``: the layers before it are a plaintext feature extractor ``f`` that is **frozen**
(the passive party cannot train it: its input gradient ``d W^T`` would be a plaintext,
label-dependent gradient), the last Linear is the interactive layer. With the ``logreg`` bottom
(one Linear on the raw slice) there is no extractor and the model and its SGD trajectory are
those of plaintext training. Every other model (the active party's bottom, the top) is plaintext.

Keys. The active party (the label holder) generates the Paillier key pair (``key_bits``, phe's
``generate_paillier_keypair``) and sends the public key ``n`` (``g = n + 1``) to each passive
party that asks for it at setup (``paillier.public_key``); only it can decrypt. ``[[x]]`` is a
ciphertext under it.

Fixed point. A real ``x`` at scale ``s`` is the integer ``round(x 2^s)`` in ``Z_n`` (negatives as
``n - |x|``). Plaintext multipliers (the passive inputs ``a``, and ``lr``, momentum, weight decay)
are encoded with ``F = precision`` fractional bits; a ciphertext-times-plaintext product adds the
scales, which each encrypted tensor tracks. Scales of encrypted values cost nothing; the bits of
the plaintext multipliers set the cost of every exponentiation.

Protocol, per batch (A = active party, P = passive party):

1. Setup (once). P asks A for the public key (announcing its layer's width), encrypts its
   initial interactive weight and bias, ``[[W]]`` and ``[[b]]``, and from then on holds only
   these ciphertexts (it knows ``W_0``, its own initialisation, and nothing after the first
   update).
2. Forward. P computes ``a = f(x)`` and ``[[h]] = a [[W]] + [[b]]`` homomorphically (ciphertext
   powers and products), draws a share ``S`` from its own generator, and sends A the re-randomised
   ``[[h - S]]`` (``paillier.share``); A decrypts its share ``h - S`` and keeps it. P's
   embedding message (the loop's ``embedding``) carries ``S``; A's top model receives
   ``S + (h - S) = h`` (a wrapper on A's own top model adds A's share at P's slice), so A sees the
   embedding exactly as in plaintext VFL, P never sees ``h``.
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
   statistical mask ``R`` (``KAPPA`` = 40 extra bits) and sends it (``paillier.rescale``), A
   decrypts, shifts right and re-encrypts, and P removes ``floor(R / 2^shift)``: exact to one
   unit in the last place at scale ``F``.

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
see exactly that. Any aggregation works; the key holder adds each passive party's share where the top
model's input layout (``BindContext.top_layout``, laid out once by the experiment) puts that party's embedding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from vflbench.defenses import DEFENSES
from vflbench.errors import CompatibilityError
from vflbench.he.encoding import EncTensor
from vflbench.he.holder import NAMESPACE, PaillierKeyHolder
from vflbench.he.keys import load_phe
from vflbench.he.layers import HolderRef, KeyHolderLink, PaillierLinear, ShareCombiningTop, replace_last_linear
from vflbench.protocol.channel import Endpoint
from vflbench.protocol.hooks import BindContext, Defense, StepState
from vflbench.protocol.messages import ACTIVE, PASSIVE, Message, passive_name
from vflbench.protocol.surface import requests
from vflbench.registry import Param


@DEFENSES.register(
    summary="Paillier-encrypted interactive layer (ACML/BlindFL-style HE baseline): the "
    "passive party never sees its cut gradient, layer weights or their gradients"
)
class PaillierHE(Defense):
    """A Paillier-HE VFL training protocol (see the module docstring for the protocol).

    ``key_bits``: Paillier modulus size (1024 default and the VMask paper's setting, for
    experiments; 2048+ for production; 512 in tests only). ``precision``: fractional bits of the
    fixed-point encoding (the cost of each exponentiation grows with it). ``pool``: worker
    processes for exponentiations and encryptions (0 or 1: none).

    This class holds the parameters; each party runs its role's half (:meth:`halves`):
    :class:`PaillierHEActive`, the key holder, at the active party and :class:`PaillierHEPassive` at each passive
    party. Neither holds an object of the other.
    """

    name = "paillier_he"
    side = "both"
    surface = requests(("paillier.public_key", "paillier.share", "paillier.rescale"), PASSIVE, ACTIVE)
    paper = (
        "Zhang & Zhu, Additively Homomorphical Encryption based Deep Neural Network for Asymmetrically "
        "Collaborative Machine Learning (ACML, 2020); Fu et al., BlindFL (SIGMOD 2022); the HE baselines "
        "of Table III in VMask (Tan et al., NDSS 2025)"
    )
    protects = ("labels",)
    threat = (
        "label inference by the passive party from cut gradients, its bottom model's updates or weights "
        "(cryptographic protection; the price is runtime)"
    )
    strength_param = None

    constraints: ClassVar[Mapping[str, Param]] = {
        "key_bits": Param("the Paillier modulus' size in bits (2048 for production)", ge=512, multiple_of=8),
        "precision": Param("fractional bits of the fixed-point encoding", ge=8, le=128),
        "pool": Param("worker processes for the encryption (0: none)", ge=0),
    }

    def __init__(self, *, key_bits: int = 1024, precision: int = 32, pool: int = 0) -> None:
        self.key_bits = key_bits
        self.precision = precision
        self.pool = pool

    @classmethod
    def halves(cls) -> Mapping[str, type[Defense]]:  # noqa: D102
        return {ACTIVE: PaillierHEActive, PASSIVE: PaillierHEPassive}

    def bind(self, context: BindContext) -> None:  # noqa: D102
        super().bind(context)
        load_phe()

    def _link(self) -> Endpoint:
        if self.context_.link is None:
            raise CompatibilityError(
                "paillier_he needs a channel between the parties (BindContext.link); its halves "
                "talk only through paillier.* messages"
            )
        return self.context_.link

    def traffic(self, phase: str = "train") -> dict[str, int]:
        """Bytes of ``paillier.*`` messages the channel counted in ``phase``, by direction (``up``: to the
        active party); the loop's embedding and cut-gradient messages are not included."""
        out = {"up": 0, "down": 0}
        for kind, directions in self._link().stats[phase].by_kind.items():
            if kind.startswith(f"{NAMESPACE}."):
                for direction, stats in directions.items():
                    out[direction] += stats.bytes
        return out


class PaillierHEActive(PaillierHE):
    """Paillier at the active party, the key holder: it generates the keys at ``bind``, serves the ``paillier.*``
    requests, wraps its own top model to add its decrypted embedding shares, and encrypts cut gradients."""

    def bind(self, context: BindContext) -> None:  # noqa: D102
        super().bind(context)
        self.holder_ = PaillierKeyHolder(self.key_bits, pool=self.pool)
        self._link().serve(NAMESPACE, self._handle)

    def _handle(self, request: Message) -> Message:
        """The key holder answers a passive party of the federation (another sender is refused)."""
        reply = self.holder_.handle(request)
        self._check_senders()
        return reply

    def _check_senders(self) -> None:
        known = {passive_name(i) for i in range(1, self.context_.num_parties)}
        strangers = sorted(set(self.holder_.widths) - known)
        if strangers:
            raise CompatibilityError(f"paillier_he: unexpected parties {strangers} asked for the public key")

    def wrap_top(self, model: nn.Module) -> nn.Module:
        """The active party's top model behind the addition of each passive party's decrypted embedding share, where
        the top model's input layout (``BindContext.top_layout``) puts that party's embedding."""
        layout = self.context_.top_layout
        if layout is None:
            raise CompatibilityError(
                "paillier_he needs the top model's input layout (BindContext.top_layout, given to the active "
                "party's instance by Defense.bind_top before its models are built)"
            )
        self._check_senders()
        shares = [
            (p.party, p.start, p.end) if layout.how == "concat" else (p.party, 0, 0)
            for p in layout.parts
            if p.party != ACTIVE
        ]
        return ShareCombiningTop(model, HolderRef(self.holder_), shares, layout.how, len(layout.parts))

    def transform_cut_gradient(self, gradient: Tensor, state: StepState) -> Tensor:  # noqa: D102
        if state.receiver not in self.holder_.widths:
            return gradient
        cts = self.holder_.encrypt_reals(gradient.reshape(len(gradient), -1), self.precision)
        return self.holder_.ops.to_wire(cts)

    def on_epoch_end(self, epoch: int) -> dict[str, Any]:
        """The ``paillier.*`` training traffic so far (read from the channel's counter), decryptions, encryptions
        and rescalings."""
        h = self.holder_
        side = self.traffic("train")
        out: dict[str, Any] = {
            "side_bytes_up": side["up"],
            "side_bytes_down": side["down"],
            "decrypted": sum(v for k, v in h.decrypted.items() if k != "oracle"),
            "encrypted": h.encrypted,
            "rescales": h.refreshes,
        }
        if epoch == 0:
            out["keygen_seconds"] = h.keygen_seconds
        return out

    def reveal(self, x: EncTensor) -> Tensor:
        """Oracle for tests and evaluation (not a protocol step), at the key holder: the plaintext of ``x``
        (e.g. a passive layer's ``params["weight"]``, shape (in, out))."""
        return self.holder_.reveal(x)


class PaillierHEPassive(PaillierHE):
    """Paillier at a passive party: it asks for the public key, installs the encrypted interactive layer into its
    own bottom model (``wrap_bottom``) and drives the layer's encrypted backward from the ciphertext it receives."""

    def bind(self, context: BindContext) -> None:  # noqa: D102
        super().bind(context)
        self.layer_: PaillierLinear | None = None

    def attach_optimizer(self, optimizer: torch.optim.Optimizer, party: str) -> None:
        """Apply the encrypted layer's pending update whenever its party's optimizer steps."""
        layer = self.layer_
        if layer is None or party != self.context_.party:
            return

        def after_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            for group in opt.param_groups:
                if any(p is layer.marker for p in group["params"]):
                    layer.apply_update(opt, group)

        optimizer.register_step_post_hook(after_step)

    def wrap_bottom(self, model: nn.Module, party: str) -> nn.Module:
        """The passive party's own bottom model gets the encrypted layer."""
        link = KeyHolderLink(self._link())

        def encrypted(linear: nn.Linear) -> PaillierLinear:
            return PaillierLinear(
                linear,
                public_key=link.public_key(linear.out_features),
                link=link,
                precision=self.precision,
                generator=self.context_.generator,
                pool=self.pool,
            )

        layer = replace_last_linear(model, encrypted)
        assert isinstance(layer, PaillierLinear)
        for p in model.parameters():
            if p is not layer.marker:
                p.requires_grad_(False)  # the plaintext extractor is frozen (see the module docstring)
        self.layer_ = layer
        return model

    def on_received_gradient(self, gradient: Tensor, state: StepState) -> Tensor | None:  # noqa: D102
        layer = self.layer_
        if layer is None:
            return gradient
        if gradient.dtype != torch.uint8:
            raise RuntimeError(
                "paillier_he: the passive party received a plaintext cut gradient; the active "
                "party's paillier_he instance must be last among its defenses"
            )
        layer.receive_gradient(layer.ops.from_wire(gradient), self.precision)
        assert state.embedding is not None
        return torch.zeros_like(state.embedding)  # the share S has no plaintext gradient; the update is encrypted

    def on_epoch_end(self, epoch: int) -> dict[str, Any]:
        """The encrypted layer's seconds."""
        return {} if self.layer_ is None else {f"{k}_seconds": v for k, v in self.layer_.seconds.items()}
