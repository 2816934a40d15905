"""The encrypted interactive layer (passive party), its link to the key holder, and the active
party's top model behind the addition of its embedding shares.

Each party builds only its own modules: the passive party replaces the last ``nn.Linear`` of its
own bottom model by a :class:`PaillierLinear` and talks to the key holder through a
:class:`KeyHolderLink` (requests on its own channel endpoint); the active party wraps its own top
model in a :class:`ShareCombiningTop` that reads the shares its own key holder decrypted.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from vflbench.errors import CompatibilityError, ConfigError
from vflbench.he.encoding import KAPPA, MAG, EncTensor, encode
from vflbench.he.holder import PUBLIC_KEY, RESCALE, SHARE, PaillierKeyHolder
from vflbench.he.keys import public_key_from_wire
from vflbench.he.ops import PaillierOps, add, scale_by
from vflbench.models import init_parameters
from vflbench.models.base import linear_layers
from vflbench.mpc._service import ServiceHandle
from vflbench.protocol.channel import Endpoint
from vflbench.protocol.messages import ACTIVE


class KeyHolderLink(ServiceHandle):
    """A passive party's connection to the key holder: requests through the party's own endpoint.

    Every request and reply is a ``paillier.*`` message counted by the channel. Deep copy returns
    the same link (a copy of the layer talks to the same key holder); pickling yields a
    disconnected stub, so no copy or file of the passive party's model carries the channel.
    """

    def __init__(self, link: Endpoint, *, holder: str = ACTIVE) -> None:
        self._link = link
        self.party = link.owner
        self.holder = holder

    def __repr__(self) -> str:
        return f"KeyHolderLink({self.party} -> {self.holder})"

    def public_key(self, out_features: int) -> Any:
        """Setup: announce the encrypted layer's width, receive the key holder's public key."""
        reply = self._link.call(PUBLIC_KEY, self.holder, meta={"out_features": out_features}, phase="setup")
        return public_key_from_wire(reply.payload)

    def send_share(self, ops: PaillierOps, cts: np.ndarray, scale: int, *, phase: Literal["train", "eval"]) -> None:
        """P -> A: ``[[h - S]]`` (A keeps the decryption; the reply is an empty acknowledgement)."""
        self._link.call(SHARE, self.holder, ops.to_wire(cts), meta={"scale": scale}, phase=phase)

    def rescale(self, ops: PaillierOps, cts: np.ndarray, shift: int) -> np.ndarray:
        """P -> A: masked ``[[x + R]]``; A -> P: fresh ``[[floor((x + R) / 2^shift)]]``."""
        reply = self._link.call(RESCALE, self.holder, ops.to_wire(cts), meta={"shift": shift}, phase="train")
        out = ops.from_wire(reply.payload)
        if out.shape != cts.shape:
            raise ValueError(f"paillier_he: the key holder answered a rescaling of shape {cts.shape} with {out.shape}")
        return out


class PaillierLinear(nn.Module):
    """The passive party's interactive layer ``a -> a W + b``, held only as ciphertexts under A's key.

    ``forward`` returns the passive party's share ``S`` of the embedding and sends ``[[h - S]]``
    through ``link``; :meth:`receive_gradient` turns ``[[d]]`` into encrypted parameter gradients;
    the update is applied when the passive party's optimizer steps (it holds ``marker``, an empty
    parameter through which the layer finds its parameter group: lr, momentum, weight decay; the
    defense registers the step hook on that party's optimizer in ``attach_optimizer``).
    ``generator``: the passive party's own generator, from which the shares ``S`` are drawn.
    """

    def __init__(
        self,
        linear: nn.Linear,
        *,
        public_key: Any,
        link: KeyHolderLink,
        precision: int,
        generator: torch.Generator,
        pool: int = 0,
    ) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.precision = precision
        self.ops = PaillierOps(public_key, pool=pool)
        self.link = link
        self.generator = generator
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
            raise ConfigError(
                f"paillier_he: key_bits={key_bits} leaves no room for precision={precision} with "
                f"{self.in_features} inputs (need key_bits >= {need}); use a larger key or less "
                "precision"
            )
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

    def attacker_module(self) -> nn.Module:
        """What the passive party can run alone: its weights are ciphertexts under the active party's
        key, so an attacker re-initialises the layer (a fresh ``nn.Linear`` of the same shape)."""
        fresh = nn.Linear(self.in_features, self.out_features, bias="bias" in self.params)
        fresh = init_parameters(fresh, torch.Generator().manual_seed(self.in_features * 1_000_003 + self.out_features))
        return fresh.to(self.marker.device)

    def _encrypt_initial(self, x: Tensor, f: int) -> EncTensor:
        return EncTensor(self.ops.encrypt(encode(x, f)), f)

    def extra_repr(self) -> str:  # noqa: D102
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, encrypted, precision={self.precision}"
        )

    # checkpoints carry the ciphertexts (plain integers), never a key
    def get_extra_state(self) -> dict[str, Any]:  # noqa: D102
        return {
            name: {"cts": [int(c) for c in t.cts.ravel().tolist()], "shape": list(t.shape), "scale": t.scale}
            for name, t in self.params.items()
        }

    def set_extra_state(self, state: dict[str, Any]) -> None:  # noqa: D102
        for name, t in state.items():
            arr = np.empty(len(t["cts"]), dtype=object)
            arr[:] = [self.ops._mpz(c) for c in t["cts"]]
            self.params[name] = EncTensor(arr.reshape(t["shape"]), t["scale"])
        self.buffers_ = {}

    def forward(self, a: Tensor) -> Tensor:  # noqa: D102
        f = self.precision
        tic = time.perf_counter()
        x = encode(a.detach().reshape(len(a), -1), f)
        w = self.params["weight"]
        h = EncTensor(self.ops.matmul(x, w.cts), w.scale + f)
        if "bias" in self.params:
            h = add(self.ops, h, self.params["bias"])
        share = torch.randn((len(a), self.out_features), generator=self.generator, dtype=torch.float64)
        masked = self.ops.rerandomize(self.ops.add_plain(h.cts, -encode(share, h.scale)))
        self.seconds["forward"] += time.perf_counter() - tic
        self.link.send_share(self.ops, masked, h.scale, phase="train" if self.training else "eval")
        if self.training:
            self._inputs = x
            self._pending = None
        return share.to(a.device, a.dtype) + self.marker.sum()  # drawn on the CPU, returned on a's device

    def receive_gradient(self, d: np.ndarray, scale: int) -> None:
        """``[[d]]`` (B, k) at ``scale`` -> pending ``[[a^T d]]`` and ``[[sum_i d_i]]``."""
        if self._inputs is None:
            raise RuntimeError("paillier_he: a cut gradient arrived without a training forward pass")
        if d.shape != (self._inputs.shape[0], self.out_features):
            raise ValueError(
                f"paillier_he: encrypted gradient of shape {d.shape}, expected "
                f"{(self._inputs.shape[0], self.out_features)}"
            )
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
        if (
            not isinstance(optimizer, torch.optim.SGD)
            or group.get("nesterov")
            or group.get("dampening", 0)
            or group.get("maximize")
        ):
            raise CompatibilityError(
                f"paillier_he updates its encrypted layer with SGD (momentum and weight decay allowed); the passive "
                f"party's optimizer is {type(optimizer).__name__} with nesterov={group.get('nesterov')}, "
                f"dampening={group.get('dampening')}, maximize={group.get('maximize')}. Use train.optimizer: sgd."
            )
        tic = time.perf_counter()
        ops, f = self.ops, self.precision
        lr, mu, wd = float(group["lr"]), float(group.get("momentum", 0.0)), float(group.get("weight_decay", 0.0))
        pending, self._pending = self._pending, None
        for name, grad in pending.items():
            p = self.params[name]
            if wd:
                grad = add(ops, grad, scale_by(ops, p, wd, f))
            if mu:
                buf = self.buffers_.get(name)
                grad = grad if buf is None else add(ops, scale_by(ops, buf, mu, f), grad)
                self.buffers_[name] = grad
            self.params[name] = add(ops, p, scale_by(ops, grad, -lr, f))
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
        flat = np.empty(x.cts.size, dtype=object)
        flat[:] = [(1 << top) + secrets.randbits(top + KAPPA) for _ in range(x.cts.size)]
        masks = flat.reshape(x.shape)
        masked = self.ops.rerandomize(self.ops.add_plain(x.cts, masks))
        back = self.link.rescale(self.ops, masked, shift)
        unmask = np.empty(masks.size, dtype=object)
        unmask[:] = [-(r >> shift) for r in masks.ravel().tolist()]
        self.rescales += 1
        self.seconds["rescale"] += time.perf_counter() - tic
        return EncTensor(self.ops.add_plain(back, unmask.reshape(x.shape)), f)


def replace_last_linear(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> nn.Module:
    """Replace ``model``'s last ``nn.Linear`` (its output layer) in place by ``make(that layer)``."""
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not layers or linear_layers(model)[-1] is not layers[-1]:
        raise CompatibilityError(
            "paillier_he needs a bottom model whose last layer is an nn.Linear "
            "(the interactive layer); zoo models logreg, mlp2, mlp3, lenet5 qualify"
        )
    last = layers[-1]
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is last:
                layer = make(last)
                setattr(parent, name, layer)
                return layer
    raise CompatibilityError("paillier_he could not locate the bottom model's last Linear layer")


