"""Model-completion variants of Fu et al.: MixMatch completion and active (malicious-optimizer) completion."""

from __future__ import annotations

import pytest
import torch
from conftest import minimal

from vflbench.attacks.label.active import MaliciousSGD
from vflbench.errors import CompatibilityError
from vflbench.experiment.config import build_config
from vflbench.experiment.plan import validate_attacks
from vflbench.experiment.run import run_experiment, train_run
from vflbench.experiment.scenario import load_vertical_data


def test_mixmatch_completion_beats_random_on_digits_with_a_curve():
    cfg = build_config(minimal(attacks=[{"name": "model_completion_mixmatch", "val_iteration": 20, "epochs": 3}]))
    [mm] = run_experiment(cfg).attacks
    assert mm.metric == "accuracy" and mm.prior_name == "local"
    assert len(mm.details["finetune_curve"]) == 3 and mm.details["selection"] == "last"
    assert mm.value == mm.details["finetune_curve"][-1]
    assert mm.value > 0.1 + 0.05
    assert mm.details["unlabelled"] > 0 and mm.details["known_labels"] == 40
    assert mm.details["interleaved"] is False  # mlp2 bottom + MLP2 head: no BatchNorm


def test_mixmatch_completion_refuses_vlr_and_large_batches():
    vlr = minimal(
        data={"name": "breast_cancer"},
        model={"bottom": "logreg", "top": "identity"},
        train={"algorithm": "vlr"},
        attacks=[{"name": "model_completion_mixmatch"}],
    )
    cfg = build_config(vlr)
    with pytest.raises(CompatibilityError, match="use model_completion"):
        validate_attacks(cfg, load_vertical_data(cfg))
    cfg = build_config(minimal(data={"name": "breast_cancer"}, attacks=[{"name": "model_completion_mixmatch"}]))
    with pytest.raises(CompatibilityError, match="batch_size"):
        validate_attacks(cfg, load_vertical_data(cfg))


def _attacker_bottom(attack: dict, **train) -> tuple[list[torch.Tensor], object]:
    cfg = build_config(minimal(train={"epochs": 2, **train}, attacks=[attack]))
    vd = load_vertical_data(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.train.threads)  # as run_experiment does; tiny models are slow on many threads
    try:
        run = train_run(cfg, vd, attacks=validate_attacks(cfg, vd))
    finally:
        torch.set_num_threads(threads)
    party = {p.name: p for p in run.federation.parties()}["passive_1"]
    return [p.detach().clone() for p in party.bottom.parameters()], party


def test_active_model_completion_trains_a_different_bottom_model():
    honest, honest_party = _attacker_bottom({"name": "model_completion", "epochs": 1})
    malicious, party = _attacker_bottom({"name": "active_model_completion", "epochs": 1})
    assert isinstance(party.optimizer, MaliciousSGD) and not isinstance(honest_party.optimizer, MaliciousSGD)
    assert party.optimizer.param_groups[0]["momentum"] == 0.9 and party.optimizer.param_groups[0]["lr"] == 0.1
    assert all(torch.isfinite(p).all() for p in malicious)
    assert any(not torch.equal(a, b) for a, b in zip(honest, malicious, strict=True))


def test_active_model_completion_keeps_the_schedule():
    _, party = _attacker_bottom(
        {"name": "active_model_completion", "epochs": 1}, schedule="multistep", milestones=[1], weight_decay=5e-4
    )
    assert isinstance(party.optimizer, MaliciousSGD) and party.scheduler.optimizer is party.optimizer
    assert party.optimizer.param_groups[0]["weight_decay"] == 5e-4
    assert party.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.1)  # stepped past milestone 1


def test_active_model_completion_end_to_end():
    cfg = build_config(minimal(train={"epochs": 5}, attacks=[{"name": "active_model_completion", "epochs": 20}]))
    result = run_experiment(cfg)
    [amc] = result.attacks
    assert amc.prior_name == "local" and len(amc.details["finetune_curve"]) == 20
    assert amc.value > 0.1 + 0.2 and result.utility.value > 0.5


def test_active_model_completion_refuses_adam():
    cfg = build_config(minimal(train={"optimizer": "adam", "lr": 1e-3}, attacks=[{"name": "active_model_completion"}]))
    vd = load_vertical_data(cfg)
    with pytest.raises(CompatibilityError, match="train.optimizer: sgd"):
        train_run(cfg, vd, attacks=validate_attacks(cfg, vd))


