"""Embedding extension attack (He et al., LabObf, §4, Eq. 5, Algorithm 1).

A malicious passive party defeats label-correlation defenses computed on what it uploads
(Discorloss / ``dcor``: ``loss += lambda * dCor(V_c, Y)`` at the host) by appending
``perturb_dims`` "perturbation dimensions" ``g(V_c)`` to its embedding, with ``g`` a linear layer
that it trains ITSELF, on its labelled auxiliary rows, to minimise
``dCor(concat(V_c, g(V_c)), Y_aux)`` (Eq. 5). The host's dCor term then sees a low correlation
for the whole upload and pushes less on the original dimensions ``V_c``, which keep their label
information; the attacker finally runs the label inference attack on its original bottom model.

Following Algorithm 1:

* Each outer epoch the client first runs ``inner_steps`` (EPOCH_NUM_2) steps of the inner loop
  on ``X_aux``: ``V_c = f(X_aux)`` (the bottom model is not changed by this loop), ``l = Corr(concat(
  V_c, g(V_c)), Y_aux)``, ``theta_g -= eta_1 * grad_g l`` (Adam here, ``generator_lr``). It is run
  once in :meth:`install` (before training) and after every epoch (a :class:`PartyHook` of its party).
* ``g`` is updated ONLY by this inner loop: Algorithm 1's VFL update touches ``theta_t``,
  ``theta_bc`` and ``theta_bh``, never ``theta_g``. The host's cut gradient does flow THROUGH ``g``
  into the bottom model (``V_c`` feeds both halves of the upload), as the chain rule gives.
* The attack evaluation (§6.2, Table 3) is the label inference attack on the attacker's bottom
  model; here supervised model completion (:class:`ModelCompletion`, composed) on the ORIGINAL
  bottom ``f_bc``, without ``g`` (``g``'s output is a linear function of ``f_bc``'s and is only
  there to fool the host's correlation term).

``Corr`` is the same distance correlation the ``dcor`` defense uses
(:func:`vflbench.metrics.correlation.distance_correlation`, labels one-hot). ``g`` is
initialised from the attacker's own party generator (its own randomness).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.attacks.base import (
    LabelAttack,
    LabelInference,
    LabelMetric,
    PartyView,
    Prior,
    Scenario,
    Selection,
    ThreatGrant,
    check_metric,
    require,
)
from vflbench.attacks.label.model_completion import ModelCompletion
from vflbench.attacks.registry import ATTACKS
from vflbench.metrics.correlation import distance_correlation
from vflbench.models import init_parameters
from vflbench.protocol import PassiveParty
from vflbench.protocol.hooks import PartyHook
from vflbench.protocol.party import Party
from vflbench.registry import Param


class ExtendedBottom(nn.Module):
    """The attacker's uploaded model: ``x -> concat(f(x), g(f(x)))`` (Fig. 2)."""

    def __init__(self, base: nn.Module, perturb: nn.Linear) -> None:
        super().__init__()
        self.base = base
        self.perturb = perturb

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        v = self.base(x)
        return torch.cat([v, self.perturb(v)], 1)


def original_bottom(model: nn.Module) -> nn.Module:
    """The bottom model without the perturbation generator (unchanged if it has none)."""
    return model.base if isinstance(model, ExtendedBottom) else model


