"""The maskable layers of a passive party's bottom model (VMask's layer masking at P_k).

:func:`make_maskable` replaces every Linear/Conv2d of P_k's bottom model by a :class:`MaskableLayer`
that keeps the same parameter objects and can be masked (secret-shared with the active party through
P_k's endpoint, :func:`~vflbench.mpc.layers.mask_layer`) and unmasked again (Algorithm 1).
:class:`VMaskBottom` is P_k's bottom model with these layers; :meth:`VMaskBottom.attacker_copy` the
plain model P_k can run alone (an :class:`AttackerBottom`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.models import init_parameters
from vflbench.mpc.layers import (
    SharedLayer,
    _SecureLayerFn,
    mask_layer,
    oracle_effective_weight,
    restored_layer,
    unmask,
)
from vflbench.mpc.observation import ObservationPoint
from vflbench.mpc.ring import RingOverflowError
from vflbench.protocol.messages import Phase


class MaskableLayer(nn.Module):
    """A Linear or Conv2d of P_k's bottom model that VMask can mask (share) and unmask.

    ``weight``/``bias`` are the plaintext parameters while unmasked; while masked they are zero
    offsets through which P_k's optimizer moves its share, and ``shared`` runs the protocol.
    """

    def __init__(self, layer: nn.Linear | nn.Conv2d, name: str = "") -> None:
        super().__init__()
        self.conv = isinstance(layer, nn.Conv2d)
        self.config: dict[str, Any] = (
            {"stride": layer.stride, "padding": layer.padding} if isinstance(layer, nn.Conv2d) else {}
        )
        self.shape: tuple[Any, ...] = (
            (layer.in_channels, layer.out_channels, layer.kernel_size)
            if isinstance(layer, nn.Conv2d)
            else (layer.in_features, layer.out_features)
        )
        self.weight = layer.weight
        self.bias = layer.bias
        self.shared: SharedLayer | None = None
        self.attacker_view = "reinit"
        self.reinit_seed = 0
        self.observation = ObservationPoint(name or type(layer).__name__)

    @property
    def masked(self) -> bool:
        """Whether the layer's weight is currently secret-shared."""
        return self.shared is not None

    def plain(self, weight: Tensor, bias: Tensor | None) -> nn.Linear | nn.Conv2d:
        """A plaintext layer of this shape carrying ``weight`` and ``bias`` (on their device, in their dtype)."""
        device, dtype = weight.device, weight.dtype
        if self.conv:
            c_in, c_out, k = self.shape
            layer: nn.Linear | nn.Conv2d = nn.Conv2d(
                c_in, c_out, k, bias=bias is not None, **self.config, device=device, dtype=dtype
            )
        else:
            layer = nn.Linear(self.shape[0], self.shape[1], bias=bias is not None, device=device, dtype=dtype)
        with torch.no_grad():
            layer.weight.copy_(weight)
            if bias is not None and layer.bias is not None:
                layer.bias.copy_(bias)
        return layer

    @torch.no_grad()
    def _absorb(self) -> None:
        assert self.shared is not None
        for which, p in (("weight", self.weight), ("bias", self.bias)):
            if p is not None and bool(p.any()):
                self.shared.passive.apply_update(which, p.detach())
                p.zero_()

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        if self.shared is None:
            if self.conv:
                return F.conv2d(x, self.weight, self.bias, **self.config)
            return F.linear(x, self.weight, self.bias)
        try:
            self._absorb()
            return _SecureLayerFn.apply(x, self.weight, self.bias, self.shared)
        except RingOverflowError as exc:
            raise RingOverflowError(
                f"vmask: a secret-shared layer left the fixed-point range ({exc}); training diverged or the "
                "inputs are far outside [-2^31, 2^31]: lower train.lr, or set the defense's frac_bits lower"
            ) from None

    def mask(self, **kwargs: Any) -> None:
        """P_k shares the layer (Algorithm 1, lines 2-6) and drops its plaintext weight (``kwargs``:
        :func:`~vflbench.mpc.layers.mask_layer`'s, the endpoint ``link`` among them)."""
        if self.shared is not None:
            return
        plain = self.plain(self.weight.detach(), None if self.bias is None else self.bias.detach())
        self.shared = mask_layer(plain, observation=self.observation, **kwargs)
        with torch.no_grad():
            self.weight.zero_()
            if self.bias is not None:
                self.bias.zero_()

    def restore_masked(self, **kwargs: Any) -> None:
        """Be masked again after a restart, without a message (``kwargs``: those of
        :func:`~vflbench.mpc.layers.restored_layer`): the share buffers are filled by the checkpoint's state dict
        of the model, which also zeroes the offsets."""
        plain = self.plain(self.weight.detach(), None if self.bias is None else self.bias.detach())
        self.shared = restored_layer(plain, observation=self.observation, **kwargs)

    def unmask(self, sigma: float, *, phase: Phase = "train") -> None:
        """Reconstruct the layer to P_k after fresh noise from the active party (lines 7-11)."""
        if self.shared is None:
            return
        self._absorb()
        plain = unmask(self.shared, sigma=sigma, phase=phase)
        with torch.no_grad():
            self.weight.copy_(plain.weight)
            if self.bias is not None and plain.bias is not None:
                self.bias.copy_(plain.bias)
        self.shared = None

    def settle(self) -> None:
        """Drop the triples dealt ahead for this layer's products that none used (:meth:`SharedLayer.settle`; P_k's
        VMask half at each epoch's end)."""
        if self.shared is not None:
            self.shared.settle()

    def attacker_module(self) -> nn.Module:
        """What P_k's copy holds. Unmasked: the plain layer. Masked: a fresh initialisation
        (``attacker_view="reinit"``, the attacker the paper evaluates and Algorithm 2 simulates) or
        P_k's decoded share, uniformly random on the ring (``"share"``, Algorithm 1 line 7 read
        literally). Neither is what P_k can know: it can solve the effective weight from its
        openings and own updates (the attack ``vmask_weight_recovery``)."""
        if self.shared is None:
            return self.plain(self.weight.detach(), None if self.bias is None else self.bias.detach())
        self._absorb()
        if self.attacker_view == "share":
            return self.shared.passive_view_module()
        fresh = self.plain(self.weight.detach(), None if self.bias is None else self.bias.detach())
        return init_parameters(fresh, torch.Generator().manual_seed(self.reinit_seed))

    def own_shares(self) -> tuple[Tensor, Tensor | None]:
        """P_k's own ring shares of the masked layer (its pending update folded in): what P_k stores."""
        if self.shared is None:
            raise RuntimeError("the layer is not masked")
        self._absorb()
        p = self.shared.passive
        return p.weight_share.clone(), None if p.bias_share is None else p.bias_share.clone()

    def evaluation_only_effective_weight(self) -> tuple[Tensor, Tensor | None]:
        """EVALUATION ONLY (not available to either party): the masked layer's effective weight and
        bias, both shares combined, to score an attack's reconstruction (P_K's shares come in a
        ``vmask.oracle`` message of the ``eval`` phase). Never used by an attack's inference."""
        if self.shared is None:
            raise RuntimeError("the layer is not masked")
        return oracle_effective_weight(self.shared)


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def make_maskable(model: nn.Module) -> list[MaskableLayer]:
    """Replace every Linear/Conv2d of ``model`` in place; return them in forward order."""
    names = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    layers = []
    for name in names:
        layer = model.get_submodule(name)
        assert isinstance(layer, (nn.Linear, nn.Conv2d))
        wrapper = MaskableLayer(layer, name)
        _replace(model, name, wrapper)
        layers.append(wrapper)
    return layers


