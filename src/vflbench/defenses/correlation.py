"""Distance-correlation regularisers: ``dcor`` (label dCor at the active party) and ``nopeek`` (input
dCor at each passive party).

New modules are initialised from the defense's bound generator, so that a run is a function of its seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from vflbench.defenses import DEFENSES
from vflbench.defenses.building import DcorForm
from vflbench.metrics.correlation import as_matrix, distance_correlation
from vflbench.protocol.hooks import Defense, StepState
from vflbench.registry import Param


def _label_matrix(targets: Tensor, num_classes: int) -> Tensor:
    """One-hot rows for class indices; soft-label rows as they are; a 1-D float target as a column."""
    if not targets.is_floating_point() and targets.dim() == 1:
        return F.one_hot(targets.long(), num_classes).float()
    return as_matrix(targets).float()


@DEFENSES.register(summary="label distance correlation: loss += weight * dCor(passive embedding, one-hot y)")
class DistanceCorrelationDefense(Defense):
    """dCor label protection (Sun et al. 2022; VFLAIR): decorrelate passive embeddings from labels.

    At the active party, for every received passive embedding h_k of the batch,
    ``loss += weight * dCor(h_k, onehot(y))`` (``form="dcor"``, as LabObf's Eq. 4 and VMask
    describe it) or ``weight * log(dCor(...))`` (``form="log"``, VFLAIR's code). The term is added
    before the cut gradient is computed, so it changes what each passive party is sent.
    Default weight 0.15 is VMask's appendix setting; LabObf's Table 3 uses 0.08 and VFLAIR's
    config 1e-4 (log form). Soft-label targets (from a label defense earlier in the list) are used
    as they are instead of one-hot rows. ``weight=0`` is the identity.
    """

    name = "dcor"
    side = "active"
    paper = "Sun et al., Label Leakage and Protection from Forward Embedding in Vertical Federated Learning (2022)"
    protects = ("labels",)
    adaptive_attacks = ("embedding_extension",)
    threat = "label inference from passive embeddings or bottom models (model completion, clustering)"
    strength_param = "weight"
    constraints: ClassVar[Mapping[str, Param]] = {
        "weight": Param("the dCor term's weight", ge=0),
        "form": Param("dcor (plain) or log (log dCor)"),
    }
    strength_direction = "larger is stronger"

    def __init__(self, *, weight: float = 0.15, form: DcorForm = "dcor") -> None:
        self.weight = weight
        self.form = form

    def regularizer(self, state: StepState) -> Tensor | None:  # noqa: D102
        if self.weight == 0 or not state.embeddings or state.targets is None:
            return None
        y = _label_matrix(state.targets, self.context_.num_classes)
        terms = [distance_correlation(h, y) for h in state.embeddings]
        if self.form == "log":
            terms = [t.log() for t in terms]
        return self.weight * torch.stack(terms).sum()


@DEFENSES.register(summary="NoPeek: passive loss += alpha * dCor(own inputs, own embedding)")
class NoPeek(Defense):
    """NoPeek (Vepakomma et al. 2020): each passive party decorrelates its embedding from its input.

    ``weighting="additive"`` (default, NoPeek's loss): the passive party adds
    ``alpha * dCor(flatten(x_k), h_k)`` to its backward. ``weighting="convex"`` is DMAVFL's Eq. 6,
    ``alpha * dCor + (1 - alpha) * task``: the received cut gradient is also scaled by
    ``1 - alpha`` (so alpha = 1 trains the bottom on dCor alone; DMAVFL sweeps 0.2 ... 1.0).
    ``form="log"`` uses log(dCor) as VFLAIR does. ``alpha=0`` is the identity.
    """

    name = "nopeek"
    side = "passive"
    paper = (
        "Vepakomma et al., NoPeek: Information leakage reduction to share activations in distributed "
        "deep learning (2020)"
    )
    protects = ("features",)
    threat = "feature reconstruction from a passive party's embeddings (model inversion, FSHA/DMAVFL-style)"
    strength_param = "alpha"
    constraints: ClassVar[Mapping[str, Param]] = {
        "alpha": Param("the dCor term's weight (in [0, 1] with weighting: convex)", ge=0),
        "weighting": Param("additive (loss + alpha dCor) or convex ((1 - alpha) loss + alpha dCor)"),
        "form": Param("dcor (plain) or log (log dCor)"),
    }
    strength_direction = "larger is stronger"

    def __init__(
        self, *, alpha: float = 0.1, weighting: Literal["additive", "convex"] = "additive", form: DcorForm = "dcor"
    ) -> None:
        if weighting == "convex" and alpha > 1:
            raise ValueError(f"with weighting 'convex' alpha must be in [0, 1], got {alpha}")
        self.alpha = alpha
        self.weighting = weighting
        self.form = form

    def on_received_gradient(self, gradient: Tensor, state: StepState) -> Tensor | None:  # noqa: D102
        if self.weighting == "convex" and self.alpha != 0:
            return (1 - self.alpha) * gradient
        return gradient

    def regularizer(self, state: StepState) -> Tensor | None:  # noqa: D102
        if self.alpha == 0 or state.inputs is None or state.embedding is None:
            return None
        d = distance_correlation(state.inputs, state.embedding)
        return self.alpha * (d.log() if self.form == "log" else d)
