"""VMask: layer masking, selection variants, security invariants, utility and attack direction."""

from __future__ import annotations

import copy
import io
import logging

import pytest
import torch
from conftest import Observer, minimal
from torch import nn

from vflbench.defenses.vmask import VMask, VMaskActive, VMaskPassive, layer_conditions
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.plan import validate_attacks
from vflbench.experiment.run import run_experiment, train_run
from vflbench.experiment.scenario import DefensePlan, build_federation, load_vertical_data, plan_defenses
from vflbench.experiment.scoring import run_attacks, score_inference
from vflbench.experiment.views import _view as runner_view
from vflbench.experiment.views import attacker_copy
from vflbench.mpc.layers import oracle_effective_weight
from vflbench.mpc.masking import MaskableLayer, VMaskBottom
from vflbench.mpc.parties import PROTOCOL_KINDS
from vflbench.protocol.channel import Endpoint

#: digits with 300 training rows held out as the auxiliary pool that VMask's shadow models train on
POOL = {"name": "digits", "parties": 2, "aux_pool": 300}
SYNTHETIC = {"n_samples": 2000, "n_features": 40, "n_informative": 30, "n_classes": 8, "class_sep": 1.5}


def _federation(defense, **train):
    cfg = build_config(
        minimal(
            data={**POOL, "aux_pool": 200},
            model={"bottom": "mlp3", "top": "mlp2"},
            train={"epochs": 3, **train},
            defenses=[defense],
        )
    )
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


def test_no_tensor_the_passive_party_stores_equals_the_effective_weight():
    """A storage check only: nothing P_k stores (model, optimizer state, transcript) equals the
    effective weight of a masked layer. It does NOT show that P_k cannot compute the weight: it can,
    from its openings and its own updates (test_recovered_attacker_solves_the_effective_weights)."""
    cfg, vd, fed = _federation({"name": "vmask_alls"})
    party = fed.passives[0]
    g = torch.Generator().manual_seed(0)
    for step in range(6):
        ids = torch.randperm(len(vd.y_train), generator=g)[:64]
        fed.train_step(ids, epoch=0, step=step)
        secrets = [oracle_effective_weight(layer.shared)[0].float() for layer in party.bottom.layers()]
        held = list(_tensors(party.bottom)) + list(_tensors(party.optimizer.state)) + list(_tensors(party.transcript))
        for secret in secrets:
            for t in held:
                if t.shape == secret.shape and t.is_floating_point():
                    assert not torch.allclose(t.float(), secret, atol=1e-3), (
                        "plaintext weight found at the passive party"
                    )


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


@pytest.mark.slow
def test_alls_with_sigma_zero_trains_like_vanilla():
    """Secret-shared training equals plaintext training up to fixed-point rounding (<= 5e-4 per step,
    see tests/mpc); SGD then amplifies such differences like any 1e-4 perturbation of the initial
    weights, so the final accuracies are compared with a tolerance of 3 points on digits."""
    vanilla = run_experiment(build_config(minimal(data=POOL, model={"bottom": "mlp3", "top": "mlp2"})))
    masked = run_experiment(
        build_config(
            minimal(data=POOL, model={"bottom": "mlp3", "top": "mlp2"}, defenses=[{"name": "vmask_alls", "sigma": 0.0}])
        )
    )
    assert abs(vanilla.utility.value - masked.utility.value) <= 0.03
    # it trains (chance is 0.1): 0.853 on the CPU, 0.844 on an H100, whose float sums are another sample of the run
    assert masked.utility.value >= 0.8


def _metrics(defense, epochs=4):
    cfg, vd, fed = _federation(defense, epochs=epochs)
    history = fed.fit(epochs=epochs, batch_size=64, generator=torch.Generator().manual_seed(0), y_test=vd.y_test)
    return history.epochs


@pytest.mark.slow
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


@pytest.mark.slow
def test_vmask_holds_the_reinit_attacker_near_scratch():
    """Against the paper's attacker only (``attacker_view: reinit``: masked layers re-initialised).
    This holds by construction whenever layers end masked, whatever the protocol does; the attacker
    that uses what it receives is test_recovered_attacker_solves_the_effective_weights."""
    base = minimal(
        data={"name": "synthetic", "options": SYNTHETIC, "aux_pool": 300},
        model={"bottom": "mlp3", "top": "mlp2"},
        train={"epochs": 6},
        attacks=[{"name": "model_completion", "prior": "scratch", "epochs": 25}],
    )
    vanilla = run_experiment(build_config(base)).attacks[0]
    protected = run_experiment(build_config({**base, "defenses": [{"name": "vmask", "aux_size": 300}]})).attacks[0]
    assert vanilla.details["attacker_view"] == "plain" and protected.details["attacker_view"] == "reinit"
    assert vanilla.value > vanilla.prior + 0.1  # the attack works without defense
    # VMask removes more than half of the reinit attacker's leakage above the scratch prior (paper: all of it)
    assert protected.value - protected.prior < 0.5 * (vanilla.value - vanilla.prior)


