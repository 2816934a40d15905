"""VMask: layer masking, selection variants, security invariants, utility and attack direction."""

from __future__ import annotations

import pytest
import torch
from conftest import minimal

from vflbench.attacks.runner import attacker_copy
from vflbench.config import build_config
from vflbench.defenses.vmask import VMaskBottom
from vflbench.errors import CompatibilityError
from vflbench.eval.run import run_experiment
from vflbench.eval.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.mpc.layers import oracle_effective_weight

SYNTHETIC = {"n_samples": 2000, "n_features": 40, "n_informative": 30, "n_classes": 8, "class_sep": 1.5}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _federation(defense, **train):
    cfg = build_config(minimal(model={"bottom": "mlp3", "top": "mlp2"}, train={"epochs": 3, **train},
                               defenses=[{"aux_size": 200, **defense}]))
    vd = load_vertical_data(cfg)
    return cfg, vd, build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1"]))


def _tensors(obj, seen=None):
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
        yield from _tensors(vars(obj), seen)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, seen)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            yield from _tensors(v, seen)


def test_first_layer_is_masked_before_training_and_its_plaintext_is_gone():
    _, _, fed = _federation({"name": "vmask"})
    bottom = fed.passives[0].bottom
    assert isinstance(bottom, VMaskBottom)
    layers = bottom.layers()
    assert [layer.masked for layer in layers] == [True, False, False]
    assert torch.count_nonzero(layers[0].weight) == 0


def test_passive_party_never_holds_the_plaintext_weight_of_a_masked_layer():
    cfg, vd, fed = _federation({"name": "vmask_alls"})
    party = fed.passives[0]
    g = torch.Generator().manual_seed(0)
    for step in range(6):
        ids = torch.randperm(len(vd.y_train), generator=g)[:64]
        fed.train_step(ids, epoch=0, step=step)
        secrets = [oracle_effective_weight(layer.shared)[0].float() for layer in party.bottom.layers()]
        held = (list(_tensors(party.bottom)) + list(_tensors(party.optimizer.state))
                + list(_tensors(party.transcript)))
        for secret in secrets:
            for t in held:
                if t.shape == secret.shape and t.is_floating_point():
                    assert not torch.allclose(t.float(), secret, atol=1e-3), (
                        "plaintext weight found at the passive party")


def test_attacker_copy_reinitialises_masked_layers():
    _, _, fed = _federation({"name": "vmask_alls"})
    bottom = fed.passives[0].bottom
    copy = attacker_copy(bottom)
    assert not isinstance(copy, VMaskBottom)
    plain = [m for m in copy.modules() if isinstance(m, torch.nn.Linear)]
    for layer, secret in zip(plain, bottom.layers(), strict=True):
        effective = oracle_effective_weight(secret.shared)[0].float()
        assert not torch.allclose(layer.weight, effective, atol=1e-2)
        assert layer.weight.abs().max() < 1.0  # a fresh initialisation, not a ring share
    _, _, fed = _federation({"name": "vmask_alls", "attacker_view": "share"})
    shares = [m for m in attacker_copy(fed.passives[0].bottom).modules() if isinstance(m, torch.nn.Linear)]
    assert shares[0].weight.abs().max() > 1e6  # a uniformly random ring element decodes to garbage


def test_alls_with_sigma_zero_trains_like_vanilla():
    """Secret-shared training equals plaintext training up to fixed-point rounding (<= 5e-4 per step,
    see tests/mpc); SGD then amplifies such differences like any 1e-4 perturbation of the initial
    weights, so the final accuracies are compared with a tolerance of 3 points on digits."""
    vanilla = run_experiment(build_config(minimal(model={"bottom": "mlp3", "top": "mlp2"})))
    masked = run_experiment(build_config(minimal(model={"bottom": "mlp3", "top": "mlp2"},
                                                 defenses=[{"name": "vmask_alls", "sigma": 0.0, "aux_size": 200}])))
    assert abs(vanilla.utility.value - masked.utility.value) <= 0.03
    assert masked.utility.value >= 0.85


