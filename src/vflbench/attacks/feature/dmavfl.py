"""DMAVFL and DMAVFL_sync (Yao et al., arXiv 2404.19582, Algorithms 1-3; URVFL code).

The malicious active party steals the victim's features with a discriminator with auxiliary
classifier (DAC) over 2C classes:

1. **Pretraining** (Algorithm 1, in :meth:`install`, ``pretrain_epochs`` passes over the aux
   set, Adam ``lr``): the adversary's bottom f_a (its own slice), the encoder/shadow f_e (the
   victim's slice) and the decoder f_d minimise Eq. (1), ``MSE(f_d(f_a(x_a) || f_e(x_p)), x_p)``.
   f_a, f_e and f_d are then frozen. By default (``pretrain_epochs: null``) the pretraining takes
   as many Adam steps as URVFL's (20 epochs of its 4,545 aux rows in batches of 128: 20 x 36 =
   720 steps), i.e. ``max(20, ceil(720 / batches per pass))`` passes: on a small aux set 20
   passes are a few dozen steps and leave the decoder untrained.
2. **Malicious gradient generation** (Algorithm 2, every training batch, in place of the honest
   step): with y the batch labels, the victim receives ``dL_M/dh`` of
   ``L_M = CE(D(h), y+)`` (Eq. 4) INSTEAD of the honest cut gradient; then the DAC takes one
   Adam step (``disc_lr``) on ``L_D = CE(D(h), y-) + CE(D(f_e(x_aux)), y_aux+)`` (Eq. 5) with a
   batch of ``aux_batch_size`` aux rows. Class indices follow URVFL's ``cls_pretrain``: the
   "fake" label y- of a real victim embedding of class y is ``2y``, the "real" label y+ of a
   shadow embedding of class y is ``2y + 1``, so the victim is pushed towards "shadow embedding
   of the same class".
3. **Reconstruction** (§5.4): ``f_d(f_a(x_a) || h)`` with the embeddings h the victim sends at
   inference time.

``dmavfl_sync`` (Algorithm 3) has no pretraining (``pretrain_epochs=0``; more is refused
unless ``hybrid=True`` asks for a pretrained-and-synchronous hybrid, which is not in the paper);
each batch first takes one Eq. (1) step of f_a, f_e, f_d on an aux batch, then computes L_M,
sends its gradient and updates the DAC with the updated encoder's aux embeddings.

Auxiliary set: disjoint from the training set (``aux_disjoint``; §3.2 and §6.1: D_aux ∩
D_train = ∅, |D_aux| : |D_train| = 1 : 10). It is the pool of rows held out of every party's
training (``data.aux_pool``; 1/11 of the training split gives the paper's 10 training rows per aux
row, Table 10: 1,909 aux and 19,091 training rows of Credit's 21,000), all of it unless
``aux_size``/``aux_fraction`` take fewer of its rows.

Utility: the malicious party has no honest top model any more; its predictions are the DAC's
(class scores ``logsumexp`` over the real/fake pair of each class), which is what a deployed
DMAVFL would answer with. A task whose objective does not have one output per class (binary
VLR's single logit) is refused before training rather than answered by the never-trained top
model.

SplitGuard's fake batches (``splitguard``): SplitGuard makes the active party train some batches on
randomised labels and compares the gradients those get with the others'. DMAVFL's evaluation has the
malicious party train every batch as it comes, fake ones included (``cooperative``, the default: L_M
and L_D with the randomised labels). The active party owns the labels, though, and sees the same row ids
relabelled, so it can tell a fake batch from a regular one: under ``aware`` the malicious step runs only
on batches whose labels match its own stored labels; a fake batch gets the honest step's gradient (the
top model trained on the labels as given, the party's own bottom f_a untouched, no DAC update), and
its top model keeps training honestly on the regular batches too, so that its answers to fake batches
are those of a model trained on the task.

Defaults follow URVFL's ``config_cifar.json`` (Adam 1e-4 for every model, pretraining 20
epochs = 720 steps, batch 128) and DMAVFL §6.1 and Table 10 (aux : train = 1 : 10); the VFL
epochs, batch size and the victim's optimizer are the config's ``train`` section (URVFL trains 25
epochs; on the embedded datasets DMAVFL beats the aux-mean guess after 25 epochs but not yet after
10, see docs/decisions/attacks.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from vflbench.attacks.base import AuxData, FeatureInference, PartyView, Scenario, ThreatGrant, require, victims_of
from vflbench.attacks.feature.common import (
    DMAVFL_PAPER,
    Adversary,
    AuxBatches,
    BNConvDAC,
    ConvDAC,
    MaliciousActiveAttack,
    class_indices,
    decoder_for,
    mlp,
    seeded,
)
from vflbench.attacks.registry import ATTACKS
from vflbench.errors import ConfigError
from vflbench.protocol import ActiveParty
from vflbench.protocol.hooks import PartyHook
from vflbench.protocol.messages import passive_names
from vflbench.protocol.party import Party
from vflbench.registry import EPOCHS, Param

#: URVFL's pretraining (config_cifar.json): 20 epochs of 4,545 aux rows in batches of 128 (36 per epoch).
URVFL_PRETRAIN_EPOCHS = 20
URVFL_PRETRAIN_STEPS = 20 * 36


@ATTACKS.register(summary="DMAVFL: malicious active party, pretrained encoder/decoder + 2C-class DAC")
class DMAVFL(MaliciousActiveAttack):
    """DMAVFL (Algorithms 1-2): pretrain f_a/f_e/f_d on aux, then DAC malicious gradients.

    Parameters: ``victim`` (the passive party attacked, or a list of them: DMAVFL §7.4's several
    target clients, each with its own shadow f_e, one DAC on their concatenated embeddings and
    one decoder of their concatenated slices), ``aux_size``/``aux_fraction`` (default: the whole
    pool of held-out rows, ``data.aux_pool``; 1/11 gives aux : train = 1 : 10, DMAVFL §6.1) and
    ``aux_classes`` (out-of-distribution aux),
    ``target_split``/``n_targets`` (rows scored), ``pretrain_epochs`` (``None``: URVFL's 720
    pretraining steps, at least 20 passes), ``lr`` (1e-4, f_a,
    f_e, f_d), ``disc_lr`` (1e-4, the DAC), ``aux_batch_size`` (128), ``shadow_model`` /
    ``shadow_options`` (f_e's architecture, default the config's bottom), ``hidden`` (256,
    width of the DAC and tabular decoder), ``decoder_width`` (64, channels of the image decoder),
    ``decoder_output`` (``"tanh"``: URVFL's tanh decoder, mapped onto the [0, 1] pixels;
    ``"sigmoid"``), ``dac`` / ``dac_map`` (``"cnn"``: DMAVFL Table 10's "CNN layer * 2" DAC,
    :class:`~vflbench.attacks.feature.common.ConvDAC`, on the victims' embedding viewed as the
    (C, H, W) map ``dac_map``; ``"cnn_bn"``: URVFL's ``CLSDiscriminator2`` of its detection runs,
    :class:`~vflbench.attacks.feature.common.BNConvDAC` (BatchNorm, adaptive pool), on the same
    map; ``"mlp"``: two hidden layers of ``hidden``; ``None``: cnn when ``dac_map`` is given,
    else mlp), ``dac_update`` (``"paper"``: the DAC steps on Eq. (5);
    ``"urvfl"``: on Eq. (5) + L_M, as URVFL's code does, whose L_M backward also fills the DAC's
    gradients and is not zeroed before the DAC step), ``decoder_map`` (the (C, H, W) map a
    pixel-aligned victim embedding is, e.g. ``conv_map``'s: the decoder is then URVFL's
    three-convolution :class:`~vflbench.attacks.feature.common.MapDecoder` on the adversary's and
    the victim's maps side by side; ``None``: the upsampling decoder of a flat embedding),
    ``honest_epochs`` (0: not in the paper; the active party first trains honestly for this many
    epochs, the protocol's step, and attacks from then on: the attack on a victim that was
    trained honestly first; the pretraining on aux still happens before training starts),
    ``shadow_mode`` (``"eval"``: the frozen f_e embeds the aux rows for the DAC in evaluation
    mode, as URVFL's ``cls_pretrain``; ``"train"``: in training mode, BatchNorm on each aux
    batch's own statistics like the victim's bottom, as URVFL's detection runs
    ``defense.py::gradient_scru`` leave it; f_e's weights stay frozen either way), ``splitguard``
    (``"cooperative"``: every batch gets the malicious gradient, SplitGuard's fake batches on their
    randomised labels, as in DMAVFL's evaluation; ``"aware"``: the attacker recognises fake batches by
    their labels and answers them honestly, see the module docstring).
    """

    name = "dmavfl"
    paper = DMAVFL_PAPER
    sync: ClassVar[bool] = False
    multi_victim = True
    aux_disjoint = True
    min_epochs = 25
    min_steps = 500
    min_epochs_reason = (
        "With its default settings its DAC (Adam 1e-4, one step per batch) pulls the victim's "
        "embeddings into its shadow's distribution only over URVFL's 25 VFL epochs: after the "
        "library's 10 it reconstructed worse than guessing the mean (breast_cancer MSE 49 and 56 "
        "against 0.85, digits 0.077 against 0.068; docs/decisions/attacks.md, issue 25)."
    )

    constraints: ClassVar[Mapping[str, Param]] = {
        "pretrain_epochs": Param("epochs of pretraining on the auxiliary set (null: the paper's)", ge=0),
        "decoder_output": Param("the decoder's output layer: tanh (URVFL) or sigmoid"),
        "dac": Param("the DAC's architecture: mlp, cnn or cnn_bn (null: cnn when dac_map is given)"),
        "dac_map": Param("the (C, H, W) map the victim's embedding is viewed as, for a CNN DAC", ge=1),
        "dac_update": Param("the DAC's loss: paper (Eq. 5) or urvfl (L_D + L_M)"),
        "decoder_map": Param("the (C, H, W) map an image decoder starts from", ge=1),
        "honest_epochs": EPOCHS,
        "shadow_mode": Param("the shadow model's mode: eval (URVFL's attack) or train (URVFL's detection runs)"),
        "splitguard": Param(
            "cooperative (train SplitGuard's fake batches as they come, DMAVFL's evaluation) or "
            "aware (recognise them and answer honestly)"
        ),
    }

    def __init__(
        self,
        *,
        victim: str | Sequence[str] = "passive_1",
        aux_size: int | None = None,
        aux_fraction: float | None = None,
        aux_classes: Sequence[int] | None = None,
        target_split: Literal["train", "test"] = "test",
        n_targets: int | None = None,
        pretrain_epochs: int | None = None,
        aux_batch_size: int = 128,
        lr: float = 1e-4,
        disc_lr: float = 1e-4,
        shadow_model: str | None = None,
        shadow_options: dict[str, Any] | None = None,
        hidden: int = 256,
        decoder_width: int = 64,
        decoder_output: Literal["tanh", "sigmoid"] = "tanh",
        dac: Literal["mlp", "cnn", "cnn_bn"] | None = None,
        dac_map: Sequence[int] | None = None,
        dac_update: Literal["paper", "urvfl"] = "paper",
        decoder_map: Sequence[int] | None = None,
        honest_epochs: int = 0,
        shadow_mode: Literal["eval", "train"] = "eval",
        splitguard: Literal["cooperative", "aware"] = "cooperative",
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
        if dac_map is not None and len(dac_map) != 3:
            raise ConfigError(f"dmavfl: dac_map must be three positive sizes (C, H, W), got {dac_map!r}")
        if dac in ("cnn", "cnn_bn") and dac_map is None:
            raise ConfigError(
                f"dmavfl: dac {dac!r} needs dac_map, the (C, H, W) map the victim's embedding is viewed as"
            )
        self.pretrain_epochs = pretrain_epochs
        self.disc_lr = disc_lr
        self.decoder_output = decoder_output
        self.dac = dac
        self.dac_map = dac_map
        if decoder_map is not None and len(decoder_map) != 3:
            raise ConfigError(f"dmavfl: decoder_map must be three positive sizes (C, H, W), got {decoder_map!r}")
        self.dac_update = dac_update
        self.decoder_map = decoder_map
        self.honest_epochs = honest_epochs
        self.shadow_mode = shadow_mode
        self.splitguard = splitguard

    def check(self, scenario: Scenario) -> None:
        """Refuse tasks whose objective has no output per class (binary VLR's single logit): the
        DAC's predictions would have no place there and the untrained top model would answer."""
        require(
            not scenario.single_logit,
            self.name,
            f"the active party answers with its DAC's "
            f"{scenario.num_classes} class scores, but binary VLR's objective is one logit; use "
            "train.algorithm vhnn or vsnn (or a task with more than 2 classes)",
        )
        super().check(scenario)

    def build(self, party: ActiveParty, aux: AuxData, generator: torch.Generator) -> Adversary:  # noqa: D102
        require(
            party.objective.out_dim == self.scenario_.num_classes,
            self.name,
            f"the active party answers "
            f"with its DAC's {self.scenario_.num_classes} class scores, but the objective has "
            f"{party.objective.out_dim} outputs (a defense changed it); remove that defense",
        )
        own = party.bottom if aux.own is not None else None
        shadow = self.make_shadow(aux, generator)
        embed = self.victim_width()
        own_width = self.own_width(party, aux)
        if self.decoder_map is not None:
            require(
                len(victims_of(self)) == 1 and aux.victim.dim() == 4,
                self.name,
                "decoder_map (a decoder of pixel-aligned embedding maps) needs one victim with an image strip",
            )
            if math.prod(self.decoder_map) != embed:
                raise ConfigError(
                    f"dmavfl: decoder_map {tuple(self.decoder_map)} holds "
                    f"{math.prod(self.decoder_map)} values, the victim's embedding {embed}"
                )
        try:
            decoder = seeded(
                decoder_for(
                    own_width + embed,
                    aux.victim[0],
                    hidden=self.hidden,
                    width=self.decoder_width,
                    output=self.decoder_output,
                    victim_map=self.decoder_map,
                    own_width=own_width,
                ),
                generator,
                aux.victim,
            )
        except ValueError as exc:
            raise ConfigError(f"dmavfl: decoder_map {tuple(self.decoder_map or ())}: {exc}") from None
        classes = 2 * self.scenario_.num_classes
        kind = self.dac or ("cnn" if self.dac_map is not None else "mlp")
        if kind in ("cnn", "cnn_bn"):
            assert self.dac_map is not None
            if math.prod(self.dac_map) != embed:
                raise ConfigError(
                    f"dmavfl: dac_map {tuple(self.dac_map)} holds {math.prod(self.dac_map)} values, "
                    f"the victims' embedding {embed}"
                )
            dac = seeded((ConvDAC if kind == "cnn" else BNConvDAC)(self.dac_map, classes), generator, aux.victim)
        else:
            dac = seeded(mlp(embed, (self.hidden, self.hidden), classes, leaky=True), generator, aux.victim)
        optimizers = {
            "autoencoder": self.adam([own, shadow, decoder], self.lr),
            "discriminator": self.adam([dac], self.disc_lr),
        }
        return Adversary(
            party, aux, AuxBatches(len(aux.ids), generator), generator, own, shadow, decoder, dac, optimizers
        )

    def _train_mode(self, state: Adversary, training: bool) -> None:
        for m in (state.own, state.shadow, state.decoder):
            if m is not None:
                m.train(training)

    def autoencoder_step(self, state: Adversary, rows: Tensor) -> float:
        """One Adam step of f_a, f_e, f_d on Eq. (1) for aux rows ``rows``."""
        self._train_mode(state, True)
        opt = state.optimizers["autoencoder"]
        opt.zero_grad(set_to_none=True)
        loss = self.reconstruction_loss(state, rows)
        loss.backward()
        opt.step()
        return float(loss.detach())

    def pretrain(self, state: Adversary) -> None:
        """Algorithm 1 for ``pretrain_epochs`` passes over the aux set; then freeze f_a, f_e, f_d."""
        losses = []
        for _ in range(self.pretrain_passes(len(state.aux.ids))):
            total = [self.autoencoder_step(state, rows) for rows in state.batches.epoch(self.aux_batch_size)]
            losses.append(sum(total) / len(total))
        self.pretrain_losses_ = losses
        self._train_mode(state, False)

    def pretrain_passes(self, n_aux: int) -> int:
        """``pretrain_epochs``, or by default as many passes as make URVFL's 720 steps (at least 20)."""
        if self.pretrain_epochs is not None:
            return self.pretrain_epochs
        batches = math.ceil(n_aux / self.aux_batch_size)
        return max(URVFL_PRETRAIN_EPOCHS, math.ceil(URVFL_PRETRAIN_STEPS / batches))

    def install(self, party: Party, grant: ThreatGrant) -> Sequence[PartyHook]:
        """Build, pretrain and take over the step (:meth:`MaliciousActiveAttack.install`); count the batches
        answered honestly (``honest_batches_``, ``splitguard: aware``)."""
        self.honest_batches_ = 0
        self.malicious_batches_ = 0
        return super().install(party, grant)

    def relabelled(self, party: ActiveParty, ids: Tensor) -> bool:
        """Whether the labels the party is given for batch ``ids`` differ from the ones it stores (SplitGuard's fake
        batch, as an attacker that owns the labels sees it)."""
        given = class_indices(party.objective.targets[ids])
        return not torch.equal(given, party.labels[ids].to(given.device, given.dtype))

    def _step(
        self, ids: Tensor, received: Sequence[Tensor], *, epoch: int, step: int, senders: Sequence[str]
    ) -> list[Tensor]:
        """``cooperative``: the malicious step on every batch. ``aware``: the top model takes the honest step on
        every batch (the party's own bottom f_a untouched); its cut gradients are sent for a relabelled batch, the
        malicious step's for the others."""
        if self.splitguard == "cooperative":
            self.malicious_batches_ += 1
            return super()._step(ids, received, epoch=epoch, step=step, senders=senders)
        party = self.state_.party
        fake = self.relabelled(party, ids)
        honest = party.honest_step(ids, received, epoch=epoch, step=step, senders=senders, own_bottom=False)
        if fake:
            self.honest_batches_ += 1
            return honest
        self.malicious_batches_ += 1
        return super()._step(ids, received, epoch=epoch, step=step, senders=senders)

    def attack_step(self, state: Adversary, ids: Tensor, h: Tensor, y: Tensor) -> tuple[Tensor, float]:  # noqa: D102
        rows = state.batches.next(self.aux_batch_size)
        if self.sync:
            self.autoencoder_step(state, rows)  # Algorithm 3: f_a, f_e, f_d keep training on aux
            self._train_mode(state, False)
        dac = state.discriminator
        dac.train()
        loss_m = F.cross_entropy(dac(h), 2 * y + 1)  # Eq. (4): push h towards "shadow of class y"
        (g,) = torch.autograd.grad(loss_m, h)
        assert state.shadow is not None
        with torch.no_grad():
            state.shadow.train(self.shadow_mode == "train")
            h_aux = state.shadow(state.aux.victim[rows])
            state.shadow.eval()
        y_aux = state.aux.labels[rows]
        logits = dac(h.detach())
        loss_d = F.cross_entropy(logits, 2 * y) + F.cross_entropy(dac(h_aux), 2 * y_aux + 1)  # Eq. (5)
        if self.dac_update == "urvfl":  # URVFL never zeroes the DAC's L_M gradient before its step
            loss_d = loss_d + F.cross_entropy(logits, 2 * y + 1)
        opt = state.optimizers["discriminator"]
        opt.zero_grad(set_to_none=True)
        loss_d.backward()
        opt.step()
        return g, float(loss_m.detach())

    def infer(self, view: PartyView) -> FeatureInference:
        """The reconstruction (:meth:`MaliciousActiveAttack.infer`), with how many training batches got the
        malicious gradient and how many were answered honestly (``splitguard: aware``'s fake batches)."""
        out = super().infer(view)
        out.details.update(
            splitguard=self.splitguard, malicious_batches=self.malicious_batches_, honest_batches=self.honest_batches_
        )
        return out

    def predictor(self, state: Adversary) -> Callable[..., Tensor]:
        """Class scores from the DAC: ``logsumexp`` of each class's two logits (victims' embeddings only)."""
        num_classes = self.scenario_.num_classes
        victims = victims_of(self)

        @torch.no_grad()
        def predict(ids: Tensor, received: Sequence[Tensor], split: str) -> Tensor:
            senders = _senders(len(received))
            h = torch.cat([received[senders.index(v)] for v in victims], 1)
            state.discriminator.eval()
            return state.discriminator(h).view(-1, num_classes, 2).logsumexp(2)

        return predict


def _senders(n: int) -> list[str]:
    """Names of the senders of ``n`` received embeddings (passive parties in order)."""
    return passive_names(n)


@ATTACKS.register(summary="DMAVFL_sync: DMAVFL with encoder/decoder trained alongside (Algorithm 3)")
class DMAVFLSync(DMAVFL):
    """DMAVFL_sync (Algorithm 3): no pretraining; f_a, f_e, f_d take an Eq. (1) step every batch.

    Same parameters as :class:`DMAVFL`; ``pretrain_epochs`` is 0 (the paper's sync replaces the
    pretraining). ``pretrain_epochs > 0`` is refused unless ``hybrid=True`` asks for Algorithm 1
    followed by Algorithm 3, which is neither of the paper's attacks.
    """

    name = "dmavfl_sync"
    min_epochs_reason = (
        "With its default settings, after the library's 10 epochs it reconstructed worse than "
        "guessing the mean (digits MSE 0.076 and 0.099 against 0.068, breast_cancer 2.95 and 2.79 "
        "against 0.85); after 25, digits 0.055 and 0.057, breast_cancer 1.31 and 0.45 "
        "(docs/decisions/attacks.md, issue 25)."
    )
    sync = True

    def __init__(
        self,
        *,
        victim: str | Sequence[str] = "passive_1",
        aux_size: int | None = None,
        aux_fraction: float | None = None,
        aux_classes: Sequence[int] | None = None,
        target_split: Literal["train", "test"] = "test",
        n_targets: int | None = None,
        pretrain_epochs: int = 0,
        aux_batch_size: int = 128,
        lr: float = 1e-4,
        disc_lr: float = 1e-4,
        shadow_model: str | None = None,
        shadow_options: dict[str, Any] | None = None,
        hidden: int = 256,
        decoder_width: int = 64,
        decoder_output: Literal["tanh", "sigmoid"] = "tanh",
        dac: Literal["mlp", "cnn", "cnn_bn"] | None = None,
        dac_map: Sequence[int] | None = None,
        dac_update: Literal["paper", "urvfl"] = "paper",
        decoder_map: Sequence[int] | None = None,
        honest_epochs: int = 0,
        shadow_mode: Literal["eval", "train"] = "eval",
        splitguard: Literal["cooperative", "aware"] = "cooperative",
        hybrid: bool = False,
    ) -> None:
        if pretrain_epochs > 0 and not hybrid:
            raise ValueError(
                f"dmavfl_sync (Algorithm 3) trains f_a, f_e, f_d alongside and has no pretraining, got "
                f"pretrain_epochs={pretrain_epochs}; set pretrain_epochs: 0 (or leave it out), use "
                "dmavfl for Algorithms 1-2, or set hybrid: true for pretraining followed by Algorithm 3"
            )
        super().__init__(
            victim=victim,
            aux_size=aux_size,
            aux_fraction=aux_fraction,
            aux_classes=aux_classes,
            target_split=target_split,
            n_targets=n_targets,
            pretrain_epochs=pretrain_epochs,
            aux_batch_size=aux_batch_size,
            lr=lr,
            disc_lr=disc_lr,
            shadow_model=shadow_model,
            shadow_options=shadow_options,
            hidden=hidden,
            decoder_width=decoder_width,
            decoder_output=decoder_output,
            dac=dac,
            dac_map=dac_map,
            dac_update=dac_update,
            decoder_map=decoder_map,
            honest_epochs=honest_epochs,
            shadow_mode=shadow_mode,
            splitguard=splitguard,
        )
        self.hybrid = hybrid