def _trained_with_attacks(defense, attacks, epochs=4, seed=0, **sections):
    cfg = build_config(
        minimal(
            **{
                "data": POOL,
                "model": {"bottom": "mlp3", "top": "mlp2"},
                "train": {"epochs": epochs},
                "defenses": [defense],
                "attacks": attacks,
                "seed": seed,
                **sections,
            }
        )
    )
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    run = train_run(cfg, vd, attacks=plan)
    return plan, run, run_attacks(plan, run)[0]


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [0.0, 0.01])
def test_recovered_attacker_solves_the_effective_weights(sigma):
    """The passive party solves every masked layer from its openings and own updates to ~1e-5, so
    model completion on the recovered model equals model completion on the true effective model,
    and leaks far more than the paper's reinit attacker. A protocol that leaked less than Algorithm 5
    says (or a recorder that saw other values than P_k receives) would fail the first assertion; a
    recovery that left the noise in would fail the second."""
    mc = {"prior": "scratch", "epochs": 25}
    plan, run, (reinit, recovered) = _trained_with_attacks(
        {"name": "vmask_alls", "sigma": sigma},
        [{"name": "model_completion", **mc}, {"name": "vmask_weight_recovery", **mc}],
        epochs=6,
        data={"name": "synthetic", "options": SYNTHETIC, "aux_pool": 300},
    )
    layers = recovered.details["layers"]
    assert [layer["name"] for layer in layers] == ["1", "3", "5"]
    for layer in layers:
        errors = layer["evaluation_only"]
        assert errors["output_relative_error"] < 1e-4
        if layer["solvable"]:
            assert errors["relative_error"] < 1e-4
        if sigma:  # without the solve, P_k's own record is off by the noise
            assert errors["relative_error_known_only"] > 1e-2
    assert layers[0]["solvable"] and layers[1]["solvable"]
    bottom = run.federation.passives[0].bottom
    oracle = attacker_copy(bottom)
    with torch.no_grad():
        for name, layer in bottom.named_layers():
            w, b = layer.evaluation_only_effective_weight()
            oracle.inner.get_submodule(name).weight.copy_(w)
            oracle.inner.get_submodule(name).bias.copy_(b)
    attack = plan.attacks[0].attack
    view = runner_view(run, plan.attacks[0])
    on_oracle, _ = score_inference(attack.complete(view, oracle), run.data.y_train, run.data.y_test, "accuracy")
    assert recovered.prior == reinit.prior  # the same scratch prior: same known labels and random stream
    assert abs(recovered.value - on_oracle) <= 0.01
    assert recovered.details["attacker_view"] == "recovered" and reinit.details["attacker_view"] == "reinit"
    assert recovered.value - recovered.prior > reinit.value - reinit.prior + 0.05


def test_recovery_reports_a_layer_neither_channel_solves():
    """With one opening per stage, the 256->128 layer has 64 forward rows for 257 unknowns per output
    and 64 backward rows for 128 unknowns per input: neither channel has full rank. The attack says
    so, keeps P_k's own record in the undetermined directions, and its error there is reported."""
    _, _, (result,) = _trained_with_attacks(
        {"name": "vmask_alls"},
        [{"name": "vmask_weight_recovery", "epochs": 2, "max_openings": 1}],
        epochs=1,
        data={"name": "synthetic", "options": SYNTHETIC, "aux_pool": 300},
    )
    layers = {layer["name"]: layer for layer in result.details["layers"]}
    hidden = layers["3"]
    assert not hidden["solvable"] and result.details["unsolvable"] == ["3"]
    assert hidden["forward_rank"] < hidden["forward_full_rank"] and hidden["backward_rank"] < 128
    assert 0 < hidden["determined_fraction"] < 1 and "fallback: tracked" in hidden["used"]
    assert hidden["evaluation_only"]["relative_error"] > 1e-3  # the undetermined part of the noise remains
    assert layers["1"]["solvable"] and layers["1"]["evaluation_only"]["relative_error"] < 1e-4


SYNTHETIC_NO_POOL = {"name": "synthetic", "options": SYNTHETIC, "aux_pool": 0}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_own_record_does_as_well_as_the_recovery(seed):
    """Issue 25: P_k's own record (its weight before masking plus its own updates, no solve) regains as much as
    the exact least-squares recovery. Tolerance: within 3 points of the recovery on every seed (both use the same
    known labels and random stream, so only the weights differ: the review measured 0.25-1.0 points on this case),
    and both at least 8 points above the paper's reinit attacker (measured 10-15 points above it). VMask-ALLS runs
    with no auxiliary pool (it needs none)."""
    mc = {"prior": "scratch", "epochs": 25}
    _, run, (reinit, recovered, own) = _trained_with_attacks(
        {"name": "vmask_alls", "sigma": 0.01},
        [{"name": name, **mc} for name in ("model_completion", "vmask_weight_recovery", "vmask_own_record")],
        epochs=6,
        data=SYNTHETIC_NO_POOL,
        seed=seed,
    )
    assert run.federation.train_rows is None  # no row held out
    assert own.details["attacker_view"] == "own_record"
    assert [r["name"] for r in own.details["layers"]] == ["1", "3", "5"]
    assert own.prior == recovered.prior == reinit.prior  # the same scratch prior: same known labels and stream
    assert abs(own.value - recovered.value) <= 0.03
    assert min(own.value, recovered.value) >= reinit.value + 0.08


