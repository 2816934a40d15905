"""Active model completion (Fu et al., USENIX Security 2022, §4.3): a malicious local optimizer.

The attacker stays a passive party that follows the protocol on the wire, but updates its own
bottom model with Fu et al.'s ``MaliciousSGD`` (``my_optimizers.py``), which scales each update
up element-wise, so that its bottom model learns more of the task than its share; after
training it runs model completion on that bottom model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor
from torch.optim import lr_scheduler

from vflbench.attacks.base import LabelMetric, Phase, Prior, Selection, ThreatGrant, require
from vflbench.attacks.label.model_completion import ModelCompletion
from vflbench.attacks.registry import ATTACKS
from vflbench.errors import CompatibilityError
from vflbench.protocol import PassiveParty
from vflbench.protocol.hooks import PartyHook
from vflbench.protocol.party import Party


class MaliciousSGD(torch.optim.Optimizer):
    """Fu et al.'s malicious SGD: SGD with momentum whose update is scaled up element-wise.

    For each parameter tensor at each step: ``d = grad + weight_decay * p``; the momentum buffer
    is built as in PyTorch's SGD (``buf = d`` at first, then ``buf = momentum * buf +
    (1 - dampening) * d``) and, without Nesterov, *is* the update direction ``d``. From the
    second step on, ``d`` is multiplied element-wise by ``r = clamp(1 + gamma_lr_scale_up *
    d / (d_prev + 1e-7), min_ratio, max_ratio)``, where ``d_prev`` is the previous step's
    (scaled) direction; then ``d_prev = d`` and ``p -= lr * d``.

    QUIRK kept from Fu's code: ``d`` aliases the momentum buffer (Fu assigns the buffer to
    ``p.grad.data``), so the scaling by ``r`` scales the buffer too. What that does depends on
    how gradients are cleared, so ``legacy_zero_grad`` picks one of the two behaviours of Fu's
    code (both checked against a literal transcription in ``tests/attacks/test_mc_variants.py``):

    * ``True`` (default): Fu's code as it ran, under PyTorch 1.x, whose ``zero_grad()`` zeroed
      ``p.grad`` in place. That cleared the aliased buffer, backward wrote the new ``d`` into it,
      and the momentum update then added the buffer to itself: from the second step on,
      ``buf = momentum * (2 - dampening) * d`` (no memory of earlier steps), then scaled by ``r``.
    * ``False``: Fu's code under ``zero_grad(set_to_none=True)`` (the PyTorch 2 default, and how
      our parties clear gradients): PyTorch momentum, but the buffer that the next step builds on
      was scaled by ``r``, so it can grow by up to ``momentum * max_ratio`` per step; with
      momentum 0.9 this diverges (NaN within the first epoch on digits at lr 0.1 and 0.01).

    Here ``p.grad`` is never modified; both behaviours are computed explicitly. With Nesterov
    momentum or none, the two coincide. ``d_prev`` is kept per parameter (Fu keys it by position
    among the parameters that have a gradient, the same thing when every parameter gets a
    gradient at every step). Deterministic: no RNG.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        *,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        gamma_lr_scale_up: float = 1.0,
        min_ratio: float = 1.0,
        max_ratio: float = 5.0,
        legacy_zero_grad: bool = True,
    ) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(
                f"lr, momentum and weight_decay must be non-negative, got {lr}, {momentum}, {weight_decay}"
            )
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        if min_ratio > max_ratio:
            raise ValueError(f"min_ratio ({min_ratio}) exceeds max_ratio ({max_ratio})")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "gamma_lr_scale_up": gamma_lr_scale_up,
            "min_ratio": min_ratio,
            "max_ratio": max_ratio,
            "legacy_zero_grad": legacy_zero_grad,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One malicious update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            momentum, dampening = group["momentum"], group["dampening"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad.add(p, alpha=group["weight_decay"]) if group["weight_decay"] else p.grad.clone()
                state = self.state[p]
                if momentum:
                    if "momentum_buffer" not in state:
                        buf = state["momentum_buffer"] = d.clone()
                    elif group["legacy_zero_grad"] and not group["nesterov"]:
                        # PyTorch 1.x: zero_grad cleared the aliased buffer and backward wrote d into it,
                        # so the momentum update added the buffer to itself.
                        buf = state["momentum_buffer"]
                        buf.copy_(d).mul_(momentum * (2.0 - dampening))
                    else:
                        buf = state["momentum_buffer"]
                        buf.mul_(momentum).add_(d, alpha=1.0 - dampening)
                    d = d.add(buf, alpha=momentum) if group["nesterov"] else buf  # the alias (QUIRK)
                if "last_grad" in state:
                    ratio = 1.0 + group["gamma_lr_scale_up"] * d / (state["last_grad"] + 1e-7)
                    d.mul_(ratio.clamp_(group["min_ratio"], group["max_ratio"]))
                state["last_grad"] = d.clone()
                p.add_(d, alpha=-group["lr"])
        return loss


def rebuild_scheduler(old: lr_scheduler.LRScheduler, optimizer: torch.optim.Optimizer) -> lr_scheduler.LRScheduler:
    """The same learning-rate schedule, in the same state, driving ``optimizer`` instead."""
    if isinstance(old, lr_scheduler.MultiStepLR):
        new: lr_scheduler.LRScheduler = lr_scheduler.MultiStepLR(
            optimizer, sorted(old.milestones.elements()), old.gamma
        )
    elif isinstance(old, lr_scheduler.StepLR):
        new = lr_scheduler.StepLR(optimizer, old.step_size, old.gamma)
    elif isinstance(old, lr_scheduler.CosineAnnealingLR):
        new = lr_scheduler.CosineAnnealingLR(optimizer, old.T_max, old.eta_min)
    else:
        raise CompatibilityError(
            f"active_model_completion cannot carry the {type(old).__name__} schedule over "
            "to its malicious optimizer; use schedule constant, step, multistep or cosine"
        )
    new.load_state_dict(old.state_dict())
    return new


@ATTACKS.register(summary="model completion on a bottom model trained with Fu et al.'s malicious optimizer")
class ActiveModelCompletion(ModelCompletion):
    """Active model completion (Fu et al., §4.3): malicious local optimizer, then model completion.

    Needs ``phase: malicious``: before training the runner calls :meth:`install` on the
    attacker's own party only (never on another party), which replaces that party's optimizer
    with :class:`MaliciousSGD` over the same parameters with the same ``lr``, ``momentum``,
    ``dampening``, ``weight_decay`` and ``nesterov``, and moves the party's learning-rate
    schedule (if any) onto it with the same type and state. In Fu et al.'s paper the malicious
    optimizer raises the attacker's bottom-model learning rate adaptively, so that its bottom
    model learns more of the task (and the top model relies on it more), which makes the
    completed model more accurate. Everything the attacker sends still follows the protocol.

    ``legacy_zero_grad`` (default true) selects how Fu's aliased momentum buffer behaves; see
    :class:`MaliciousSGD`. The party's optimizer must be SGD (Fu's setting); Adam is refused
    when the party is corrupted.

    After training, :meth:`infer` is exactly supervised :class:`ModelCompletion` on the
    maliciously trained bottom model, with the same parameters (Fu et al. complete it with
    MixMatch; ``model_completion_mixmatch`` is that procedure, on an honestly trained model).
    """

    name = "active_model_completion"
    reads = ("bottom_model",)
    phase: ClassVar[Phase] = "malicious"  # type: ignore[assignment]  # (ModelCompletion's is inferred as a Literal)
    paper = (
        "Fu et al., Label Inference Attacks Against VFL (USENIX Security 2022), active model completion "
        "(malicious local optimizer); FuChong-cyber/label-inference-attacks my_optimizers.py"
    )
    threat = (
        "malicious passive party that updates its own bottom model with a scaled-up local optimizer and "
        "holds a few labelled samples (T1 + local deviation)"
    )

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
        gamma_lr_scale_up: float = 1.0,
        min_ratio: float = 1.0,
        max_ratio: float = 5.0,
        legacy_zero_grad: bool = True,
        momentum: float = 0.9,
        metric: LabelMetric = "auto",
    ) -> None:
        super().__init__(
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
            momentum=momentum,
            metric=metric,
        )
        self.gamma_lr_scale_up = gamma_lr_scale_up
        self.min_ratio = min_ratio
        self.max_ratio = max_ratio
        self.legacy_zero_grad = legacy_zero_grad
        if min_ratio > max_ratio:
            raise ValueError(f"min_ratio ({min_ratio}) exceeds max_ratio ({max_ratio})")

    def install(self, party: Party, grant: ThreatGrant) -> Sequence[PartyHook]:
        """Replace the attacker's own optimizer by :class:`MaliciousSGD` (and move its schedule); no hooks.

        The granted labels are not used: the malicious optimizer needs none.
        """
        require(
            isinstance(party, PassiveParty) and party.optimizer is not None,
            self.name,
            "it corrupts a passive party's own optimizer",
        )
        assert isinstance(party, PassiveParty) and party.optimizer is not None
        old = party.optimizer
        require(
            isinstance(old, torch.optim.SGD),
            self.name,
            f"its malicious optimizer replaces SGD (Fu et al.'s setting), but the party uses "
            f"{type(old).__name__}; set train.optimizer: sgd",
        )
        group = old.param_groups[0]
        params = [p for g in old.param_groups for p in g["params"]]
        malicious = MaliciousSGD(
            params,
            lr=group["lr"],
            momentum=group["momentum"],
            dampening=group["dampening"],
            weight_decay=group["weight_decay"],
            nesterov=group["nesterov"],
            gamma_lr_scale_up=self.gamma_lr_scale_up,
            min_ratio=self.min_ratio,
            max_ratio=self.max_ratio,
            legacy_zero_grad=self.legacy_zero_grad,
        )
        if "initial_lr" in group:
            malicious.param_groups[0]["initial_lr"] = group["initial_lr"]
        party.optimizer = malicious
        if party.scheduler is not None:
            party.scheduler = rebuild_scheduler(party.scheduler, malicious)
        return ()
