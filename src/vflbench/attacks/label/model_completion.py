"""Model completion (Fu et al., USENIX Security 2022), supervised as in VMask's Algorithm 3."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from vflbench.attacks.base import (
    LabelAttack,
    LabelInference,
    LabelMetric,
    PartyView,
    Prior,
    Scale,
    Scenario,
    Scores,
    Selection,
    check_metric,
    check_selection,
    require,
    split_validation,
)
from vflbench.attacks.registry import ATTACKS
from vflbench.models.finetune import class_scores, complete, predict, supervised_loss  # noqa: F401
from vflbench.registry import LEARNING_RATE, WIDTH, Param


@ATTACKS.register(summary="fine-tune an inference head on the trained bottom model with known labels")
class ModelCompletion(LabelAttack):
    """Passive model completion: attach an inference head (MLP2) to the attacker's trained
    bottom model and fine-tune both on ``known_per_class`` labels per class (VMask Algorithm 3:
    ``epochs`` passes). In VLR the attacker puts a sigmoid on its bottom model instead, with no
    training (Kang et al. §6.2). ``select``: which pass is reported (:data:`~vflbench.attacks.base.Selection`):
    the last (default), the best on ``val_per_class`` of the known labels per class held out of the
    fine-tuning (``"validation"``), or the best on the test split (``"test_oracle"``, VMask's Algorithm 3
    and Fu et al.'s code: an oracle, flagged in reports). ``metric``: how the runner scores the inference
    and its prior (``"auto"``: AUC for binary tasks, balanced accuracy for imbalanced ones, accuracy
    otherwise; ``"accuracy"``: top-1 accuracy, LabObf's Table 5 metric; ``"balanced_accuracy"``; ``"auc"``).
    """

    name = "model_completion"
    reads: ClassVar[tuple[str, ...]] = ("bottom_model",)
    phase = "post_training"
    paper = "Fu et al., Label Inference Attacks Against VFL (USENIX Security 2022); VMask Alg. 3; Kang et al. §6.2"
    threat = "honest-but-curious passive party holding a few labelled samples (T1)"
    search_space: ClassVar[Mapping[str, tuple[Any, ...]]] = {
        "lr": (1e-4, 1e-3, 1e-2),
        "epochs": (Scale(0.5), Scale(1.0), Scale(2.0)),
        "optimizer": ("adam", "sgd"),
        "head_hidden": (32, 64, 128),
    }
    constraints: ClassVar[Mapping[str, Param]] = {
        "party": Param("the passive party that attacks"),
        "known_per_class": Param("labelled rows per class the attacker knows", ge=1),
        "epochs": Param("fine-tuning passes", ge=1),
        "optimizer": Param("the fine-tuning optimizer"),
        "lr": LEARNING_RATE,
        "batch_size": Param("rows per fine-tuning batch (null: all known rows)", ge=1),
        "head_hidden": WIDTH,
        "finetune_bottom": Param("fine-tune the bottom model too (else the head only)"),
        "select": Param(
            "which pass is reported: the last, the best on held-out known labels, or the best on "
            "the test split (an oracle, flagged)"
        ),
        "val_per_class": Param("known labels per class held out for select: validation", ge=1),
        "prior": Param("the prior the leakage is measured against"),
        "every_epoch": Param("also attack the model after every training epoch"),
        "momentum": Param("SGD momentum", ge=0),
        "metric": Param(
            "how the inference is scored (auto: AUC for binary tasks, balanced accuracy for "
            "imbalanced ones, accuracy otherwise)"
        ),
    }

    def __init__(
        self,
        *,
        party: str = "passive_1",
        known_per_class: int = 4,
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
        momentum: float = 0.9,
        metric: LabelMetric = "auto",
    ) -> None:
        self.party = party
        self.known_per_class = known_per_class
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
        self.momentum = momentum
        self.metric = metric
        check_selection(self.name, select, val_per_class, known_per_class)

    def check(self, scenario: Scenario) -> None:  # noqa: D102
        require(self.party != "active", self.name, "it is run by a passive party")
        check_metric(self.name, self.metric, scenario)

    def search_grid(self, scenario: Scenario) -> Mapping[str, tuple[Any, ...]]:
        """The fine-tuning's grid; nothing in VLR, where the attack puts a sigmoid on the bottom model and trains
        nothing."""
        return {} if scenario.algorithm == "vlr" else self.search_space

    def infer(self, view: PartyView) -> LabelInference:  # noqa: D102
        if view.scenario.algorithm == "vlr":
            return self._sigmoid_on_bottom(view, view.bottom())
        return self.complete(view, view.bottom())

    def local(self, view: PartyView) -> LabelInference:
        """J_loc: the same architecture trained from scratch on the known labels only."""
        if view.scenario.algorithm == "vlr":
            return self._fit(view, view.bottom(), head=False)
        return self.complete(view, view.bottom())

    def _sigmoid_on_bottom(self, view: PartyView, bottom: nn.Module) -> LabelInference:
        return LabelInference(
            test=Scores(torch.arange(len(view.data.x_test)), class_scores(predict(bottom, view.data.x_test)), "test"),
            details={"trained": False},
        )

    def complete(self, view: PartyView, bottom: nn.Module) -> LabelInference:
        """Attach an inference head to ``bottom`` and fine-tune with the known labels."""
        return self._fit(view, bottom, head=True)

    def _fit(self, view: PartyView, bottom: nn.Module, *, head: bool) -> LabelInference:
        assert view.known is not None
        fit, val = split_validation(view.known, self.select, self.val_per_class, view.generator, view.holdout)
        x, y = view.data.x_train[fit.ids], fit.labels
        n_test = len(view.data.x_test)
        test_ids = torch.arange(n_test)
        x_eval = view.data.x_test if val is None else torch.cat([view.data.x_test, view.data.x_train[val.ids]])
        outputs = complete(
            bottom,
            x,
            y,
            x_eval,
            num_classes=view.scenario.num_classes,
            embed_dim=view.scenario.embed_dim,
            head=head,
            epochs=self.epochs,
            optimizer=self.optimizer,
            lr=self.lr,
            batch_size=self.batch_size,
            head_hidden=self.head_hidden,
            finetune_bottom=self.finetune_bottom,
            momentum=self.momentum,
            generator=view.generator,
        )
        per_epoch = [
            LabelInference(
                test=Scores(test_ids, class_scores(out[:n_test]), "test"),
                validation=None if val is None else Scores(val.ids, class_scores(out[n_test:])),
            )
            for out in outputs
        ]
        return LabelInference(
            per_epoch=per_epoch,
            details={
                "known_labels": len(y),
                "trained": True,
                "validation_labels": 0 if val is None else len(val.ids),
                "attacker_view": getattr(bottom, "attacker_view", "plain"),
            },
        )