def test_own_record_installs_w_known_and_reads_no_oracle(monkeypatch):
    """The own-record attack puts into P_k's copy exactly W_known (P_k's weight before masking plus the decoded
    difference of its own share since), folds no opening, needs no evaluation grant between processes, and never
    calls the simulation oracle (made to raise here); W_known is off the effective weight by the noise."""
    mc = {"prior": "scratch", "epochs": 1}
    plan, run, _ = _trained_with_attacks(
        {"name": "vmask_alls", "sigma": 0.01}, [{"name": "vmask_own_record", **mc}], epochs=1, data=SYNTHETIC_NO_POOL
    )
    assert [g.kind for g in plan.grants()] == []  # vmask_weight_recovery's plan asks for "vmask.oracle"
    attack = plan.attacks[0].attack
    bottom = run.federation.passives[0].bottom
    truths = {name: layer.evaluation_only_effective_weight()[0] for name, layer in bottom.named_layers()}

    def oracle(self):
        raise AssertionError("vmask_own_record read the evaluation-only effective weight")

    monkeypatch.setattr(MaskableLayer, "evaluation_only_effective_weight", oracle)
    (result,), _ = run_attacks(plan, run)
    assert result.details["attacker_view"] == "own_record"
    copy_ = attacker_copy(bottom)
    for name in copy_.masked:
        attack._install(copy_, name)
    for name, layer in bottom.named_layers():
        _, rec = attack.recorders_[name]
        assert rec.counts == {"forward": 0, "backward": 0}
        share, _ = layer.own_shares()
        frac = layer.shared.frac_bits
        expected = rec.weight0 + (share.cpu() - rec.share0).to(torch.float64) * 2.0**-frac
        installed = copy_.inner.get_submodule(name).weight.detach().to(torch.float64).cpu()  # the run's device
        assert torch.allclose(installed, expected.to(installed.dtype), atol=1e-6)
        truth = truths[name].to(torch.float64).cpu()
        assert 1e-3 < float((installed - truth).norm() / truth.norm()) < 1.0


def test_vmask_alls_needs_no_auxiliary_rows_and_reports_its_preconditions(caplog):
    """Issue 25: VMask-ALLS trains no shadow, so it runs with data.aux_pool 0 (no row held out) and refuses
    aux_size; the paper's precondition check still runs, on the slice shape P_k sends in vmask.setup."""
    cfg = build_config(
        minimal(
            data={"name": "digits", "parties": 2},
            model={"bottom": "mlp3", "top": "mlp2"},
            train={"epochs": 1},
            defenses=[{"name": "vmask_alls"}],
        )
    )
    vd = load_vertical_data(cfg)
    with caplog.at_level(logging.WARNING, logger="vflbench.defenses.vmask"):
        fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1"]))
    active = fed.active.defenses[0]
    assert active.context_.aux is None and fed.train_rows is None
    details = active.details()
    assert details["paper_precondition_violations"] == {"passive_1": ["1"]}  # 64 >= 32 features
    assert [c["name"] for c in details["preconditions"]["passive_1"]] == ["1", "3", "5"]
    assert "violate the paper's own precondition" in caplog.text
    result = run_experiment(cfg)
    assert result.defense[0]["details"]["paper_precondition_violations"] == {"passive_1": ["1"]}
    with pytest.raises(ConfigError, match="vmask_alls trains no shadow model.*remove aux_size"):
        run_experiment(
            build_config(
                minimal(
                    data={"name": "digits", "parties": 2, "aux_pool": 100},
                    model={"bottom": "mlp3", "top": "mlp2"},
                    defenses=[{"name": "vmask_alls", "aux_size": 50}],
                )
            )
        )


def test_a_malformed_input_shape_in_vmask_setup_is_refused():
    """The active half checks the slice shape P_k sends before using it."""
    from vflbench.defenses.vmask import _input_shape

    assert _input_shape("passive_1", "1,28,14") == (1, 28, 14)
    for bad in (None, "", "1,x", "0,28", "-1"):
        with pytest.raises(CompatibilityError, match="sent input_shape"):
            _input_shape("passive_1", bad)


