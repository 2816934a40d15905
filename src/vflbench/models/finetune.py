"""Supervised fine-tuning of an attacker's model: model completion's core (VMask Algorithm 3),
shared by the model completion attacks and by VMask's simulated attack."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vflbench.models import inference_head, init_parameters

EVAL_BATCH = 4096  #: rows per chunk whenever a model is evaluated without gradients (the loop, fine-tuning, defenses)


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


def complete(bottom: nn.Module, x: Tensor, y: Tensor, x_eval: Tensor, *, num_classes: int, embed_dim: int,
             head: bool = True, epochs: int = 50, optimizer: str = "adam", lr: float = 1e-3,
             batch_size: int | None = 16, head_hidden: int = 64, finetune_bottom: bool = True,
             momentum: float = 0.9, generator: torch.Generator) -> list[Tensor]:
    """Model completion's fine-tuning (VMask Algorithm 3): attach an inference head to ``bottom``
    (or none: the bottom outputs the logits), train on ``(x, y)`` for ``epochs`` passes, and return
    the model's outputs on ``x_eval`` after every pass. Used by the attack and by VMask's simulation.
    """
    modules: list[nn.Module] = [bottom]
    if head:
        modules.append(init_parameters(inference_head(embed_dim, num_classes, head_hidden), generator))
    model = nn.Sequential(*modules)
    params = model.parameters() if finetune_bottom or not head else modules[-1].parameters()
    opt = (torch.optim.Adam(params, lr=lr) if optimizer == "adam"
           else torch.optim.SGD(params, lr=lr, momentum=momentum))
    size = batch_size or len(y)
    outputs = []
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), size):
            batch = order[start : start + size]
            loss = supervised_loss(model(x[batch]), y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        outputs.append(predict(model, x_eval))
    return outputs
