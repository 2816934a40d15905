"""GIA: the generative (gradient-based) inversion attack on VFL with a shadow model, as DMAVFL §2.1
and §6.2 describe it (their reference [18]; URVFL's ``gia_attack``).

The honest-but-curious active party

1. keeps the victim's embeddings of its auxiliary rows (they are training rows, so the victim
   sends them during training; see :mod:`vflbench.attacks.feature.honest`),
2. trains a shadow model f_s (the scenario's public bottom architecture) on the pairs
   (x_p, h) of the aux rows with MSE (``shadow_epochs`` passes, Adam ``shadow_lr``, batch
   ``batch_size``): "trains a shadow model using the collected auxiliary features and
   embeddings pairs" (DMAVFL §2.1),
3. for every target row, optimises x^ (initialised at 0) for ``opt_steps`` Adam steps
   (``opt_lr``, AMSGrad) so that f_s(x^) matches the embedding the victim sent: "optimizes noise
   to reduce the distance between the noise embeddings and real data embeddings" (§6.2).

Defaults are URVFL's (``gia_epochs`` 50 shadow epochs, ``gia_opt_round`` 50 steps of Adam 1e-3
with AMSGrad from x^ = 0; shadow Adam 1e-4, batch 128). With these, x^ barely leaves 0 (50 steps
of at most ~1e-3 each), which is why DMAVFL's Table 1 GIA error on MNIST (0.9173 in [-1, 1]
pixel units) is that of an all-background image; ``opt_steps``/``opt_lr`` make the attack
stronger. ``bounds: "aux"`` clips x^ into the aux rows' value range after every step (off by
default, as in URVFL).

Documented differences from URVFL's code: the shadow is fitted to the victim's embeddings, as the
paper describes, not to the joint model's outputs, and x^ is matched to the victim's real
embedding of the target row (URVFL's reconstruction loop matches the outputs of the shadow on
the target's true features, with cross-entropy between two logit vectors, a QUIRK).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from vflbench.attacks.base import FeatureInference, PartyView, Phase, Scale
from vflbench.attacks.feature.honest import CuriousActiveAttack, fit_regression, invert_embeddings
from vflbench.attacks.registry import ATTACKS
from vflbench.registry import BATCH, EPOCHS, LEARNING_RATE, NON_NEGATIVE, Param

PAPER = (
    "GIA as described and evaluated in DMAVFL (Yao et al., arXiv 2404.19582) §2.1/§6.2, ref. [18]; URVFL's gia_attack"
)


@ATTACKS.register(summary="GIA: shadow fitted to the victim's aux embeddings, then per-row input optimisation")
class GIA(CuriousActiveAttack):
    """GIA by the honest-but-curious active party (see the module docstring).

    Parameters: ``victim``, ``aux_size``/``aux_fraction`` (default 10%), ``aux_classes``,
    ``target_split``/``n_targets``, ``shadow_epochs`` (50), ``shadow_lr`` (1e-4), ``batch_size``
    (128), ``opt_steps`` (50), ``opt_lr`` (1e-3), ``bounds`` (``None`` or ``"aux"``),
    ``shadow_model``/``shadow_options`` (the shadow's architecture; default the config's bottom).
    """

    name = "gia"
    paper = PAPER
    aux_disjoint = False  # GIA inserts its aux features into the victim's data (DMAVFL §2.1)
    phase: ClassVar[Phase] = "observer"  # it keeps the victim's embeddings of the aux rows during training
    search_space: ClassVar[Mapping[str, tuple[Any, ...]]] = {
        "shadow_lr": (1e-4, 1e-3, 1e-2),
        "opt_lr": (1e-3, 1e-2, 1e-1),
        "opt_steps": (Scale(1.0), Scale(4.0)),
    }
    """The shadow's fit and the per-row inversion, both after training."""

    constraints: ClassVar[Mapping[str, Param]] = {
        "shadow_epochs": EPOCHS,
        "shadow_lr": LEARNING_RATE,
        "batch_size": BATCH,
        "opt_steps": Param("optimisation steps per row", ge=0),
        "opt_lr": LEARNING_RATE,
        "bounds": Param("clamp reconstructions to the auxiliary set's range ('aux') or not (null)"),
        "init": Param("the starting point of the optimisation"),
        "tv_weight": NON_NEGATIVE,
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
        shadow_epochs: int = 50,
        shadow_lr: float = 1e-4,
        batch_size: int = 128,
        opt_steps: int = 50,
        opt_lr: float = 1e-3,
        bounds: Literal["aux"] | None = None,
        init: Literal["zeros", "aux_mean"] = "zeros",
        tv_weight: float = 0.0,
        shadow_model: str | None = None,
        shadow_options: dict[str, Any] | None = None,
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
        self.shadow_epochs = shadow_epochs
        self.shadow_lr = shadow_lr
        self.batch_size = batch_size
        self.opt_steps = opt_steps
        self.opt_lr = opt_lr
        self.bounds = bounds
        self.init = init
        self.tv_weight = tv_weight

    def records_aux(self) -> bool:  # noqa: D102
        return True

    def uses_top(self) -> bool:  # noqa: D102
        return False

    def infer(self, view: PartyView) -> FeatureInference:
        """Fit the shadow on the aux pairs, then invert the target rows' embeddings through it."""
        aux = view.aux
        assert aux is not None
        rows, h_aux = self.aux_embeddings(view)
        shadow = self.build_shadow(aux, view.generator)
        losses = fit_regression(
            shadow,
            aux.victim[rows],
            h_aux,
            epochs=self.shadow_epochs,
            lr=self.shadow_lr,
            batch_size=self.batch_size,
            generator=view.generator,
        )
        r, _ = self.targets(view)
        bounds = (float(aux.victim.min()), float(aux.victim.max())) if self.bounds == "aux" else None
        features = invert_embeddings(
            shadow,
            r.embeddings,
            aux.victim.shape[1:],
            steps=self.opt_steps,
            lr=self.opt_lr,
            tv_weight=self.tv_weight,
            l2_weight=0.0,
            bounds=bounds,
            init=aux.victim.mean(0) if self.init == "aux_mean" else None,
            amsgrad=True,
        )
        return FeatureInference(
            r.ids,
            features,
            r.split,
            shadow=shadow,
            details={
                "aux_rows": len(aux.ids),
                "aux_embeddings": len(rows),
                "shadow_losses": losses[-1:] if losses else [],
            },
        )