def test_vmask_auxiliary_rows_are_not_trained_on():
    """VMask §IV-A: the auxiliary set does not overlap the passive party's training rows."""
    cfg, vd, fed = _federation({"name": "vmask"}, epochs=1)
    aux = fed.active.defenses[0].context_.aux.ids
    assert fed.train_rows is not None and len(fed.train_rows) == len(vd.y_train) - len(aux)
    assert not bool(torch.isin(fed.train_rows, aux).any())
    seen = []
    fed.passives[0].attach(Observer(lambda state, g: seen.append(state.ids)))
    fed.fit(epochs=1, batch_size=64, generator=torch.Generator().manual_seed(0), y_test=vd.y_test)
    trained = torch.cat(seen)
    assert len(trained) == len(fed.train_rows) and not bool(torch.isin(trained, aux).any())


class _RecordingVMask(VMaskActive):
    """VMask's active half that records the attack set each simulated attack is given (a test double)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls_ = []

    def _simulated_attacks(self, party, shadow, candidates, known):
        self.calls_ += [(len(self.ratios_), frozenset(masked), known.clone()) for masked in candidates]
        return super()._simulated_attacks(party, shadow, candidates, known)


def test_attack_set_is_drawn_once_per_selection():
    """Algorithm 2 line 7: D_A is built once per selection, before the greedy loop over candidates."""
    cfg = build_config(minimal(data=POOL, model={"bottom": "mlp3", "top": "mlp2"}, train={"epochs": 3}))
    vd = load_vertical_data(cfg)
    defense = _RecordingVMask(aux_size=200, budget=0.0, mc_epochs=1)
    half = VMaskPassive(aux_size=200, budget=0.0, mc_epochs=1)  # the passive party's half
    fed = build_federation(cfg, vd, defenses=DefensePlan([defense], {"passive_1": [half]}))
    fed.fit(epochs=3, batch_size=64, generator=torch.Generator().manual_seed(0), y_test=vd.y_test)
    by_epoch = {}
    for epoch, masked, known in defense.calls_:
        by_epoch.setdefault(epoch, []).append((masked, known))
    assert len(by_epoch) == 2 and all(len(calls) == 4 for calls in by_epoch.values())  # {}, then 3 candidates
    for calls in by_epoch.values():
        assert all(torch.equal(known, calls[0][1]) for _, known in calls)
        assert len({masked for masked, _ in calls}) == len(calls)


def test_simulated_attack_takes_the_configured_model_completion_recipe():
    """V5: ``mc_*`` left unset take the configured model_completion attack's recipe, else model
    completion's defaults; an ``mc_*`` given wins."""
    attack = {"name": "model_completion", "optimizer": "sgd", "lr": 0.05, "batch_size": 8, "momentum": 0.5}
    cfg = build_config(
        minimal(
            data=POOL,
            model={"bottom": "mlp3", "top": "mlp2"},
            defenses=[{"name": "vmask", "aux_size": 200}],
            attacks=[attack],
        )
    )
    plan = plan_defenses(cfg, ["passive_1"])
    build_federation(cfg, load_vertical_data(cfg), defenses=plan)
    assert plan.active[0].recipe_ == {"optimizer": "sgd", "lr": 0.05, "batch_size": 8, "momentum": 0.5}
    _, _, fed = _federation({"name": "vmask", "mc_lr": 0.2, "mc_batch_size": "full"})
    assert fed.active.defenses[0].recipe_ == {"lr": 0.2, "batch_size": None}  # the rest: complete()'s defaults


def test_paper_preconditions_are_checked_before_training(caplog):
    """§IV-D: FC layers need B < n_in, conv layers n > (h+2p+s)/(s+1). The digits slice has 32
    features, so with batches of 64 the first layer violates the paper's own condition."""
    with caplog.at_level(logging.WARNING, logger="vflbench.defenses.vmask"):
        _, _, fed = _federation({"name": "vmask"})
    details = fed.active.defenses[0].details()
    assert details["paper_precondition_violations"] == {"passive_1": ["1"]}
    first, hidden, last = details["preconditions"]["passive_1"]
    assert first["backward_batches"] is None and hidden["backward_batches"] == 2 and last["backward_batches"] == 1
    assert "violate the paper's own precondition" in caplog.text and "['1']" in caplog.text
    convs = nn.Sequential(nn.Conv2d(1, 2, 5), nn.ReLU(), nn.Conv2d(2, 3, 7, stride=3))
    secure = [c.paper_secure for c in layer_conditions(convs, torch.zeros(2, 1, 28, 14), 128)]
    # 5 <= (28+1)/2: solvable by the paper's own count; 7 > (24+3)/4 and 7 > (10+3)/4: secure by it
    assert secure == [False, True]


def test_vmask_is_rejected_in_vlr():
    cfg = build_config(
        minimal(
            data={"name": "breast_cancer", "aux_pool": 50},
            model={"bottom": "logreg", "top": "identity"},
            train={"algorithm": "vlr"},
            defenses=[{"name": "vmask"}],
        )
    )
    with pytest.raises(CompatibilityError, match="vhnn or vsnn"):
        run_experiment(cfg)