def _metrics(defense, epochs=4):
    cfg, vd, fed = _federation(defense, epochs=epochs)
    history = fed.fit(epochs=epochs, batch_size=64, generator=torch.Generator().manual_seed(0), y_test=vd.y_test)
    return history.epochs


def test_variants_select_as_the_paper_says():
    alls = _metrics({"name": "vmask_alls"})
    assert all(e["vmask_alls.mask_ratio_epoch"] == 1.0 for e in alls)
    acc = _metrics({"name": "vmask_as", "budget": 0.0})  # an unreachable budget masks layer after layer
    masked = [set(e["vmask_as.passive_1.masked"]) for e in acc if "vmask_as.passive_1.masked" in e]
    assert all(a <= b for a, b in zip(masked, masked[1:], strict=False))
    vm = _metrics({"name": "vmask", "budget": 1.0})  # a budget every estimate meets masks nothing
    assert [e["vmask.passive_1.masked"] for e in vm if "vmask.passive_1.masked" in e] == [[], [], []]
    assert vm[0]["vmask.mask_ratio_epoch"] == pytest.approx(1 / 3) and vm[1]["vmask.mask_ratio_epoch"] == 0.0
    assert vm[-1]["vmask.mpc_bytes"] > 0


def test_vmask_holds_model_completion_near_scratch():
    base = minimal(data={"name": "synthetic", "options": SYNTHETIC}, model={"bottom": "mlp3", "top": "mlp2"},
                   train={"epochs": 6}, attacks=[{"name": "model_completion", "prior": "scratch", "epochs": 25}])
    vanilla = run_experiment(build_config(base)).attacks[0]
    protected = run_experiment(build_config({**base, "defenses": [{"name": "vmask", "aux_size": 300}]})).attacks[0]
    assert vanilla.value > vanilla.prior + 0.1           # the attack works without defense
    # VMask removes more than half of the leakage above the scratch prior (paper: all of it)
    assert protected.value - protected.prior < 0.5 * (vanilla.value - vanilla.prior)


def test_vmask_is_rejected_in_vlr():
    cfg = build_config(minimal(data={"name": "breast_cancer"}, model={"bottom": "logreg", "top": "identity"},
                               train={"algorithm": "vlr"}, defenses=[{"name": "vmask"}]))
    with pytest.raises(CompatibilityError, match="vhnn or vsnn"):
        run_experiment(cfg)


def test_each_passive_party_gets_its_own_masks_and_shadow():
    """K-1 passive parties (VMask Tables V-VI): per-party shared layers, shadows and mask reports."""
    cfg = build_config(minimal(data={"name": "digits", "parties": 3}, model={"bottom": "mlp3", "top": "mlp2"},
                               train={"epochs": 2}, defenses=[{"name": "vmask", "aux_size": 200}]))
    vd = load_vertical_data(cfg)
    names = ["passive_1", "passive_2"]
    fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, names))
    bottoms = [p.bottom for p in fed.passives]
    assert all(isinstance(b, VMaskBottom) and b.layers()[0].masked for b in bottoms)
    assert bottoms[0].layers()[0].shared is not bottoms[1].layers()[0].shared
    defense = fed.active.defenses[0]
    assert set(defense.parties_) == set(names)
    assert defense.parties_["passive_1"].shadow is not defense.parties_["passive_2"].shadow
    g = torch.Generator().manual_seed(0)
    for step in range(5):
        fed.train_step(torch.randperm(len(vd.y_train), generator=g)[:64], epoch=0, step=step)
    report = defense.on_epoch_end(0)  # shadow update and layer selection for each party
    assert {"passive_1.masked", "passive_2.masked"} <= set(report)
    assert run_experiment(cfg).utility.value > 0.3  # trains well above chance (0.1) with 3 parties