def _two_steps(legacy: bool) -> tuple[torch.Tensor, torch.Tensor, MaliciousSGD]:
    """Two steps on a toy parameter with hand-set gradients g1, g2; the parameter after each."""
    p = torch.nn.Parameter(torch.zeros(4))
    opt = MaliciousSGD([p], lr=0.1, momentum=0.9, legacy_zero_grad=legacy)
    after = []
    for g in ([1.0, 1.0, -1.0, 2.0], [1.0, -3.0, 1.0, 20.0]):
        opt.zero_grad(set_to_none=True)
        p.grad = torch.tensor(g)
        opt.step()
        after.append(p.detach().clone())
    return after[0], after[1], opt


@pytest.mark.parametrize("legacy", [False, True])
def test_malicious_sgd_first_step_is_sgd_with_momentum(legacy):
    first, _, _ = _two_steps(legacy)
    q = torch.nn.Parameter(torch.zeros(4))
    sgd = torch.optim.SGD([q], lr=0.1, momentum=0.9)
    q.grad = torch.tensor([1.0, 1.0, -1.0, 2.0])
    sgd.step()
    assert torch.allclose(first, q.detach())
    assert torch.allclose(first, torch.tensor([-0.1, -0.1, 0.1, -0.2]))


def test_malicious_sgd_second_step_is_scaled_and_scales_the_buffer():
    first, second, opt = _two_steps(legacy=False)
    # momentum direction d2 = 0.9 * g1 + g2 = [1.9, -2.1, 0.1, 21.8]
    # ratio clamp(1 + d2 / d1, 1, 5) with d1 = g1: [2.9, -1.1 -> 1, 0.9 -> 1, 11.9 -> 5]
    scaled = torch.tensor([1.9 * 2.9, -2.1, 0.1, 21.8 * 5.0])
    assert torch.allclose(first - second, 0.1 * scaled, atol=1e-5)
    [p] = opt.param_groups[0]["params"]
    assert torch.allclose(opt.state[p]["momentum_buffer"], scaled, atol=1e-5)  # QUIRK: the buffer is scaled
    assert torch.allclose(opt.state[p]["last_grad"], scaled, atol=1e-5)


def test_malicious_sgd_legacy_second_step_doubles_the_cleared_buffer():
    first, second, _ = _two_steps(legacy=True)
    # PyTorch 1.x: the buffer was cleared and refilled with g2, then added to itself: d2 = 2 * 0.9 * g2
    d2 = torch.tensor([1.8, -5.4, 1.8, 36.0])
    # ratio clamp(1 + d2 / d1, 1, 5) with d1 = g1: [2.8, -4.4 -> 1, -0.8 -> 1, 19 -> 5]
    ratio = torch.tensor([2.8, 1.0, 1.0, 5.0])
    assert torch.allclose(first - second, 0.1 * d2 * ratio, atol=1e-5)


class _FuAsWritten(torch.optim.Optimizer):
    """Fu et al.'s MaliciousSGD step as written: the momentum buffer is assigned to ``p.grad.data``."""

    def __init__(self, params, lr: float, momentum: float, weight_decay: float) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad.add_(p, alpha=group["weight_decay"])
                state = self.state[p]
                if "buf" in state:
                    state["buf"].mul_(group["momentum"]).add_(p.grad)
                else:
                    state["buf"] = p.grad.clone()
                p.grad.data = state["buf"]
                if "last" in state:
                    p.grad.mul_((1 + p.grad / (state["last"] + 1e-7)).clamp(1, 5))
                state["last"] = p.grad.clone()
                p.add_(p.grad, alpha=-group["lr"])


def _trajectory(make, set_to_none: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, generator=g))
    opt = make([w])
    for _ in range(6):
        opt.zero_grad(set_to_none=set_to_none)
        a = torch.randn(5, generator=g)
        (w * a + 0.1 * w**2).sum().backward()
        opt.step()
    return w.detach()


@pytest.mark.parametrize(("legacy", "fu_set_to_none"), [(True, False), (False, True)])
def test_malicious_sgd_matches_fu_code_under_both_zero_grad_semantics(legacy, fu_set_to_none):
    """``legacy_zero_grad`` reproduces Fu's code run with PyTorch 1.x's ``zero_grad()`` (which zeroed
    the aliased buffer in place); without it, Fu's code run with ``zero_grad(set_to_none=True)``."""
    ours = _trajectory(
        lambda ps: MaliciousSGD(ps, lr=0.1, momentum=0.9, weight_decay=5e-4, legacy_zero_grad=legacy), set_to_none=True
    )
    fu = _trajectory(lambda ps: _FuAsWritten(ps, lr=0.1, momentum=0.9, weight_decay=5e-4), set_to_none=fu_set_to_none)
    assert torch.allclose(ours, fu, atol=1e-6)