@ATTACKS.register(
    summary="malicious passive party appends dCor-minimising perturbation "
    "dims to its embedding, then runs model completion (LabObf §4)"
)
class EmbeddingExtension(LabelAttack):
    """He et al.'s embedding extension attack (§4, Algorithm 1); see the module docstring.

    ``perturb_dims``: width of ``g``'s output (4 in Table 3); ``inner_steps``: generator updates
    per epoch (Algorithm 1's EPOCH_NUM_2, unstated in the paper); ``generator_lr``: Adam step of
    ``g`` (eta_1, unstated). ``known_per_class``: the labelled auxiliary rows, used both by the
    inner loop and by model completion (Table 2: |D_aux| = 200 on the binary datasets, i.e. 100
    per class). The remaining parameters (``metric`` included) are :class:`ModelCompletion`'s.
    """

    name = "embedding_extension"
    reads = ("bottom_model",)
    phase = "malicious"
    requirements = ("concat aggregation",)
    paper = (
        "He et al., LabObf: A Label Protection Scheme for Vertical Federated Learning Through Label "
        "Obfuscation (2024), §4 Eq. 5, Algorithm 1, Table 3"
    )
    threat = (
        "malicious passive party holding labelled auxiliary rows, which controls the width and content "
        "of its uploaded embedding (defeats dCor-style defenses)"
    )

    constraints: ClassVar[Mapping[str, Param]] = {
        **{k: v for k, v in ModelCompletion.constraints.items() if k != "momentum"},  # it takes no momentum
        "known_per_class": Param("labelled auxiliary rows per class", ge=0),
        "epochs": Param("fine-tuning passes", ge=0),
        "perturb_dims": Param("width of the appended (perturbed) embedding", ge=1),
        "inner_steps": Param("generator steps per batch", ge=0),
        "generator_lr": Param("the generator's learning rate", gt=0),
    }

    def __init__(
        self,
        *,
        party: str = "passive_1",
        known_per_class: int = 100,
        perturb_dims: int = 4,
        inner_steps: int = 50,
        generator_lr: float = 5e-2,
        epochs: int = 50,
        optimizer: Literal["adam", "sgd"] = "adam",
        lr: float = 1e-3,
        batch_size: int | None = 16,
        head_hidden: int = 64,
        finetune_bottom: bool = True,
        select: Selection = "last",
        val_per_class: int = 1,
        prior: Prior = "local",
        every_epoch: bool = False,
        metric: LabelMetric = "auto",
    ) -> None:
        self.party = party
        self.known_per_class = known_per_class
        self.perturb_dims = perturb_dims
        self.inner_steps = inner_steps
        self.generator_lr = generator_lr
        self.epochs = epochs
        self.optimizer = optimizer
        self.lr = lr
        self.batch_size = batch_size
        self.head_hidden = head_hidden
        self.finetune_bottom = finetune_bottom
        self.select = select
        self.val_per_class = val_per_class
        self.prior = prior
        self.every_epoch = every_epoch
        self.metric = metric
        self.completion_ = ModelCompletion(
            party=party,
            known_per_class=known_per_class,
            epochs=epochs,
            optimizer=optimizer,
            lr=lr,
            batch_size=batch_size,
            head_hidden=head_hidden,
            finetune_bottom=finetune_bottom,
            select=select,
            val_per_class=val_per_class,
            prior=prior,
            every_epoch=every_epoch,
            metric=metric,
        )

    def check(self, scenario: Scenario) -> None:  # noqa: D102
        require(self.party != "active", self.name, "it is run by a passive party")
        check_metric(self.name, self.metric, scenario)
        require(
            scenario.aggregation == "concat",
            self.name,
            f"it appends dimensions to the uploaded embedding, which needs train.aggregation: concat "
            f"(got {scenario.aggregation!r})",
        )

    def extra_embedding_dims(self) -> int:  # noqa: D102
        return self.perturb_dims

    # ------------------------------------------------------------------------------- corruption

    def install(self, party: Party, grant: ThreatGrant) -> Sequence[PartyHook]:
        """Wrap the party's bottom model as ``concat(f, g(f))`` and train ``g`` once (Algorithm 1); the hook trains
        it again after every epoch."""
        require(
            isinstance(party, PassiveParty) and party.bottom is not None and party.data is not None,
            self.name,
            "it corrupts a passive party's own bottom model",
        )
        assert isinstance(party, PassiveParty) and party.bottom is not None and party.data is not None
        known = grant.known
        require(
            known is not None and len(known.ids) > 1,
            self.name,
            "it needs labelled auxiliary rows (known_per_class >= 1)",
        )
        assert known is not None
        base = party.bottom
        x_aux = party.data.x_train[known.ids]
        with torch.no_grad():
            width = base.eval()(x_aux[:1]).shape[1]
        perturb = init_parameters(nn.Linear(width, self.perturb_dims), party.generator).to(x_aux.device)
        perturb.requires_grad_(False)
        party.bottom = ExtendedBottom(base, perturb)
        num_classes = int(known.labels.max()) + 1
        y_aux = F.one_hot(known.labels, num_classes).float()
        opt = torch.optim.Adam(perturb.parameters(), lr=self.generator_lr)
        self.history_: list[dict[str, float]] = []

        def inner_loop(epoch: int) -> dict[str, object]:
            mode = base.training
            base.eval()
            with torch.no_grad():
                v = base(x_aux)
            base.train(mode)
            perturb.requires_grad_(True)
            for _ in range(self.inner_steps):
                loss = distance_correlation(torch.cat([v, perturb(v)], 1), y_aux)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            perturb.requires_grad_(False)
            with torch.no_grad():
                record = {
                    "dcor_uploaded": float(distance_correlation(torch.cat([v, perturb(v)], 1), y_aux)),
                    "dcor_original": float(distance_correlation(v, y_aux)),
                }
            self.history_.append({"epoch": epoch, **record})
            return {f"{self.name}.{k}": val for k, val in record.items()}

        inner_loop(-1)
        return (_EveryEpoch(self.name, inner_loop),)

    # -------------------------------------------------------------------------------- inference

    def infer(self, view: PartyView) -> LabelInference:
        """Model completion on the attacker's original bottom model (without ``g``)."""
        inference = self.completion_.complete(view, original_bottom(view.bottom()))
        if getattr(self, "history_", None):
            inference.details["generator_dcor"] = self.history_[-1]
        return inference

    def local(self, view: PartyView) -> LabelInference:
        """J_loc (R_lower): the same architecture trained from scratch on the auxiliary rows only."""
        return self.completion_.local(view)


class _EveryEpoch(PartyHook):
    """Runs the attacker's ``run(epoch) -> metrics`` after every epoch of its own party."""

    def __init__(self, name: str, run: Callable[[int], dict[str, object]]) -> None:
        super().__init__(name)
        self.run = run

    def on_epoch_end(self, epoch: int) -> dict[str, object]:
        return self.run(epoch)