class VMaskBottom(nn.Module):
    """P_k's bottom model with maskable layers."""

    def __init__(self, inner: nn.Module, layers: list[MaskableLayer]) -> None:
        super().__init__()
        self.inner = inner
        self._layer_names = [n for n, m in inner.named_modules() if isinstance(m, MaskableLayer)]
        assert len(self._layer_names) == len(layers)

    def layers(self) -> list[MaskableLayer]:
        """The maskable layers in forward order."""
        return [self.inner.get_submodule(n) for n in self._layer_names]  # type: ignore[misc]

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return self.inner(x)

    def named_layers(self) -> list[tuple[str, MaskableLayer]]:
        """The maskable layers with their names in the bottom model, in forward order."""
        return list(zip(self._layer_names, self.layers(), strict=True))

    def attacker_copy(self) -> AttackerBottom:
        """A plain model P_k can run alone: masked layers replaced by their ``attacker_module``."""
        clone = copy.deepcopy(self.inner)
        masked = []
        for name, layer in self.named_layers():
            if layer.masked:
                masked.append(name)
            _replace(clone, name, layer.attacker_module())
        views = {layer.attacker_view for layer in self.layers() if layer.masked}
        return AttackerBottom(clone, masked=tuple(masked), attacker_view=views.pop() if len(views) == 1 else "plain")


class AttackerBottom(nn.Module):
    """The attacker's copy of its VMask bottom model: ``inner`` (a plain model, the same parameters
    in the same order as P_k's) and which layers stand in for masked ones.

    ``masked`` names the layers (as in ``inner``) that were masked at the end of training, whose
    weights here are P_k's stand-ins (``attacker_view``: ``"reinit"`` or ``"share"``; ``"plain"``
    when nothing is masked). Attacks record ``attacker_view`` in their result details.
    """

    def __init__(self, inner: nn.Module, *, masked: tuple[str, ...], attacker_view: str) -> None:
        super().__init__()
        self.inner = inner
        self.masked = masked
        self.attacker_view = attacker_view

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return self.inner(x)