@pytest.mark.slow
def test_each_passive_party_gets_its_own_masks_and_shadow():
    """K-1 passive parties (VMask Tables V-VI): per-party shared layers, shadows and mask reports."""
    cfg = build_config(
        minimal(
            data={**POOL, "parties": 3},
            model={"bottom": "mlp3", "top": "mlp2"},
            train={"epochs": 2},
            defenses=[{"name": "vmask", "aux_size": 200}],
        )
    )
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


# -- the parties' halves talk only through messages ---------------------------------------------------


def _reachable(root, stop=(Endpoint, torch.Generator)):
    """Every object reachable from ``root`` through attributes and containers, not entering the
    endpoint (the channel is the network between the parties) or generators."""
    seen, stack = {}, [root]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, stop) or isinstance(o, type):
            continue
        seen[id(o)] = o
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif hasattr(o, "__dict__"):
            stack.extend(vars(o).values())
    return seen


def test_the_active_half_holds_no_object_of_a_passive_party():
    """Issue 18: the active party's VMask instance reaches P_k's bottom model only through messages.
    The old design kept P_k's VMaskBottom in the active instance's per-party state (and so every
    shared layer and P_k's shares)."""
    cfg = build_config(
        minimal(
            data={**POOL, "parties": 3},
            model={"bottom": "mlp3", "top": "mlp2"},
            train={"epochs": 2},
            defenses=[{"name": "vmask", "aux_size": 200, "mc_epochs": 1}],
        )
    )
    vd = load_vertical_data(cfg)
    fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1", "passive_2"]))
    fed.fit(epochs=2, batch_size=64, generator=torch.Generator().manual_seed(0), y_test=vd.y_test)
    active = fed.active.defenses[0]
    assert active.context_.party == "active" and set(active.parties_) == {"passive_1", "passive_2"}
    theirs = {}
    for party in fed.passives:
        theirs.update({id(m): m for m in party.bottom.modules()})
        theirs.update({id(t): t for t in (*party.bottom.parameters(), *party.bottom.buffers())})
        theirs.update({id(d): d for d in party.defenses})
    reached = _reachable(active)
    assert not set(reached) & set(theirs), "the active VMask half holds an object of a passive party"
    assert not any(isinstance(o, VMaskBottom) for o in reached.values())
    # its shadow starts from P_k's initial parameters, which came in P_k's vmask.setup message
    assert fed.channel.stats["setup"].by_kind["vmask.setup"]["up"].messages == 2


def test_a_passive_halfs_model_copied_or_pickled_holds_no_active_share():
    """A deep copy or a pickle of P_k's bottom model (what an attack fine-tunes or a checkpoint
    writes) contains no tensor of the active party's shares."""
    _, vd, fed = _federation({"name": "vmask_alls"})
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        fed.train_step(torch.randperm(len(vd.y_train), generator=g)[:64], epoch=0, step=step)
    active_shares = [
        t
        for h in fed.active.defenses[0].shares_.holders.values()
        for t in (h.weight_share, h.bias_share)
        if t is not None
    ]
    assert len(active_shares) == 6
    bottom = fed.passives[0].bottom
    buffer = io.BytesIO()
    torch.save(bottom, buffer)
    buffer.seek(0)
    for model in (copy.deepcopy(bottom), torch.load(buffer, weights_only=False)):
        held = list(_tensors(model))
        assert held
        for secret in active_shares:
            assert not any(t.shape == secret.shape and torch.equal(t, secret) for t in held)
        ids = set(_reachable(model))
        assert not ids & {id(t) for t in active_shares}


