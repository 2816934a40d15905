"""Model completion (Fu et al., USENIX Security 2022), supervised as in VMask's Algorithm 3."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.attacks.base import Attack, LabelInference, PartyView, Prior, Scores, require
from vflbench.attacks.runner import ATTACKS
from vflbench.models import inference_head, init_parameters

EVAL_BATCH = 4096


def predict(model: nn.Module, x: Tensor) -> Tensor:
    """Model outputs on ``x`` in evaluation mode, in chunks."""
    model.eval()
    with torch.no_grad():
        return torch.cat([model(x[i : i + EVAL_BATCH]) for i in range(0, len(x), EVAL_BATCH)])


def class_scores(outputs: Tensor) -> Tensor:
    """Probabilities from one logit (sigmoid) or several (softmax)."""
    return torch.sigmoid(outputs.squeeze(1)) if outputs.shape[1] == 1 else outputs.softmax(1)


def supervised_loss(outputs: Tensor, y: Tensor) -> Tensor:
    """Logistic loss for one logit, cross-entropy otherwise."""
    if outputs.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(outputs.squeeze(1), y.float())
    return F.cross_entropy(outputs, y)


@ATTACKS.register("model_completion", summary="fine-tune an inference head on the trained bottom model with known labels")
class ModelCompletion(Attack):
    """Passive model completion: attach an inference head (MLP2) to the attacker's trained
    bottom model and fine-tune both on ``known_per_class`` labels per class (VMask Algorithm 3:
    ``epochs`` passes, the attack accuracy of the best pass on the test split). In VLR the
    attacker puts a sigmoid on its bottom model instead, with no training (Kang et al. §6.2).
    """

    name = "model_completion"
    reads = ("bottom_model",)
    phase = "post_training"
    paper = "Fu et al., Label Inference Attacks Against VFL (USENIX Security 2022); VMask Alg. 3; Kang et al. §6.2"
    threat = "honest-but-curious passive party holding a few labelled samples (T1)"

    def __init__(self, *, party: str = "passive_1", known_per_class: int = 4, epochs: int = 50,
                 optimizer: Literal["adam", "sgd"] = "adam", lr: float = 1e-3, batch_size: int | None = 16,
                 head_hidden: int = 64, finetune_bottom: bool = True, select: Literal["best", "last"] = "best",
                 prior: Prior = "local", every_epoch: bool = False) -> None:
        self.party = party
        self.known_per_class = known_per_class
        self.epochs = epochs
        self.optimizer = optimizer
        self.lr = lr
        self.batch_size = batch_size
        self.head_hidden = head_hidden
        self.finetune_bottom = finetune_bottom
        self.select = select
        self.prior = prior
        self.every_epoch = every_epoch
        if known_per_class < 1 or epochs < 1:
            raise ValueError("known_per_class and epochs must be at least 1")

    def check(self, scenario) -> None:  # noqa: ANN001, D102
        require(self.party != "active", self.name, "it is run by a passive party")

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
        return LabelInference(test=Scores(torch.arange(len(view.data.x_test)),
                                          class_scores(predict(bottom, view.data.x_test)), "test"),
                              details={"trained": False})

    def complete(self, view: PartyView, bottom: nn.Module) -> LabelInference:
        """Attach an inference head to ``bottom`` and fine-tune with the known labels."""
        return self._fit(view, bottom, head=True)

    def _fit(self, view: PartyView, bottom: nn.Module, *, head: bool) -> LabelInference:
        assert view.known is not None
        k = view.scenario.num_classes
        modules: list[nn.Module] = [bottom]
        if head:
            modules.append(init_parameters(inference_head(view.scenario.embed_dim, k, self.head_hidden),
                                           view.generator))
        model = nn.Sequential(*modules)
        params = model.parameters() if self.finetune_bottom or not head else modules[-1].parameters()
        opt = (torch.optim.Adam(params, lr=self.lr) if self.optimizer == "adam"
               else torch.optim.SGD(params, lr=self.lr, momentum=0.9))
        x, y = view.data.x_train[view.known.ids], view.known.labels
        size = self.batch_size or len(y)
        test_ids = torch.arange(len(view.data.x_test))
        per_epoch = []
        for _ in range(self.epochs):
            model.train()
            order = torch.randperm(len(y), generator=view.generator)
            for start in range(0, len(y), size):
                batch = order[start : start + size]
                loss = supervised_loss(model(x[batch]), y[batch])
                opt.zero_grad()
                loss.backward()
                opt.step()
            per_epoch.append(LabelInference(test=Scores(test_ids, class_scores(predict(model, view.data.x_test)),
                                                        "test")))
        return LabelInference(per_epoch=per_epoch, details={"known_labels": len(y), "trained": True})
