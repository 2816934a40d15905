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


def complete(
    bottom: nn.Module,
    x: Tensor,
    y: Tensor,
    x_eval: Tensor,
    *,
    num_classes: int,
    embed_dim: int,
    head: bool = True,
    epochs: int = 50,
    optimizer: str = "adam",
    lr: float = 1e-3,
    batch_size: int | None = 16,
    head_hidden: int = 64,
    finetune_bottom: bool = True,
    momentum: float = 0.9,
    generator: torch.Generator,
) -> list[Tensor]:
    """Model completion's fine-tuning (VMask Algorithm 3): attach an inference head to ``bottom``
    (or none: the bottom outputs the logits), train on ``(x, y)`` for ``epochs`` passes, and return
    the model's outputs on ``x_eval`` after every pass. Used by the attack and by VMask's simulation. Runs
    where ``x`` is (the head is seeded on the CPU and moved there).
    """
    modules: list[nn.Module] = [bottom]
    if head:
        modules.append(init_parameters(inference_head(embed_dim, num_classes, head_hidden), generator).to(x.device))
    model = nn.Sequential(*modules)
    params = model.parameters() if finetune_bottom or not head else modules[-1].parameters()
    opt = torch.optim.Adam(params, lr=lr) if optimizer == "adam" else torch.optim.SGD(params, lr=lr, momentum=momentum)
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


STACKABLE = (nn.Linear, nn.ReLU, nn.Flatten)
"""The modules :func:`complete_stacked` runs stacked (the zoo's ``logreg``, ``mlp2``, ``mlp3`` and the head)."""


def _chain(model: nn.Module) -> list[nn.Module] | None:
    """``model``'s modules in call order if it is a (nested) ``nn.Sequential`` of :data:`STACKABLE` ones, else None."""
    if isinstance(model, nn.Sequential):
        out: list[nn.Module] = []
        for child in model:
            sub = _chain(child)
            if sub is None:
                return None
            out += sub
        return out
    if isinstance(model, nn.Flatten) and (model.start_dim, model.end_dim) != (1, -1):
        return None
    return [model] if isinstance(model, STACKABLE) else None


def stackable(model: nn.Module) -> bool:
    """Whether :func:`complete_stacked` can fine-tune copies of ``model`` (a sequence of Flatten, Linear, ReLU)."""
    return _chain(model) is not None


def complete_stacked(
    bottoms: list[nn.Module],
    x: Tensor,
    y: Tensor,
    x_eval: Tensor,
    *,
    generators: list[torch.Generator],
    num_classes: int,
    embed_dim: int,
    head: bool = True,
    epochs: int = 50,
    optimizer: str = "adam",
    lr: float = 1e-3,
    batch_size: int | None = 16,
    head_hidden: int = 64,
    finetune_bottom: bool = True,
    momentum: float = 0.9,
) -> list[list[Tensor]]:
    """:func:`complete` for several :func:`stackable` bottom models of one architecture at once, the
    i-th with ``generators[i]``, as one stacked model: each Linear's weights are stacked and applied with
    batched products (``baddbmm``, one product per model, as ``nn.Linear`` computes it), so the per-step
    Python and dispatch cost is paid once for all. Every draw, batch order, product and optimizer update
    is the one :func:`complete` makes for that model alone: the outputs are the same, bit for bit
    (tested). Returns each model's outputs after every pass."""
    chains = []
    for bottom, generator in zip(bottoms, generators, strict=True):
        modules: list[nn.Module] = [bottom]
        if head:
            modules.append(init_parameters(inference_head(embed_dim, num_classes, head_hidden), generator).to(x.device))
        chain = _chain(nn.Sequential(*modules))
        if chain is None:
            raise ValueError("complete_stacked fine-tunes sequences of Flatten, Linear and ReLU only; use complete()")
        chains.append(chain)
    n_bottom = len(_chain(bottoms[0]) or [])
    layers: list[tuple[str, Tensor | None, Tensor | None]] = []
    trained: list[Tensor] = []
    for j, module in enumerate(chains[0]):
        if not isinstance(module, nn.Linear):
            layers.append(("flatten" if isinstance(module, nn.Flatten) else "relu", None, None))
            continue
        linears: list[nn.Linear] = []
        for chain in chains:
            layer = chain[j]
            assert isinstance(layer, nn.Linear)  # one architecture: the same layer at every position
            linears.append(layer)
        weight = torch.stack([m.weight.detach() for m in linears])
        bias = torch.stack([m.bias.detach() for m in linears]).unsqueeze(1) if module.bias is not None else None
        for t in (weight, bias):
            if t is not None and (finetune_bottom or not head or j >= n_bottom):
                trained.append(t.requires_grad_(True))
        layers.append(("linear", weight, bias))

    def forward(h: Tensor) -> Tensor:
        for kind, weight, bias in layers:
            if kind == "flatten":
                h = h.flatten(2)
            elif kind == "relu":
                h = torch.relu(h)
            else:
                assert weight is not None
                h = torch.bmm(h, weight.mT) if bias is None else torch.baddbmm(bias, h, weight.mT)
        return h

    opt = (
        torch.optim.Adam(trained, lr=lr) if optimizer == "adam" else torch.optim.SGD(trained, lr=lr, momentum=momentum)
    )
    size = batch_size or len(y)
    outputs: list[list[Tensor]] = [[] for _ in chains]
    for _ in range(epochs):
        orders = [torch.randperm(len(y), generator=g) for g in generators]
        for start in range(0, len(y), size):
            ids = torch.stack([order[start : start + size] for order in orders])
            out = forward(x[ids])
            loss = sum(supervised_loss(o, y[i]) for o, i in zip(out, ids, strict=True))
            opt.zero_grad()
            loss.backward()  # type: ignore[union-attr]
            opt.step()
        with torch.no_grad():
            chunks = [x_eval[i : i + EVAL_BATCH] for i in range(0, len(x_eval), EVAL_BATCH)]
            evaluated = torch.cat([forward(c.expand(len(chains), *c.shape)) for c in chunks], 1)
        for store, o in zip(outputs, evaluated, strict=True):
            store.append(o)
    return outputs