def test_vmask_traffic_is_counted_by_the_channel_as_the_old_mpc_comm_counted_it():
    """Every VMask protocol message goes through the channel. With the per-product Beaver protocol these were the
    bytes per direction that mpc.Comm counted when one object held both parties (measured at commit f9660e9 on
    this run: 31307136 bytes to the active party, 35301120 to P_k, all phases; mpc_bytes 61173888). The
    fixed_mask protocol (issue 26) sends 8601856 and 12939904 (mpc_bytes 19191680), the same 123 triples; with
    the dealer's messages, 137.4 MB in 766 messages before and 34.3 MB in 526 messages (263 round trips) after.
    Dealing the next forward's triple ahead leaves one unused per masked layer at each epoch's end (1 + 3 here):
    34.6 MB in 534 messages (267 round trips). Sending each product's operand in 4 row blocks, each answered alone
    (``row_blocks``), keeps the bytes and adds 3 round trips to each of the 126 products: 1290 messages, 645 round
    trips. The training phase's share reaches result.json's comm.by_kind."""
    cfg, vd, fed = _federation({"name": "vmask_as", "budget": 0.0, "mc_epochs": 1}, epochs=2)
    history = fed.fit(epochs=2, batch_size=64, generator=torch.Generator().manual_seed(0), y_test=vd.y_test)
    totals = {"up": 0, "down": 0}
    everything = {"bytes": 0, "messages": 0, "rounds": 0}
    for phase in fed.channel.stats.values():
        for kind, directions in phase.by_kind.items():
            for direction, stats in directions.items():
                if kind in PROTOCOL_KINDS:
                    totals[direction] += stats.bytes
                if kind.startswith(("vmask.", "dealer.")):
                    everything["bytes"] += stats.bytes
                    everything["messages"] += stats.messages
                    everything["rounds"] += stats.rounds
    assert totals == {"up": 8601856, "down": 12939904}  # beaver: 31307136 and 35301120
    assert everything == {"bytes": 34647152, "messages": 1290, "rounds": 645}  # beaver: 137384128 bytes, 766 messages
    # the epoch report is read before the last evaluation; the old report said the same
    assert history.epochs[-1]["vmask_as.mpc_bytes"] == 19191680 < 8601856 + 12939904  # beaver: 61173888
    assert history.epochs[-1]["vmask_as.triples"] == 123
    result = run_experiment(
        build_config(
            minimal(
                data=POOL,
                model={"bottom": "mlp3", "top": "mlp2"},
                train={"epochs": 1},
                defenses=[{"name": "vmask_alls"}],
            )
        )
    )
    by_kind = result.comm["by_kind"]
    for kind in ("vmask.forward", "vmask.backward", "dealer.triple"):
        assert sum(d["bytes"] for d in by_kind[kind].values()) > 0, kind
    assert "dealer.take" not in by_kind  # fixed_mask: the active party takes no triple halves
    assert result.comm["bytes_up"] == sum(d.get("up", {}).get("bytes", 0) for d in by_kind.values())
    assert result.comm["rounds"] == sum(d["rounds"] for v in by_kind.values() for d in v.values()) > 0


NEW_BUFFERS = ("weight_opening", "mask_id", "mask_seed")  # fixed_mask's own state of P_k's masked layers


def _run_with(protocol: str, out_dir) -> tuple[dict, dict[str, torch.Tensor], list[dict]]:  # type: ignore[no-untyped-def]
    """A small VMask run (every layer masked from the second epoch: forward and backward products) with an attack
    that reads every opening: its result, its final models' tensors and its per-epoch metrics."""
    import json
    from pathlib import Path

    cfg = build_config(
        minimal(
            data={**POOL, "aux_pool": 200},
            model={"bottom": "mlp3", "top": "mlp2"},
            train={"epochs": 2},
            defenses=[{"name": "vmask", "aux_size": 200, "budget": 0.0, "mc_epochs": 1, "protocol": protocol}],
            attacks=[{"name": "model_completion", "epochs": 2}, {"name": "vmask_weight_recovery", "epochs": 2}],
        )
    )
    result = run_experiment(cfg, out_dir=out_dir).to_dict()
    run_dir = Path(out_dir) / result["config_hash"]
    weights = {
        f"{path.name}:{key}": t
        for path in sorted(run_dir.glob("checkpoints/*.pt"))
        for key, t in torch.load(path, weights_only=True).items()
        if not key.endswith(NEW_BUFFERS)
    }
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return result, weights, metrics


def test_the_fixed_mask_protocol_gives_the_per_product_protocols_run_bit_for_bit(tmp_path):
    """Issue 26: the default protocol (fixed_mask: P_K's share opened once per masking) and the protocol before it
    (beaver: a fresh triple per product, both operands opened) give the same run to the last bit -- utility,
    attacks (the weight recovery reads every opening), metrics and final weights -- and fixed_mask sends under
    a third of the bytes, its operands in row blocks. On the commits before issue 26 (b135da5, d4cebb2) this run
    gave per-epoch accuracies [0.3194444477558136, 0.39444443583488464] and attacks [0.1944444477558136,
    0.20277777314186096]."""
    fixed, fixed_weights, fixed_metrics = _run_with("fixed_mask", tmp_path / "fixed")
    beaver, beaver_weights, beaver_metrics = _run_with("beaver", tmp_path / "beaver")
    assert fixed["utility"] == beaver["utility"] and fixed["attacks"] == beaver["attacks"]
    assert fixed["baselines"] == beaver["baselines"]
    assert fixed_weights.keys() == beaver_weights.keys() and len(fixed_weights) > 20
    assert all(torch.equal(fixed_weights[k], beaver_weights[k]) for k in fixed_weights)

    def numbers(metrics: list[dict]) -> list[dict]:  # timings and traffic left out
        return [{k: v for k, v in m.items() if "bytes" not in k and k != "seconds"} for m in metrics]

    assert numbers(fixed_metrics) == numbers(beaver_metrics) and len(fixed_metrics) == 2
    assert fixed_metrics[-1]["vmask.triples"] == beaver_metrics[-1]["vmask.triples"] > 0
    sent = {name: r["comm"]["bytes_up"] + r["comm"]["bytes_down"] for name, r in (("fixed", fixed), ("beaver", beaver))}
    assert 3 * sent["fixed"] < sent["beaver"]
    # fixed_mask sends each product's operand in 4 row blocks (row_blocks), beaver whole
    for stage in ("vmask.forward", "vmask.backward"):
        blocks, whole = (r["comm"]["by_kind"][stage]["up"]["messages"] for r in (fixed, beaver))
        assert blocks == 4 * whole > 0, stage


