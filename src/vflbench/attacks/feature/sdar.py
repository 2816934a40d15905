"""SDAR: simulator decoding with adversarial regularisation (Zhu et al., "Passive Inference Attacks
on Split Learning via Adversarial Regularization", NDSS 2025; zhxchd/SDAR_SplitNN), adapted to
VFL with the active party as the honest-but-curious attacker (DMAVFL §6.2).

While the federation trains, after every honest step on a batch (victim embeddings h, the
active party's labels y) the attacker takes ``attack_steps`` rounds of four Adam steps on a
batch of aux rows (x_a, x_p, y_s), as in the original's ``sdar.py``:

1. simulator e (the victim bottom's public architecture), with the current top model g and
   own bottom f_a frozen:
   ``CE(g(f_a(x_a) || e(x_p)), y_s) + lambda1 * BCE(D_e(e(x_p), y_s), 1)`` (``e_lr``);
2. conditional embedding discriminator D_e: real pairs (h, y) = 1, simulated (e(x_p), y_s) = 0
   (``e_dis_lr``, default ``e_lr * lambda1``);
3. conditional decoder d: ``MSE(d(f_a(x_a) || e(x_p), y_s), x_p)
   + lambda2 * BCE(D_d(d(f_a(x_a_batch) || h, y), y), 1)`` (``d_lr``);
4. conditional image/feature discriminator D_d: real aux rows (x_p, y_s) = 1, decodings of the
   real embeddings (d(... || h, y), y) = 0 (``d_dis_lr``, default ``d_lr * lambda2``).

Reconstruction: ``x~_p = d(f_a(x_a) || h, y^)`` with the victim's inference-time embeddings h of
the target rows and y^ the class the VFL model predicts for them (the active party's own
prediction; SDAR's server uses the label of the training batch it attacks, which test rows do
not have).

Adaptations (documented): the decoder also takes the attacker's own embedding f_a(x_a) (as in
URVFL's port; the original is single-client split learning); labels condition every model
through a learned 50-dimensional label embedding concatenated to the flat input (the original
adds it as an extra image channel); the discriminators are MLPs with two hidden layers of
``hidden`` units and LeakyReLU(0.2), without the original's BatchNorm and dropout (dropout would
draw from the global random stream; our embeddings are flat). Decoder: DMAVFL's (a small
upsampling CNN for image strips, an MLP for tabular slices). Defaults: the original's
(``e_lr`` 1e-3, ``d_lr`` 5e-4, lambda1 0.02, lambda2 1e-5, batch 128); the number of attack
iterations is tied to the VFL steps (the original runs 20000). Auxiliary set: held out of
training (``aux_disjoint``): the pool ``data.aux_pool`` (all of it by default). The original's
experiments split the data in half between the client and the server's auxiliary set
(``run_sdar.py``, ``aux_data_frac`` 1.0: ``data.aux_pool: 0.5``); smaller sets, down to 5% of the
client's, are its robustness study, and DMAVFL's comparison gives every baseline 1:10
(``data.aux_pool: 0.0909``); with the 46 rows that leaves on ``breast_cancer`` SDAR does not beat
the mean guess (docs/decisions/attacks.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from vflbench.attacks.base import AuxData, FeatureInference, PartyView, Phase
from vflbench.attacks.feature.common import DECODER_CONSTRAINTS, AuxBatches, decoder_for, mlp, seeded
from vflbench.attacks.feature.honest import (
    Conditional,
    CuriousActiveAttack,
    apply_gradients,
    apply_in_chunks,
    evaluating,
    expose_models,
    flat_dim,
    predicted_class,
    supervised_loss,
)
from vflbench.attacks.registry import ATTACKS
from vflbench.protocol import ActiveParty
from vflbench.registry import BATCH, LEARNING_RATE, NON_NEGATIVE, Param

PAPER = (
    "Zhu et al., Passive Inference Attacks on Split Learning via Adversarial Regularization (SDAR, NDSS 2025); "
    "zhxchd/SDAR_SplitNN; adapted to VFL as in DMAVFL §6.2 (Yao et al., arXiv 2404.19582)"
)


def _bce(logits: Tensor, value: float) -> Tensor:
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, value))


@ATTACKS.register(summary="SDAR: simulator + conditional decoder with two conditional discriminators")
class SDAR(CuriousActiveAttack):
    """SDAR by the honest-but-curious active party (see the module docstring).

    Parameters: ``victim``, ``aux_size``/``aux_fraction`` (default: the whole pool), ``aux_classes``,
    ``target_split``/``n_targets``, ``aux_batch_size`` (128), ``e_lr`` (1e-3), ``d_lr`` (5e-4),
    ``lambda1`` (0.02), ``lambda2`` (1e-5), ``e_dis_lr``/``d_dis_lr`` (``None``: ``e_lr * lambda1``
    and ``d_lr * lambda2``, the original's), ``label_dim`` (50), ``attack_steps`` (attack
    rounds per VFL step, 1), ``shadow_model``/``shadow_options`` (the simulator's architecture),
    ``hidden`` (256), ``decoder_width`` (64).
    """

    name = "sdar"
    paper = PAPER
    aux_disjoint = True  # SDAR's auxiliary set is not the client's training data (DMAVFL §3.2 on [45])
    repeatable = False  # the reconstruction is the decoder trained during training
    phase: ClassVar[Phase] = "observer"
    observes_steps = True

    constraints: ClassVar[Mapping[str, Param]] = {
        "aux_batch_size": BATCH,
        "e_lr": LEARNING_RATE,
        "d_lr": LEARNING_RATE,
        "lambda1": NON_NEGATIVE,
        "lambda2": NON_NEGATIVE,
        "e_dis_lr": Param("the encoder discriminator's learning rate (null: the original's default)", gt=0),
        "d_dis_lr": Param("the decoder discriminator's learning rate (null: the original's default)", gt=0),
        "label_dim": Param("width of the label embedding", ge=1),
        "attack_steps": Param("attack steps per training step", ge=0),
        **DECODER_CONSTRAINTS,
    }

    def __init__(
        self,
        *,
        victim: str = "passive_1",
        aux_size: int | None = None,
        aux_fraction: float | None = None,
        aux_classes: Sequence[int] | None = None,
        target_split: Literal["train", "test"] = "test",
        n_targets: int | None = None,
        aux_batch_size: int = 128,
        e_lr: float = 1e-3,
        d_lr: float = 5e-4,
        lambda1: float = 0.02,
        lambda2: float = 1e-5,
        e_dis_lr: float | None = None,
        d_dis_lr: float | None = None,
        label_dim: int = 50,
        attack_steps: int = 1,
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
        self.aux_batch_size = aux_batch_size
        self.e_lr = e_lr
        self.d_lr = d_lr
        self.lambda1 = lambda1
        self.lambda2 = lambda2
        self.e_dis_lr = e_dis_lr
        self.d_dis_lr = d_dis_lr
        self.label_dim = label_dim
        self.attack_steps = attack_steps
        self.hidden = hidden
        self.decoder_width = decoder_width

    def setup(self, party: ActiveParty, aux: AuxData, generator: torch.Generator) -> None:
        """Simulator, conditional decoder, both conditional discriminators and their optimizers."""
        classes, embed = self.scenario_.num_classes, self.scenario_.embed_dim
        own_width = 0
        if party.bottom is not None and aux.own is not None:
            with torch.no_grad(), evaluating(party.bottom):
                own_width = int(party.bottom(aux.own[:2]).shape[1])
        self.simulator_ = self.build_shadow(aux, generator)
        decoder = decoder_for(
            own_width + embed + self.label_dim, aux.victim[0], hidden=self.hidden, width=self.decoder_width
        )
        self.decoder_ = seeded(Conditional(decoder, classes, self.label_dim), generator, aux.victim)
        self.e_dis_ = seeded(
            Conditional(
                mlp(embed + self.label_dim, (self.hidden, self.hidden), 1, leaky=True), classes, self.label_dim
            ),
            generator,
            aux.victim,
        )
        self.d_dis_ = seeded(
            Conditional(
                mlp(flat_dim(aux.victim[0]) + self.label_dim, (self.hidden, self.hidden), 1, leaky=True),
                classes,
                self.label_dim,
            ),
            generator,
            aux.victim,
        )
        e_dis_lr = self.e_dis_lr if self.e_dis_lr is not None else self.e_lr * self.lambda1
        d_dis_lr = self.d_dis_lr if self.d_dis_lr is not None else self.d_lr * self.lambda2
        self.optimizers_ = {
            "simulator": torch.optim.Adam(self.simulator_.parameters(), lr=self.e_lr),
            "decoder": torch.optim.Adam(self.decoder_.parameters(), lr=self.d_lr),
            "e_dis": torch.optim.Adam(self.e_dis_.parameters(), lr=e_dis_lr),
            "d_dis": torch.optim.Adam(self.d_dis_.parameters(), lr=d_dis_lr),
        }
        self.batches_ = AuxBatches(len(aux.ids), generator)
        self.losses_: dict[str, list[float]] = {k: [] for k in self.optimizers_}
        self.keys_ = expose_models(
            party,
            self.name,
            {"simulator": self.simulator_, "decoder": self.decoder_, "e_dis": self.e_dis_, "d_dis": self.d_dis_},
        )

    def on_step(self, party: ActiveParty, ids: Tensor, h: Tensor, epoch: int, step: int) -> None:
        """``attack_steps`` SDAR rounds with the batch's real embeddings ``h`` and labels."""
        aux, opt = self.aux_, self.optimizers_
        y = self.labels_of(party, ids)
        for m in (self.simulator_, self.decoder_, self.e_dis_, self.d_dis_):
            m.train()
        with evaluating(party.bottom, party.top):
            own_real = None
            if party.bottom is not None and party.data is not None:
                with torch.no_grad():
                    own_real = party.bottom(party.features("train")[ids])
            for _ in range(self.attack_steps):
                rows = self.batches_.next(self.aux_batch_size)
                xs, ys = aux.victim[rows], aux.labels[rows]
                own_s = None
                if party.bottom is not None and aux.own is not None:
                    with torch.no_grad():
                        own_s = party.bottom(aux.own[rows])
                # 1. simulator: the task loss through the frozen top model + fool D_e
                z = self.simulator_(xs)
                loss_e = supervised_loss(self.joint_outputs(party.top, own_s, z), ys) + self.lambda1 * _bce(
                    self.e_dis_(z, ys), 1.0
                )
                apply_gradients(loss_e, list(self.simulator_.parameters()), opt["simulator"])
                # 2. D_e: real (h, y) vs simulated (e(x_s), y_s)
                loss_ed = _bce(self.e_dis_(h, y), 1.0) + _bce(self.e_dis_(z.detach(), ys), 0.0)
                apply_gradients(loss_ed, list(self.e_dis_.parameters()), opt["e_dis"])
                # 3. decoder: reconstruct aux rows from simulated embeddings + fool D_d on real ones
                recon = self.decoder_(self._input(own_s, z.detach()), ys)
                fake = self.decoder_(self._input(own_real, h), y)
                loss_d = F.mse_loss(recon, xs) + self.lambda2 * _bce(self.d_dis_(fake, y), 1.0)
                apply_gradients(loss_d, list(self.decoder_.parameters()), opt["decoder"])
                # 4. D_d: real aux rows vs decodings of real embeddings
                loss_dd = _bce(self.d_dis_(xs, ys), 1.0) + _bce(self.d_dis_(fake.detach(), y), 0.0)
                apply_gradients(loss_dd, list(self.d_dis_.parameters()), opt["d_dis"])
                for key, loss in (("simulator", loss_e), ("e_dis", loss_ed), ("decoder", loss_d), ("d_dis", loss_dd)):
                    self.losses_[key].append(float(loss.detach()))

    @staticmethod
    def _input(own_h: Tensor | None, h: Tensor) -> Tensor:
        return h if own_h is None else torch.cat([own_h, h], 1)

    def infer(self, view: PartyView) -> FeatureInference:
        """Decode the victim's inference-time embeddings, conditioned on the VFL model's predictions."""
        models = view.models
        for m in models.values():
            m.eval()
        r, own_x = self.targets(view)
        own_bottom = self.own_bottom(models, own_x)
        top, decoder = models["top"], models[self.keys_["decoder"]]

        def decode(own_rows: Tensor | None, h: Tensor) -> Tensor:
            own_h = own_bottom(own_rows) if own_bottom is not None and own_rows is not None else None
            y_hat = predicted_class(self.joint_outputs(top, own_h, h))
            return decoder(self._input(own_h, h), y_hat)

        features = apply_in_chunks(decode, own_x, r.embeddings)
        losses = getattr(self, "losses_", {})
        return FeatureInference(
            r.ids,
            features,
            r.split,
            shadow=models[self.keys_["simulator"]],
            details={
                "aux_rows": len(view.aux.ids) if view.aux is not None else 0,
                "final_losses": {k: sum(v[-50:]) / len(v[-50:]) for k, v in losses.items() if v},
            },
        )
