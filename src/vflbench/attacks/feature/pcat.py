"""PCAT: the pseudo-client attack (Gao & Zhang, "Feature Inference Attack on Split Learning with a
Pseudo-Client"; IEEE TDSC 2024 journal version), as DMAVFL §6.2 adapts it to VFL (URVFL's
``pcat_attack``).

While the federation trains, the honest-but-curious active party trains a *pseudo-client* (a
shadow f_s of the victim's bottom model, the scenario's public bottom architecture) on its
auxiliary rows through the **current** top model and its own bottom model: after every honest
training step it takes ``shadow_steps`` Adam steps (``lr``) on
``L = CE(top(f_a(x_a) || f_s(x_p)), y)`` for batches of ``aux_batch_size`` aux rows, updating
only f_s. After training, a decoder f_d learns to invert the pseudo-client on the aux rows,
``MSE(f_d(f_a(x_a) || f_s(x_p)), x_p)`` (``decoder_epochs`` passes, Adam ``decoder_lr``), and is
applied to the embeddings the victim sends for the target rows: ``x~_p = f_d(f_a(x_a) || h)``.

Differences from URVFL's port (documented judgement calls): the pseudo-client's aux loss does
not leak into the next honest step (URVFL never zeroes the server's gradient from it, a QUIRK;
here the attacker stays honest), there is no checkpoint at the best test accuracy (the final
models are attacked), and the decoder reconstructs the victim's slice only (URVFL decodes the
whole image, the adversary's known half included). Decoder architecture: as DMAVFL's (a
small upsampling CNN for image strips, an MLP with two hidden layers of ``hidden`` units for
tabular slices; :func:`~vflbench.attacks.feature.common.decoder_for`). Defaults: URVFL's
``config_cifar.json`` (Adam 1e-4, batch 128, ``pcat_dec_epochs`` 30) and DMAVFL §6.1 (aux =
10% of the training rows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from vflbench.attacks.base import AuxData, FeatureInference, PartyView, Phase, Scale
from vflbench.attacks.feature.common import DECODER_CONSTRAINTS, AuxBatches, decoder_for, seeded
from vflbench.attacks.feature.honest import (
    CuriousActiveAttack,
    apply_gradients,
    apply_in_chunks,
    evaluating,
    expose_models,
    permutation_batches,
    supervised_loss,
)
from vflbench.attacks.registry import ATTACKS
from vflbench.protocol import ActiveParty
from vflbench.registry import BATCH, EPOCHS, LEARNING_RATE, Param

PAPER = (
    "Gao & Zhang, Feature Inference Attack on Split Learning with a Pseudo-Client (PCAT; IEEE TDSC 2024), "
    "adapted to VFL as in DMAVFL §6.2 (Yao et al., arXiv 2404.19582) / URVFL's pcat_attack"
)


@ATTACKS.register(summary="PCAT: pseudo-client trained through the current top model on aux rows + decoder")
class PCAT(CuriousActiveAttack):
    """Pseudo-client attack by the honest-but-curious active party (see the module docstring).

    Parameters: ``victim``, ``aux_size``/``aux_fraction`` (default: the whole held-out pool),
    ``aux_classes``, ``target_split``/``n_targets`` (rows scored), ``aux_batch_size`` (128),
    ``lr`` (1e-4, the pseudo-client's Adam), ``shadow_steps`` (1 pseudo-client step per VFL
    step), ``decoder_epochs`` (30), ``decoder_lr`` (1e-4), ``shadow_model``/``shadow_options``
    (the pseudo-client's architecture; default the config's bottom), ``hidden`` (256, tabular
    decoder width), ``decoder_width`` (64, image decoder channels).
    """

    name = "pcat"
    paper = PAPER
    aux_disjoint = True  # as DMAVFL §3.2 reads PCAT [12]: D_aux ∩ D_train = ∅
    phase: ClassVar[Phase] = "observer"
    observes_steps = True
    search_space: ClassVar[Mapping[str, tuple[Any, ...]]] = {
        "decoder_lr": (1e-4, 1e-3, 1e-2),
        "decoder_epochs": (Scale(0.5), Scale(1.0), Scale(2.0)),
    }
    """The decoder, trained after training (the pseudo-client, trained during training, is not searched)."""

    constraints: ClassVar[Mapping[str, Param]] = {
        "aux_batch_size": BATCH,
        "lr": LEARNING_RATE,
        "shadow_steps": Param("pseudo-client steps per training step", ge=0),
        "decoder_epochs": EPOCHS,
        "decoder_lr": LEARNING_RATE,
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
        lr: float = 1e-4,
        shadow_steps: int = 1,
        decoder_epochs: int = 30,
        decoder_lr: float = 1e-4,
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
        self.lr = lr
        self.shadow_steps = shadow_steps
        self.decoder_epochs = decoder_epochs
        self.decoder_lr = decoder_lr
        self.hidden = hidden
        self.decoder_width = decoder_width

    def setup(self, party: ActiveParty, aux: AuxData, generator: torch.Generator) -> None:
        """The pseudo-client, its optimizer and the aux batch stream."""
        self.shadow_ = self.build_shadow(aux, generator)
        self.optimizer_ = torch.optim.Adam(self.shadow_.parameters(), lr=self.lr)
        self.batches_ = AuxBatches(len(aux.ids), generator)
        self.losses_: list[float] = []
        self.keys_ = expose_models(party, self.name, {"shadow": self.shadow_})

    def on_step(self, party: ActiveParty, ids: Tensor, h: Tensor, epoch: int, step: int) -> None:
        """``shadow_steps`` pseudo-client steps through the current (frozen) top and own bottom models."""
        aux = self.aux_
        params = list(self.shadow_.parameters())
        for _ in range(self.shadow_steps):
            rows = self.batches_.next(self.aux_batch_size)
            with evaluating(party.bottom, party.top):
                own = None
                if party.bottom is not None and aux.own is not None:
                    with torch.no_grad():
                        own = party.bottom(aux.own[rows])
                self.shadow_.train()
                loss = supervised_loss(
                    self.joint_outputs(party.top, own, self.shadow_(aux.victim[rows])), aux.labels[rows]
                )
                apply_gradients(loss, params, self.optimizer_)
            self.losses_.append(float(loss.detach()))

    def infer(self, view: PartyView) -> FeatureInference:
        """Train the decoder on the pseudo-client's aux embeddings; decode the victim's real embeddings."""
        aux = view.aux
        assert aux is not None
        models = view.models
        shadow = models[self.keys_["shadow"]]
        own_bottom = self.own_bottom(models, aux.own)
        for m in models.values():
            m.eval()
        with torch.no_grad():
            parts = [] if own_bottom is None else [apply_in_chunks(own_bottom, aux.own)]
            inputs = torch.cat([*parts, apply_in_chunks(shadow, aux.victim)], 1)
        decoder = seeded(
            decoder_for(inputs.shape[1], aux.victim[0], hidden=self.hidden, width=self.decoder_width),
            view.generator,
            inputs,
        )
        opt = torch.optim.Adam(decoder.parameters(), lr=self.decoder_lr)
        losses = []
        decoder.train()
        for _ in range(self.decoder_epochs):
            total = []
            for rows in permutation_batches(len(inputs), self.aux_batch_size, view.generator):
                loss = F.mse_loss(decoder(inputs[rows]), aux.victim[rows])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total.append(float(loss.detach()))
            losses.append(sum(total) / len(total))
        decoder.eval()
        r, own_x = self.targets(view)
        own_bottom = self.own_bottom(models, own_x)

        def decode(own_rows: Tensor | None, h: Tensor) -> Tensor:
            parts = [] if own_bottom is None or own_rows is None else [own_bottom(own_rows)]
            return decoder(torch.cat([*parts, h], 1))

        features = apply_in_chunks(decode, own_x, r.embeddings)
        return FeatureInference(
            r.ids,
            features,
            r.split,
            shadow=shadow,
            details={
                "aux_rows": len(aux.ids),
                "decoder_losses": losses,
                "pseudo_client_loss": (
                    sum(self.losses_[-50:]) / len(self.losses_[-50:]) if getattr(self, "losses_", None) else None
                ),
            },
        )
