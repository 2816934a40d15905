"""Label attacks: they beat chance without defense, and they see only the attacker's view."""

from __future__ import annotations

import pytest
import torch
from conftest import minimal
from torch import nn

from vflbench.attacks import ATTACKS, create_attack
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.plan import validate_attacks
from vflbench.experiment.run import run_experiment, train_run
from vflbench.experiment.scenario import load_vertical_data
from vflbench.experiment.views import _view


def _vlr(attacks, **train):
    return build_config(
        minimal(
            data={"name": "breast_cancer"},
            model={"bottom": "logreg", "top": "identity"},
            train={"algorithm": "vlr", "batch_size": 32, **train},
            attacks=attacks,
        )
    )


def test_model_completion_beats_its_scratch_prior_on_digits():
    cfg = build_config(minimal(train={"epochs": 10}, attacks=[{"name": "model_completion", "prior": "scratch"}]))
    [mc] = run_experiment(cfg).attacks
    assert mc.metric == "accuracy" and mc.prior_name == "scratch"
    assert mc.value > mc.prior + 0.05
    assert mc.value > 0.1 + 0.2  # far above a random 10-class guess


def test_model_completion_in_vlr_needs_no_training_and_beats_local_prior():
    [mc] = run_experiment(_vlr([{"name": "model_completion", "prior": "local"}])).attacks
    assert mc.metric == "auc" and mc.details["trained"] is False
    assert mc.value > 0.9 and mc.value > mc.prior


def test_norm_and_direction_scoring_on_breast_cancer():
    cfg = build_config(
        minimal(
            data={"name": "breast_cancer"},
            train={"batch_size": 32},
            attacks=[{"name": "norm_scoring", "epochs": [0]}, {"name": "direction_scoring", "epochs": [0]}],
        )
    )
    ns, ds = run_experiment(cfg).attacks
    assert ns.value >= 0.75 and ds.value >= 0.75
    assert ns.details["batches_scored"] > 5
    assert ns.leakage == pytest.approx(100 * (ns.value - 0.5))


def test_the_same_attack_twice_keeps_both_timings():
    cfg = build_config(
        minimal(
            data={"name": "breast_cancer"},
            train={"epochs": 1, "batch_size": 32},
            attacks=[{"name": "norm_scoring", "epochs": [0]}, {"name": "norm_scoring"}],
        )
    )
    result = run_experiment(cfg)
    assert len(result.attacks) == 2 and set(result.timing.attack_seconds) == {"norm_scoring", "norm_scoring#2"}


@pytest.mark.parametrize("name", ["direct_label_inference", "residue_reconstruction", "gradient_inversion"])
def test_vlr_gradient_attacks_beat_chance(name):
    [attack] = run_experiment(_vlr([{"name": name}])).attacks
    assert attack.prior == 0.5
    assert attack.value > 0.6


def test_direct_label_inference_is_exact_without_defense():
    [dl] = run_experiment(_vlr([{"name": "direct_label_inference"}])).attacks
    assert dl.value == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (minimal(attacks=[{"name": "norm_scoring"}]), "needs binary labels, but the task has 10 classes"),
        (minimal(data={"name": "breast_cancer"}, attacks=[{"name": "residue_reconstruction"}]), "needs VLR"),
        (
            minimal(data={"name": "breast_cancer"}, attacks=[{"name": "direct_label_inference"}]),
            "model.top: identity with train.aggregation: sum",
        ),
    ],
)
def test_incompatible_attacks_fail_before_training(config, message):
    cfg = build_config(config)
    with pytest.raises(CompatibilityError, match=message):
        validate_attacks(cfg, load_vertical_data(cfg))


