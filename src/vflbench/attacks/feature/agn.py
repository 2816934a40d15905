"""AGN, the active data reconstruction attack of Vu et al. (IEEE BigData 2023), as ported by URVFL.

No authors' code exists; this follows URVFL's reimplementation (``baseline_module.py::agn_attack``):
the malicious active party discards the top model; a generator G takes the adversary's own
features x_a, its bottom model's embedding f_a(x_a) and the victim's embedding h, and outputs
the victim's features; a discriminator tells real auxiliary samples (x_a, x_p) from
(x_a, G(...)). Every batch:

* generator loss ``BCE(D(x_a, G(x_a, f_a(x_a), h)), 1)``: its gradient with respect to h is
  sent to the victim INSTEAD of the honest cut gradient (the malicious gradient), and G and f_a
  take an Adam step (``lr`` 1e-4) on it;
* discriminator loss ``BCE(D(aux), 1) + BCE(D(x_a, G(...)), 0)`` on a batch of
  ``aux_batch_size`` aux rows, Adam ``disc_lr`` (1e-4, amsgrad as in URVFL).

AGN never uses the labels or a reconstruction loss. Reconstruction: ``G(x_a, f_a(x_a), h)``
with the embeddings the victim sends at inference time. There is no shadow model, so no
embedding distances (DMAVFL Table 1 has none for AGN either).

Adaptations: URVFL's AGN decoder has separate conv stacks for the embedding and the half image
and outputs the full image; here G is the shared decoder on ``flatten(x_a) || f_a(x_a) || h``
and outputs the victim's slice only; the discriminator is an MLP on
``flatten(x_a) || flatten(x_p)`` (two hidden layers of ``hidden`` units, LeakyReLU 0.2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.attacks.base import AuxData
from vflbench.attacks.feature.common import Adversary, AuxBatches, MaliciousActiveAttack, decoder_for, mlp, seeded
from vflbench.attacks.registry import ATTACKS
from vflbench.protocol import ActiveParty

AGN_PAPER = (
    "Vu, Tre'R, Alharbi, Thai, Active Data Reconstruction Attacks in Vertical Federated Learning "
    "(IEEE BigData 2023); URVFL's port, duanyiyao/URVFL baseline_module.py agn_attack"
)


@ATTACKS.register(summary="AGN (Vu et al.): generator + real/fake discriminator send malicious gradients")
class AGN(MaliciousActiveAttack):
    """AGN as ported by URVFL; see the module docstring.

    Parameters as :class:`~vflbench.attacks.feature.dmavfl.DMAVFL` where shared, plus ``lr``
    (1e-4, generator and f_a) and ``disc_lr`` (1e-4, discriminator, amsgrad).
    """

    name = "agn"
    paper = AGN_PAPER
    aux_disjoint = True  # evaluated in DMAVFL's setting (§6.1: D_aux ∩ D_train = ∅)
    has_shadow: ClassVar[bool] = False

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
        disc_lr: float = 1e-4,
        hidden: int = 256,
        decoder_width: int = 64,
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
            aux_batch_size=aux_batch_size,
            lr=lr,
            shadow_model=shadow_model,
            shadow_options=shadow_options,
            hidden=hidden,
            decoder_width=decoder_width,
        )
        self.disc_lr = disc_lr

    def build(self, party: ActiveParty, aux: AuxData, generator: torch.Generator) -> Adversary:  # noqa: D102
        own = party.bottom if aux.own is not None else None
        own_flat = int(math.prod(aux.own.shape[1:])) if aux.own is not None else 0
        victim_flat = int(math.prod(aux.victim.shape[1:]))
        in_dim = own_flat + self.own_width(party, aux) + self.scenario_.embed_dim
        gen = seeded(
            decoder_for(in_dim, aux.victim[0], hidden=self.hidden, width=self.decoder_width), generator, aux.victim
        )
        disc = seeded(mlp(own_flat + victim_flat, (self.hidden, self.hidden), 1, leaky=True), generator, aux.victim)
        optimizers = {
            "generator": self.adam([own, gen], self.lr),
            "discriminator": self.adam([disc], self.disc_lr, amsgrad=True),
        }
        return Adversary(party, aux, AuxBatches(len(aux.ids), generator), generator, own, None, gen, disc, optimizers)

    @staticmethod
    def _joint(own_x: Tensor | None, victim_x: Tensor) -> Tensor:
        parts = ([own_x.flatten(1)] if own_x is not None else []) + [victim_x.flatten(1)]
        return torch.cat(parts, 1)

    def _generate(self, own: nn.Module | None, gen: nn.Module, own_x: Tensor | None, h: Tensor) -> Tensor:
        parts = []
        if own_x is not None and own is not None:
            parts += [own_x.flatten(1), own(own_x)]
        parts.append(h)
        return gen(torch.cat(parts, 1))

    def attack_step(self, state: Adversary, ids: Tensor, h: Tensor, y: Tensor) -> tuple[Tensor, float]:  # noqa: D102
        own_x = state.party.features("train")[ids] if state.own is not None else None
        for m in (state.own, state.decoder, state.discriminator):
            if m is not None:
                m.train()
        fake = self._generate(state.own, state.decoder, own_x, h)
        score = state.discriminator(self._joint(own_x, fake))
        loss_g = F.binary_cross_entropy_with_logits(score, torch.ones_like(score))
        opt_g = state.optimizers["generator"]
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        assert h.grad is not None
        g = h.grad.detach().clone()
        opt_g.step()
        rows = state.batches.next(self.aux_batch_size)
        aux = state.aux
        real = state.discriminator(
            self._joint(aux.own[rows] if own_x is not None and aux.own is not None else None, aux.victim[rows])
        )
        fake_score = state.discriminator(self._joint(own_x, fake.detach()))
        loss_d = F.binary_cross_entropy_with_logits(real, torch.ones_like(real)) + F.binary_cross_entropy_with_logits(
            fake_score, torch.zeros_like(fake_score)
        )
        opt_d = state.optimizers["discriminator"]
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
        return g, float(loss_g.detach())

    def decode(self, models: dict[str, nn.Module], own_x: Tensor | None, h: Tensor) -> Tensor:
        """G(x_a, f_a(x_a), h)."""
        return self._generate(models.get("bottom"), models["decoder"], own_x, h)