def test_vmask_refuses_the_fixed_mask_protocol_with_secureml_truncation():
    with pytest.raises(ValueError, match="truncation 'secureml' needs protocol 'beaver'"):
        VMask(truncation="secureml", protocol="fixed_mask")
    with pytest.raises(ValueError, match="row_blocks 4 needs the fixed_mask protocol"):
        VMask(truncation="secureml", row_blocks=4)  # secureml's default protocol, beaver, sends operands whole


def test_an_active_half_without_passive_halves_is_refused():
    """Every passive party needs its own VMask half: the active half alone cannot mask P_k's model
    (the old active-only design did it by reaching into P_k's model). Refused by the first epoch's end at the
    latest (with parties in separate processes the halves' setups arrive after the active party is built)."""
    cfg = build_config(minimal(data=POOL, model={"bottom": "mlp3", "top": "mlp2"}, train={"epochs": 1}))
    vd = load_vertical_data(cfg)
    fed = build_federation(cfg, vd, defenses=DefensePlan([VMaskActive(aux_size=200)], {"passive_1": []}))
    with pytest.raises(CompatibilityError, match="its own VMask half"):
        fed.fit(epochs=1, batch_size=64, generator=torch.Generator().manual_seed(0), y_test=vd.y_test)


def test_a_vmask_request_before_its_own_senders_setup_is_refused_by_name():
    """The active half answers a party's protocol requests only after that party's own ``vmask.setup`` (another
    party's set-up may still be on its way across processes, so only the sender's is required)."""
    from vflbench.protocol.messages import Message

    cfg = build_config(minimal(data=POOL, model={"bottom": "mlp3", "top": "mlp2"}, train={"epochs": 1}))
    fed = build_federation(
        cfg, load_vertical_data(cfg), defenses=DefensePlan([VMaskActive(aux_size=200)], {"passive_1": []})
    )
    request = Message("vmask.share", "passive_1", "active", torch.zeros(1), role="request")
    with pytest.raises(CompatibilityError, match="'passive_1' sent 'vmask.share' before its initial parameters"):
        fed.active.defenses[0]._serve(request)


def test_vmask_messages_carry_only_tensors_and_scalars():
    """What the halves exchange can cross a process boundary as bytes: detached tensors and a header
    of scalars, never an object of the other party (issue 16 builds the network transport on this)."""
    cfg = build_config(
        minimal(
            data=POOL,
            model={"bottom": "mlp3", "top": "mlp2"},
            train={"epochs": 2},
            defenses=[{"name": "vmask_as", "aux_size": 200, "budget": 0.0, "mc_epochs": 1}],
        )
    )
    vd = load_vertical_data(cfg)
    kinds = {*PROTOCOL_KINDS, "vmask.setup", "vmask.select", "dealer.triple", "dealer.mask", "dealer.take_mask"}
    fed = build_federation(
        cfg, vd, defenses=plan_defenses(cfg, ["passive_1"]), keep={"active": kinds, "passive_1": kinds}
    )
    fed.fit(epochs=2, batch_size=64, generator=torch.Generator().manual_seed(0), y_test=vd.y_test)
    seen = {m.kind for name in ("active", "passive_1") for m in fed.channel.transcript(name).messages}
    assert {
        "vmask.setup",
        "vmask.share",
        "vmask.forward",
        "vmask.backward",
        "vmask.select",
        "dealer.triple",
        "dealer.mask",
        "dealer.take_mask",
    } <= seen
    for name in ("active", "passive_1"):
        for m in fed.channel.transcript(name).messages:
            assert all(isinstance(t, torch.Tensor) and not t.requires_grad for t in m.tensors), m.kind
            assert all(isinstance(v, (int, float, str, bool, type(None))) for v in m.meta.values()), m.kind
            if m.kind in PROTOCOL_KINDS or m.kind.startswith("dealer."):
                assert all(t.dtype in (torch.int64, torch.float64) for t in m.tensors if t.numel()), m.kind


