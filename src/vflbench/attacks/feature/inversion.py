"""Model inversion (MI) of the victim's embeddings by the honest-but-curious active party: He, Zhang
and Lee, "Model Inversion Attacks Against Collaborative Inference" (ACSAC 2019;
zechenghe/Inverse_Collaborative_Inference), as Kang et al. evaluate it in VFL (§6.2, eq. 12;
§8.5.3, Tables 16-17).

``mode: "query_free"`` (Kang et al.'s MI, He et al.'s query-free attack):

1. after training, the active party trains a shadow f~_B of the victim's bottom model (the
   victim's architecture, which Kang's Table 16 assumes the attacker knows; ``shadow_model``
   changes it, as in Table 17) on its auxiliary labelled rows, **with its own bottom and top
   models fixed**: ``CE(h_A(f_A(x_A) || f~_B(x_B)), y)`` (``shadow_epochs`` passes, batch
   ``batch_size``, Adam ``shadow_lr`` with eps 1e-3 and AMSGrad, the rate halved every
   ``halve_every`` epochs, as He et al.'s ``trainAlternativeDNN``);
2. for every target row it optimises x~_B, initialised at 0, so that f~_B(x~_B) matches the
   embedding u_inf the victim sent at inference time (Kang eq. 12), with He et al.'s total
   variation prior: ``mean((f~_B(x~) - u_inf)^2) + tv_weight * TV(x~) + l2_weight * mean(x~^2)``
   (``steps`` Adam steps of ``lr``, eps 1e-3, AMSGrad; He et al.'s query-free test settings:
   500 iterations, lr 0.1, lambda_TV 2, lambda_l2 0). x~ is clipped into the value range of
   the aux rows after every step (``bounds: "aux"``, our choice: He et al. optimise in
   normalised space without a box).

``mode: "black_box"`` (He et al.'s inverse network; the default): the active party learns an inverse
network g: u -> x_B on the pairs (u, x_B) of its aux rows, u being the embeddings the victim
sent for those rows during training (see :mod:`vflbench.attacks.feature.honest`), with MSE
(``inverse_epochs`` 50, batch ``batch_size``, Adam ``inverse_lr`` 1e-3, eps 1e-3, AMSGrad, halved
every ``halve_every`` = 10 epochs: He et al.'s ``inverse_blackbox_decoder``), and reconstructs
``x~_B = g(u_inf)``. The inverse network is DMAVFL's decoder architecture (a small upsampling CNN
with a Sigmoid for image strips, an MLP with two hidden layers of ``hidden`` units for tabular
slices) in place of He et al.'s layer-specific transposed convolutions.

Kang et al. score MI by SSIM (Table 7), which the runner reports for image slices next to
the MSE.

Why the default is ``black_box``: the query-free shadow is trained only through the fixed top
model, which pins it down only as far as the top model's decisions do, so it is not the victim's
bottom model (embedding cosine distance 0.47 on digits, 0.75 on breast_cancer), and inverting it
lands further from the truth than the aux-mean guess: MSE 0.127 vs 0.068 (SSIM 0.25 vs the mean
image's 0.51) on digits, 4.89 vs 0.87 on breast_cancer (seed 0, VHNN, 10 epochs; also worse than
the mean guess in our Kang Table 16 run on MNIST, docs/notes/reproduction_feature.md). The inverse
network learns the victim's own embedding-to-feature map from the aux pairs and beats the
aux-mean guess on both (docs/decisions/attacks.md). Set ``mode: query_free`` for Kang et al.'s attack.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch

from vflbench.attacks.base import FeatureInference, PartyView, Scale, Scenario
from vflbench.attacks.feature.common import DECODER_CONSTRAINTS, decoder_for, seeded
from vflbench.attacks.feature.honest import (
    CuriousActiveAttack,
    apply_gradients,
    apply_in_chunks,
    fit_regression,
    invert_embeddings,
    permutation_batches,
    supervised_loss,
)
from vflbench.attacks.registry import ATTACKS
from vflbench.registry import BATCH, EPOCHS, LEARNING_RATE, NON_NEGATIVE, Param

PAPER = (
    "He, Zhang & Lee, Model Inversion Attacks Against Collaborative Inference (ACSAC 2019); "
    "Kang et al., A Framework for Evaluating Privacy-Utility Trade-off in VFL, §6.2 eq. 12 and §8.5.3"
)
ADAM_EPS = 1e-3  # He et al.'s Adam epsilon (with AMSGrad) for every optimiser


@ATTACKS.register(
    summary="model inversion of the victim's embeddings: query-free shadow + TV prior, or a black-box inverse network"
)
class ModelInversion(CuriousActiveAttack):
    """Model inversion by the honest-but-curious active party (see the module docstring).

    Parameters: ``victim``, ``aux_size``/``aux_fraction`` (default 10%), ``aux_classes``,
    ``target_split``/``n_targets``, ``mode`` (``"black_box"``, the default, or ``"query_free"``),
    ``shadow_epochs`` (50), ``shadow_lr`` (1e-3), ``batch_size`` (32), ``halve_every`` (10),
    ``steps`` (500), ``lr`` (0.1), ``tv_weight`` (2.0), ``l2_weight`` (0.0), ``bounds``
    (``"aux"`` or ``None``), ``inverse_epochs`` (50), ``inverse_lr`` (1e-3),
    ``shadow_model``/``shadow_options`` (the shadow's architecture; default the config's
    bottom), ``hidden`` (256), ``decoder_width`` (64).
    """

    name = "model_inversion"
    paper = PAPER
    search_space: ClassVar[Mapping[str, tuple[Any, ...]]] = {
        "inverse_lr": (1e-4, 1e-3, 1e-2),
        "inverse_epochs": (Scale(0.5), Scale(1.0), Scale(2.0)),
        "shadow_lr": (1e-4, 1e-3, 1e-2),
        "lr": (0.01, 0.1, 1.0),
        "tv_weight": (0.0, 0.5, 2.0),
    }
    """Black box: the inverse network's learning rate and epochs; query-free: the shadow's learning rate, the
    inversion's learning rate and its TV weight (:meth:`search_grid` picks the mode's)."""

    constraints: ClassVar[Mapping[str, Param]] = {
        "mode": Param("query_free (a shadow model, then optimisation) or black_box (an inverse network)"),
        "shadow_epochs": EPOCHS,
        "shadow_lr": LEARNING_RATE,
        "batch_size": BATCH,
        "halve_every": Param("steps between halvings of the inversion's learning rate", ge=1),
        "steps": Param("optimisation steps", ge=0),
        "lr": LEARNING_RATE,
        "tv_weight": NON_NEGATIVE,
        "l2_weight": NON_NEGATIVE,
        "bounds": Param("clamp reconstructions to the auxiliary set's range ('aux') or not (null)"),
        "inverse_epochs": EPOCHS,
        "inverse_lr": LEARNING_RATE,
        **DECODER_CONSTRAINTS,
    }

    def __init__(
        self,
        *,
        victim: str = "passive_1",
        aux_size: int | None = None,
        aux_fraction: float | None = 0.1,
        aux_classes: Sequence[int] | None = None,
        target_split: Literal["train", "test"] = "test",
        n_targets: int | None = None,
        mode: Literal["query_free", "black_box"] = "black_box",
        shadow_epochs: int = 50,
        shadow_lr: float = 1e-3,
        batch_size: int = 32,
        halve_every: int = 10,
        steps: int = 500,
        lr: float = 0.1,
        tv_weight: float = 2.0,
        l2_weight: float = 0.0,
        bounds: Literal["aux"] | None = "aux",
        inverse_epochs: int = 50,
        inverse_lr: float = 1e-3,
        shadow_model: str | None = None,
        shadow_options: dict[str, Any] | None = None,
        hidden: int = 256,
        decoder_width: int = 64,
    ) -> None:
        super().__init__(
            victim=victim,
            aux_size=aux_size,
            aux_fraction=aux_fraction,
            aux_classes=aux_classes,
            target_split=target_split,
            n_targets=n_targets,
            shadow_model=shadow_model,
            shadow_options=shadow_options,
        )
        self.mode = mode
        self.shadow_epochs = shadow_epochs
        self.shadow_lr = shadow_lr
        self.batch_size = batch_size
        self.halve_every = halve_every
        self.steps = steps
        self.lr = lr
        self.tv_weight = tv_weight
        self.l2_weight = l2_weight
        self.bounds = bounds
        self.inverse_epochs = inverse_epochs
        self.inverse_lr = inverse_lr
        self.hidden = hidden
        self.decoder_width = decoder_width

    def records_aux(self) -> bool:  # noqa: D102
        return self.mode == "black_box"

    def search_grid(self, scenario: Scenario) -> Mapping[str, tuple[Any, ...]]:
        """The settings the configured ``mode`` uses after training."""
        keys = ("inverse_lr", "inverse_epochs") if self.mode == "black_box" else ("shadow_lr", "lr", "tv_weight")
        return {k: self.search_space[k] for k in keys}

    def uses_top(self) -> bool:  # noqa: D102
        return self.mode == "query_free"

    def infer(self, view: PartyView) -> FeatureInference:  # noqa: D102
        return self._black_box(view) if self.mode == "black_box" else self._query_free(view)

    def _query_free(self, view: PartyView) -> FeatureInference:
        """Kang eq. 12: a shadow trained through the fixed top model, then TV-regularised inversion."""
        aux = view.aux
        assert aux is not None
        models = view.models
        for m in models.values():
            m.eval()
            for p in m.parameters():
                p.requires_grad_(False)
        top = models["top"]
        own_bottom = self.own_bottom(models, aux.own)
        own_aux = apply_in_chunks(own_bottom, aux.own) if own_bottom is not None else None
        shadow = self.build_shadow(aux, view.generator)
        opt = torch.optim.Adam(shadow.parameters(), lr=self.shadow_lr, eps=ADAM_EPS, amsgrad=True)
        params = list(shadow.parameters())
        losses = []
        for epoch in range(self.shadow_epochs):
            shadow.train()
            total = []
            for rows in permutation_batches(len(aux.ids), self.batch_size, view.generator):
                own = own_aux[rows] if own_aux is not None else None
                loss = supervised_loss(self.joint_outputs(top, own, shadow(aux.victim[rows])), aux.labels[rows])
                apply_gradients(loss, params, opt)
                total.append(float(loss.detach()))
            losses.append(sum(total) / len(total))
            if (epoch + 1) % self.halve_every == 0:
                for group in opt.param_groups:
                    group["lr"] /= 2
        shadow.eval()
        r, _ = self.targets(view)
        bounds = (float(aux.victim.min()), float(aux.victim.max())) if self.bounds == "aux" else None
        features = invert_embeddings(
            shadow,
            r.embeddings,
            aux.victim.shape[1:],
            steps=self.steps,
            lr=self.lr,
            tv_weight=self.tv_weight,
            l2_weight=self.l2_weight,
            bounds=bounds,
            eps=ADAM_EPS,
            amsgrad=True,
        )
        return FeatureInference(
            r.ids,
            features,
            r.split,
            shadow=shadow,
            details={"mode": self.mode, "aux_rows": len(aux.ids), "shadow_loss": losses[-1] if losses else None},
        )

    def _black_box(self, view: PartyView) -> FeatureInference:
        """He et al.'s inverse network, trained on the (embedding, features) pairs of the aux rows."""
        aux = view.aux
        assert aux is not None
        rows, h_aux = self.aux_embeddings(view)
        inverse = seeded(
            decoder_for(h_aux.shape[1], aux.victim[0], hidden=self.hidden, width=self.decoder_width),
            view.generator,
            h_aux,
        )
        losses = fit_regression(
            inverse,
            h_aux,
            aux.victim[rows],
            epochs=self.inverse_epochs,
            lr=self.inverse_lr,
            batch_size=self.batch_size,
            generator=view.generator,
            eps=ADAM_EPS,
            amsgrad=True,
            halve_every=self.halve_every,
        )
        r, _ = self.targets(view)
        features = apply_in_chunks(inverse, r.embeddings)
        return FeatureInference(
            r.ids,
            features,
            r.split,
            details={
                "mode": self.mode,
                "aux_rows": len(aux.ids),
                "aux_embeddings": len(rows),
                "inverse_loss": losses[-1] if losses else None,
            },
        )