class HolderRef(ServiceHandle):
    """The top wrapper's handle on its own party's key holder (not copied into deep copies or pickles)."""

    def __init__(self, holder: PaillierKeyHolder) -> None:
        self.__holder = holder

    def __repr__(self) -> str:
        return "HolderRef(the active party's Paillier key holder)"

    def take_share(self, party: str) -> Tensor | None:
        """The active party's decrypted share of ``party``'s last embedding (used once)."""
        return self.__holder.take_share(party)


class ShareCombiningTop(nn.Module):
    """The active party's top model behind the addition of its embedding shares ``h - S``.

    ``layout``: ``(party, start, end)`` of each passive party whose embedding arrives as a share
    (its columns of the concatenated input; ``(party, 0, 0)`` under ``sum``/``mean``).
    """

    def __init__(
        self, top: nn.Module, holder: HolderRef, layout: list[tuple[str, int, int]], how: str, parts: int
    ) -> None:
        super().__init__()
        self.top = top
        self.holder = holder
        self.layout = layout
        self.how = how
        self.parts = parts

    def forward(self, z: Tensor) -> Tensor:  # noqa: D102
        if not self.layout:
            return self.top(z)
        extra = torch.zeros_like(z)
        for party, start, end in self.layout:
            share = self.holder.take_share(party)
            if share is None or share.shape[0] != z.shape[0]:
                raise RuntimeError(
                    f"paillier_he: no decrypted embedding share of {party} for this batch of "
                    f"{z.shape[0]} rows (the top model must follow that party's forward pass)"
                )
            share = share.to(z.device, z.dtype)  # decrypted on the CPU
            if self.how == "concat":
                extra[:, start:end] += share
            else:
                extra += share / (self.parts if self.how == "mean" else 1)
        return self.top(z + extra)