def _tensors(obj, seen=None):
    """Every tensor reachable from ``obj`` through attributes, containers and modules."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, seen)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            yield from _tensors(v, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type) and not isinstance(obj, torch.Generator):
        yield from _tensors(vars(obj), seen)


def _assert_holds_none_of(reachable, forbidden):
    """No tensor of ``reachable`` shares storage with, or has the values of, a tensor of ``forbidden``. Values are
    compared on the CPU: a run's tensors live on its device (``train.device``), a view's row ids on the CPU."""
    on_cpu = [f.cpu() for f in forbidden]
    for t in reachable:
        for f, f_cpu in zip(forbidden, on_cpu, strict=True):
            same_storage = t.device == f.device and t.untyped_storage().data_ptr() == f.untyped_storage().data_ptr()
            assert not same_storage and not (t.shape == f.shape and torch.equal(t.cpu(), f_cpu))


def test_attacker_view_carries_no_other_party_state():
    cfg = build_config(
        minimal(
            data={"name": "breast_cancer"},
            train={"epochs": 1},
            attacks=[{"name": "norm_scoring"}, {"name": "model_completion", "epochs": 1}],
        )
    )
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    run = train_run(cfg, vd, attacks=plan)
    active = run.federation.active
    forbidden = [
        vd.y_train,
        vd.y_test,
        vd.active.x_train,
        vd.active.x_test,
        *active.top.parameters(),
        *active.bottom.parameters(),
    ]
    for planned in plan.attacks:
        view = _view(run, planned)
        assert set(view.models) == {"bottom"}
        assert all(m.receiver == "passive_1" or m.sender == "passive_1" for m in view.transcript.messages)
        reachable = list(_tensors(view))
        assert reachable, "the walk must find the view's own tensors"
        _assert_holds_none_of(reachable, forbidden)
        if view.known is not None:
            assert len(view.known.ids) == 2 * planned.attack.known_per_class


def test_every_registered_attack_declares_its_threat_model():
    for entry in ATTACKS:
        cls = entry.factory
        assert cls.name == entry.name and cls.paper and cls.threat and cls.reads
        assert cls.target in ("labels", "features") and cls.phase in ("observer", "post_training", "malicious")


# ------------------------------------------------------------------- the label attacks' metric option


def _binary_mc(**params):
    return build_config(
        minimal(
            data={"name": "breast_cancer"},
            train={"epochs": 3, "batch_size": 32},
            attacks=[{"name": "model_completion", "known_per_class": 8, "epochs": 3, **params}],
        )
    )


@pytest.mark.parametrize("prior", ["random", "local"])
def test_metric_accuracy_scores_a_binary_attack_and_its_prior_by_top1_accuracy(prior):
    # Old behaviour: binary label attacks were always scored by AUC (and `metric` was an unknown key).
    [auto] = run_experiment(_binary_mc(prior=prior)).attacks
    cfg = _binary_mc(prior=prior, metric="accuracy")
    [acc] = run_experiment(cfg).attacks
    assert auto.metric == "auc" and acc.metric == "accuracy"
    curve = acc.details["finetune_curve"]  # per-epoch top-1 accuracies on the test split, the last one reported
    assert acc.value == curve[-1] and acc.details["test_accuracy"] == acc.value
    y_test = load_vertical_data(cfg).y_test
    n_test = len(y_test)
    assert all(abs(v * n_test - round(v * n_test)) < 1e-4 for v in curve)  # fractions of test rows, not AUCs
    majority = float(torch.bincount(y_test).max()) / n_test  # what always answering the larger class scores
    assert acc.details["constant_guess"] == pytest.approx(majority)
    if prior == "random":
        assert acc.prior == pytest.approx(majority)  # not 1/C = 0.5: a constant guess scores the majority rate
    else:  # J_loc scored under the same metric as the attack, and never below the constant guess
        assert "test_accuracy" in acc.details["local"] and "test_auc" not in acc.details["local"]
        assert acc.prior == pytest.approx(max(acc.details["local"]["finetune_curve"][-1], majority))
    assert acc.leakage == pytest.approx(100 * (acc.value - acc.prior))


def test_metric_auc_can_be_asked_for_explicitly_and_equals_auto_on_a_binary_task():
    [auto] = run_experiment(_binary_mc()).attacks
    [auc] = run_experiment(_binary_mc(metric="auc")).attacks
    assert auc.metric == "auc" and auc.value == auto.value and auc.prior == auto.prior


@pytest.mark.parametrize("name", ["model_completion", "model_completion_mixmatch", "embedding_extension"])
def test_metric_is_validated(name):
    with pytest.raises(
        ConfigError,
        match="parameter 'metric' = 'top1' is not valid; expected one of 'auto', "
        "'accuracy', 'balanced_accuracy', 'auc'",
    ):
        create_attack(name, metric="top1")
    cfg = build_config(minimal(attacks=[{"name": name, "metric": "auc", "batch_size": 4}]))  # digits: 10 classes
    with pytest.raises(CompatibilityError, match="metric 'auc' needs binary labels"):
        validate_attacks(cfg, load_vertical_data(cfg))
