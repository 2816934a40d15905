"""What P_k's own code can observe of a masked layer: its declared observation point.

P_k legitimately sees its plaintext weight before masking, its own shares, the inputs and output
gradients it feeds in and every value the protocol reconstructs to it (the layer's outputs and
input gradients). An :class:`ObservationPoint` passes exactly these to observers that P_k's code
attaches (e.g. the attack ``vmask_weight_recovery``); it carries nothing of P_K's state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from torch import Tensor

from vflbench.mpc._service import ServiceHandle


@dataclass(frozen=True)
class Opening:
    """One value the protocol reconstructed to P_k for a masked layer, with what P_k fed in.

    ``stage`` ``"forward"``: ``operand`` is the layer input as P_k encoded it (decoded back, float64)
    and ``opened`` the reconstructed output; ``"backward"``: ``operand`` is the output gradient as P_k
    encoded it (its ``2^k`` pre-scaling undone) and ``opened`` the reconstructed input gradient. Both
    in the layer's operand layout (``(rows, features)`` for Linear, ``(B, C, H, W)`` for Conv2d).
    ``resolution`` is the last bit of ``opened`` (its rounding step). ``weight_share`` /
    ``bias_share`` are P_k's own ring shares at that moment (live buffers, not copies) and ``scale``
    the public scale, so an observer can tell how far P_k's own updates moved the weight.
    """

    stage: Literal["forward", "backward"]
    operand: Tensor
    opened: Tensor
    resolution: float
    weight_share: Tensor
    bias_share: Tensor | None
    frac_bits: int
    scale: float


class LayerObserver(Protocol):
    """What P_k's own code can attach to a masked layer's :class:`ObservationPoint`."""

    def masked(self, weight: Tensor, bias: Tensor | None, weight_share: Tensor, bias_share: Tensor | None) -> None:
        """The layer was masked: P_k's plaintext weight and bias just before, and its shares just after."""

    def opened(self, opening: Opening) -> None:
        """The protocol reconstructed a value to P_k."""

    def unmasked(self) -> None:
        """The layer was reconstructed to P_k (its masking episode ended)."""


class ObservationPoint(ServiceHandle):
    """P_k's declared observation point of one layer: passes what P_k itself sees to its observers.

    It carries only P_k-side values (its plaintext weight before masking, its own shares, the inputs
    it fed in and the values reconstructed to it). While the layer is masked it remembers what P_k
    saw at the masking (its weight just before and its shares just after, copies), and tells an
    observer attached later: a federation masks the first layer when it is built (Algorithm 4 line
    3), before an attacker's recorder can be attached, and P_k did see that weight. A service
    handle: deep copies of P_k's model share it, and a pickle does not carry it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.observers: list[LayerObserver] = []
        self._masking: tuple[Tensor, Tensor | None, Tensor, Tensor | None] | None = None

    def __repr__(self) -> str:
        return f"ObservationPoint({self.name})"

    def attach(self, observer: LayerObserver) -> None:
        """Add an observer (P_k's own code, e.g. an honest-but-curious attack's recorder)."""
        self.observers.append(observer)
        if self._masking is not None:
            observer.masked(*self._masking)

    def masked(self, weight: Tensor, bias: Tensor | None, weight_share: Tensor, bias_share: Tensor | None) -> None:
        """Tell the observers that the layer was masked."""
        self._masking = (
            weight.detach().clone(),
            None if bias is None else bias.detach().clone(),
            weight_share.clone(),
            None if bias_share is None else bias_share.clone(),
        )
        for o in self.observers:
            o.masked(*self._masking)

    def opened(self, opening: Opening) -> None:
        """Tell the observers what was reconstructed to P_k."""
        for o in self.observers:
            o.opened(opening)

    def unmasked(self) -> None:
        """Tell the observers that the layer was reconstructed to P_k."""
        self._masking = None
        for o in self.observers:
            o.unmasked()