def test_selection_simulates_only_the_candidates_it_forecasts():
    """Stacked rounds: the first selection simulates the empty set and one layer (the initial mask's
    size); once the loop stopped at the empty set, the next selection simulates only it. Simulating
    every reachable candidate at once (the first stacked version) ran 4 per selection here."""
    cfg = build_config(minimal(data=POOL, model={"bottom": "mlp3", "top": "mlp2"}, train={"epochs": 3}))
    vd = load_vertical_data(cfg)
    defense = _RecordingVMask(aux_size=200, budget=1.0, mc_epochs=1)
    half = VMaskPassive(aux_size=200, budget=1.0, mc_epochs=1)
    fed = build_federation(cfg, vd, defenses=DefensePlan([defense], {"passive_1": [half]}))
    fed.fit(epochs=3, batch_size=64, generator=torch.Generator().manual_seed(0), y_test=vd.y_test)
    epochs = [epoch for epoch, _, _ in defense.calls_]
    assert [epochs.count(e) for e in sorted(set(epochs))] == [2, 1]
    assert all(not masked for masked in defense.parties_["passive_1"].history[1:])


def _completion_values(defenses, seed):
    """Model completion and VMask weight recovery (shared draws) on one trained run."""
    mc = {"prior": "random", "epochs": 25}
    cfg = build_config(
        minimal(
            data={"name": "synthetic", "options": SYNTHETIC, "aux_pool": 300},
            model={"bottom": "mlp3", "top": "mlp2"},
            train={"epochs": 4},
            defenses=defenses,
            seed=seed,
            attacks=[{"name": "model_completion", **mc}, {"name": "vmask_weight_recovery", **mc}],
        )
    )
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    plain, recovery = run_attacks(plan, train_run(cfg, vd, attacks=plan))[0]
    return plain.value, recovery.value


def test_weight_recovery_does_at_least_as_well_as_model_completion_under_vmask():
    """Over seeds 0-2, under VMask-ALLS the recovery attacker's mean accuracy is at least plain model completion's
    (the paper's attacker, whose masked layers are re-initialised), less a 0.01 tolerance. Without VMask the two are
    the same attack (same values), so none of the recovery's gain comes from a better attacker: it takes back what
    VMask took (measured: model completion 0.3700 undefended, 0.2617 under VMask; recovery 0.3567 under VMask, all
    of its 0.0950 gain below the undefended attack)."""
    defended = [_completion_values([{"name": "vmask_alls"}], seed) for seed in (0, 1, 2)]
    undefended = [_completion_values([], seed) for seed in (0, 1, 2)]
    assert all(plain == recovery for plain, recovery in undefended)  # without VMask: the same attack
    plain, recovery = (sum(values) / 3 for values in zip(*defended, strict=True))
    plain_undefended = sum(p for p, _ in undefended) / 3
    assert plain_undefended - plain > 0.05  # VMask protects against the paper's attacker here
    assert recovery >= plain - 0.01  # the adaptive attacker does at least as well under VMask
    assert recovery > plain + 0.03 and recovery <= plain_undefended + 0.03  # it takes VMask's protection back


@pytest.mark.parametrize("name", ["vmask", "vmask_as", "vmask_rs", "vmask_alls"])
def test_each_party_builds_only_its_roles_half_under_the_one_registered_name(name):
    """Per-role halves (issue 29): one registered name and parameter set; the active party's process builds the
    active half, each passive party's the passive half, the dealer its own; each half carries the variant's name and
    parameters and none of the other roles' code."""
    from vflbench.defenses import DEFENSES
    from vflbench.defenses.vmask import VMaskDealer

    cfg = build_config(minimal(data=POOL, model={"bottom": "mlp3", "top": "mlp2"}, defenses=[{"name": name}]))
    spec = DEFENSES.get(name).factory
    plan = plan_defenses(cfg, ["passive_1", "passive_2"])
    (active,) = plan.active
    passives = [d for ds in plan.passive.values() for d in ds]
    assert isinstance(active, VMaskActive) and isinstance(active, spec) and active.name == name
    assert all(isinstance(p, VMaskPassive) and isinstance(p, spec) and p.name == name for p in passives)
    assert not any(isinstance(p, VMaskActive) for p in passives) and not isinstance(active, VMaskPassive)
    assert active.get_params() == passives[0].get_params() == spec().get_params()
    assert not hasattr(VMaskPassive, "_shadow_update") and not hasattr(VMaskActive, "_apply_mask")
    assert isinstance(active.for_role("dealer"), VMaskDealer)
    only_passive = plan_defenses(cfg, ["passive_1"], active=False)
    assert only_passive.active == [] and isinstance(only_passive.passive["passive_1"][0], VMaskPassive)


def test_a_defense_without_halves_runs_itself_at_every_role_and_an_unknown_role_is_refused():
    from vflbench.defenses import create_defense

    dcor = create_defense("dcor")
    assert dcor.for_role("active") is dcor and dcor.for_role("passive") is dcor
    with pytest.raises(ValueError, match="no half for the role 'auditor'; its roles: active, passive, dealer"):
        VMask().for_role("auditor")
