"""Label defenses: neutral values, label DP statistics, KDk/CoAE soft labels, MixUp lock-step."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import minimal

from vflbench.defenses import DEFENSES, create_defense
from vflbench.defenses.labels import (
    MixUp,
    MixUpBottom,
    kdk_soft_labels,
    predict,
    rr_keep_probability,
    rr_with_prior,
)
from vflbench.errors import ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.run import run_experiment
from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.protocol import ACTIVE, BindContext
from vflbench.protocol.objective import default_objective, soft_cross_entropy
from vflbench.rng import generator

NAMES = ("label_dp", "kdk", "coae", "mixup")


def _bind(defense, num_classes, party=ACTIVE, seed=0):
    defense.bind(
        BindContext(party, "vhnn", num_classes, 2, generator(seed, "t", "private"), generator(seed, "t", "shared"))
    )
    return defense


def _labels(counts, seed=0):
    y = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)])
    return y[torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))]


def test_label_defenses_are_registered_with_their_threat_model():
    for name in NAMES:
        cls = DEFENSES.get(name).factory
        assert cls.name == name and cls.paper and cls.threat and cls.strength_param
    assert create_defense("label_dp", strength=0.5).epsilon == 0.5
    assert create_defense("mixup", strength=3).n_mix == 3
    assert DEFENSES.get("label_dp").factory.strength_direction == "smaller is stronger"
    with pytest.raises(ConfigError, match="'epsilon' = -1 is not valid; it must be >= 0"):
        create_defense("label_dp", epsilon=-1)
    mixed = _bind(create_defense("mixup"), 10).transform_labels(
        default_objective(torch.arange(10), 10, single_logit=False)
    )
    with pytest.raises(ConfigError, match="list 'mixup' after it"):
        _bind(create_defense("kdk"), 10).transform_labels(mixed)


@pytest.mark.parametrize(
    "spec", [{"name": "label_dp", "epsilon": math.inf}, {"name": "mixup", "n_mix": 1}, {"name": "kdk", "epsilon": 0.0}]
)
def test_neutral_value_is_the_identity(spec):
    train = {"epochs": 2}
    plain = run_experiment(build_config(minimal(train=train)))
    defended = run_experiment(build_config(minimal(train=train, defenses=[spec])))
    assert defended.utility.per_epoch == plain.utility.per_epoch


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("prior", ["empirical", "uniform"])
def test_label_dp_keeps_labels_at_the_randomised_response_rate(epsilon, prior):
    c, y = 10, _labels([2000] * 10)
    ldp = _bind(create_defense("label_dp", epsilon=epsilon, prior=prior), c)
    noisy = ldp.transform_labels(default_objective(y, c, single_logit=False)).targets
    keep = math.exp(epsilon) / (math.exp(epsilon) + c - 1)  # balanced prior: k* = C, plain RR
    assert rr_keep_probability(torch.full((c,), 0.1), epsilon) == (c, pytest.approx(keep))
    sd = math.sqrt(keep * (1 - keep) / len(y))
    assert abs(float((noisy == y).double().mean()) - keep) < 5 * sd
    # flipped labels are spread evenly over the other classes
    flipped = noisy[noisy != y]
    share = torch.bincount((flipped - y[noisy != y]) % c, minlength=c)[1:].double() / len(flipped)
    assert share.sub(1 / (c - 1)).abs().max() < 0.02
    assert ldp.on_epoch_end(0)["flipped"] == pytest.approx(1 - float((noisy == y).double().mean()))


def test_rr_with_prior_keeps_only_the_best_top_k():
    y = _labels([14000, 4000, 2000])
    prior = torch.tensor([0.7, 0.2, 0.1])
    # eps = 2: w = (0.7, 0.9/(1+e^-2), 1/(1+2e^-2)) -> k* = 2; class 2 is never output
    k, keep = rr_keep_probability(prior, 2.0)
    assert (k, keep) == (2, pytest.approx(1 / (1 + math.exp(-2))))
    noisy = rr_with_prior(y, prior, 2.0, torch.Generator().manual_seed(1))
    assert not (noisy == 2).any()
    assert abs(float((noisy[y == 0] == 0).double().mean()) - keep) < 0.015
    assert abs(float((noisy[y == 2] == 0).double().mean()) - 0.5) < 0.04  # outside the set: uniform on it
    # eps = 0.5: the majority class alone maximises the expected correctness
    assert rr_keep_probability(prior, 0.5)[0] == 1
    assert (rr_with_prior(y, prior, 0.5, torch.Generator().manual_seed(1)) == 0).all()


def test_kdk_soft_labels_sum_to_one_on_k_classes_ranked_by_the_teacher():
    cfg = build_config(minimal(defenses=[{"name": "kdk", "epsilon": 0.45, "k": 3, "teacher_lr": 1e-3}]))
    vd = load_vertical_data(cfg)
    fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1"]))
    [kdk] = fed.active.defenses
    soft, y = fed.active.objective.targets, vd.y_train
    assert soft.shape == (len(y), 10) and fed.active.objective.out_dim == 10
    torch.testing.assert_close(soft.sum(1), torch.ones(len(y), device=soft.device))
    assert ((soft > 0).sum(1) == 3).all()
    torch.testing.assert_close(soft[torch.arange(len(y)), y], torch.full((len(y),), 0.55, device=soft.device))
    assert soft.unique().tolist() == pytest.approx([0.0, 0.225, 0.55])
    # the teacher was trained on the active party's own slice and chose the other classes
    assert kdk.teacher_ is not None and kdk.teacher_accuracy_ > 0.8
    ranked = kdk_soft_labels(predict(kdk.teacher_, fed.active.data.x_train), y, 0.45, 3)
    torch.testing.assert_close(soft, ranked)
    assert fed.active.end_epoch(0)["kdk.teacher_accuracy"] == kdk.teacher_accuracy_


def test_kdk_rows_sum_to_one_even_when_the_teacher_ranks_the_true_class_last():
    y = torch.tensor([0, 1, 2])
    scores = torch.tensor([[0.0, 3, 2, 1], [3.0, 0, 2, 1], [3.0, 2, 0, 1]])
    soft = kdk_soft_labels(scores, y, 0.4, 3)
    torch.testing.assert_close(soft, torch.tensor([[0.6, 0.2, 0.2, 0], [0.2, 0.6, 0.2, 0], [0.2, 0.2, 0.6, 0]]))


def test_kdk_without_features_uses_random_other_classes_and_checks_k():
    c, y = 10, _labels([100] * 10)
    kdk = _bind(create_defense("kdk", k=4, epsilon=0.3), c)
    soft = kdk.transform_labels(default_objective(y, c, single_logit=False)).targets
    assert ((soft > 0).sum(1) == 4).all() and torch.allclose(soft.sum(1), torch.ones(len(y)))
    assert len({tuple(r.nonzero().flatten().tolist()) for r in soft[y == 0]}) > 10  # not one fixed set
    with pytest.raises(ConfigError, match="k=3 exceeds the number of classes"):
        _bind(create_defense("kdk"), 2).transform_labels(default_objective(y % 2, 2, single_logit=False))


@pytest.fixture(scope="module")
def coae_objective():
    y = _labels([50] * 10)
    coae = _bind(create_defense("coae", epochs=4, samples=6000), 10)
    return coae, y, coae.transform_labels(default_objective(y, 10, single_logit=False))


@pytest.mark.slow
def test_coae_decodes_its_own_confusing_codes(coae_objective):
    coae, y, obj = coae_objective
    codes = coae.codes_
    assert obj.out_dim == 10 and obj.targets.dtype == torch.float32
    torch.testing.assert_close(obj.targets, codes[y])
    torch.testing.assert_close(codes.sum(1), torch.ones(10))
    # outputs whose softmax is a class's code decode back to that class
    assert (obj.decode(codes.log()) == torch.arange(10)).double().mean() >= 0.9
    assert (obj.decode(codes[y].log()) == y).double().mean() >= 0.9
    assert torch.allclose(obj.scores(codes.log()).sum(1), torch.ones(10))
    # ... while the codes themselves point at other classes
    assert (codes.argmax(1) != torch.arange(10)).double().mean() >= 0.5
    assert coae.on_epoch_end(0) == {
        "decode_accuracy": coae.decode_accuracy_,
        "confused_classes": coae.confused_classes_,
    }


def _mixup_federation(algorithm, n_mix=3, parties=3):
    cfg = build_config(
        minimal(
            data={"parties": parties},
            train={"algorithm": algorithm},
            defenses=[{"name": "mixup", "n_mix": n_mix, "alpha": 0.5}],
        )
    )
    vd = load_vertical_data(cfg)
    names = [f"passive_{i + 1}" for i in range(len(vd.passive))]
    return build_federation(cfg, vd, defenses=plan_defenses(cfg, names)), vd


@pytest.mark.parametrize("algorithm", ["vhnn", "vsnn"])
def test_mixup_parties_mix_with_the_same_draw_in_every_step(algorithm):
    fed, vd = _mixup_federation(algorithm)
    instances = [fed.active.defenses[0], *(p.defenses[0] for p in fed.passives)]
    assert all(isinstance(d, MixUp) for d in instances) and len({id(d) for d in instances}) == len(instances)
    assert all(isinstance(p.bottom, MixUpBottom) for p in fed.passives)
    assert isinstance(fed.active.bottom, MixUpBottom) == (algorithm == "vhnn")
    order = torch.randperm(len(fed.active.objective.targets), generator=torch.Generator().manual_seed(0))
    for step, size in enumerate([64, 64, 37]):
        fed.train_step(order[step * 64 : step * 64 + size], epoch=0, step=step)
        draws = [d.last_draw_ for d in instances]
        assert all(d.draws_ == step + 1 for d in instances)
        assert len(draws[0].perms) == 3 and len(draws[0].perms[1]) == size
        assert draws[0].weights.sum().item() == pytest.approx(1.0)
        for other in draws[1:]:
            assert other.index == draws[0].index
            torch.testing.assert_close(other.weights, draws[0].weights, rtol=0, atol=0)
            for a, b in zip(other.perms, draws[0].perms, strict=True):
                assert torch.equal(a, b)
        assert instances[0]._pending is None
    # evaluation and the attacker's private copies never mix, nor draw
    fed.evaluate(vd.y_test)
    copied = copy.deepcopy(fed.passives[0].bottom).train()
    assert copied.defense is None
    x = fed.passives[0].data.x_train[:8]
    torch.testing.assert_close(copied(x), fed.passives[0].bottom.eval()(x))
    assert all(d.draws_ == 3 for d in instances)
    with pytest.raises(ConfigError, match="cannot be mixed"):
        _bind(MixUp(), 10, party="passive_1").wrap_bottom(torch.nn.Embedding(5, 2), "passive_1")


def test_mixup_mixes_inputs_and_the_loss_with_the_step_draw():
    fed, _ = _mixup_federation("vhnn", n_mix=2, parties=2)
    passive, active = fed.passives[0], fed.active
    x = passive.data.x_train[:16]
    inner = passive.bottom.inner
    out = passive.bottom.train()(x)
    draw = passive.defenses[0].last_draw_
    torch.testing.assert_close(out, inner(draw.weights[0].float() * x + draw.weights[1].float() * x[draw.perms[1]]))
    # the active loss with a pending draw equals soft cross-entropy on mixed one-hot targets
    d = active.defenses[0]
    pending = d.bottom_draw(16)
    y = active.objective.targets[:16]
    logits = torch.randn(16, 10, generator=torch.Generator().manual_seed(0)).to(y.device)  # where the model's are
    onehot = torch.nn.functional.one_hot(y, 10).double()
    mixed = (pending.weights[0] * onehot + pending.weights[1] * onehot[pending.perms[1]]).float()
    torch.testing.assert_close(active.objective.loss(logits, y), soft_cross_entropy(logits, mixed))
    assert d._pending is None
    # outside a training step (no pending draw) the loss is plain and draws nothing
    torch.testing.assert_close(active.objective.loss(logits, y), soft_cross_entropy(logits, y))
    assert d.draws_ == 1


def test_training_with_mixup_still_learns_digits():
    result = run_experiment(build_config(minimal(defenses=[{"name": "mixup", "n_mix": 3}])))
    assert result.utility.value > 0.6


@pytest.mark.slow
def test_label_dp_at_small_epsilon_reduces_model_completion():
    def mc(defenses):
        cfg = build_config(
            minimal(train={"epochs": 10}, defenses=defenses, attacks=[{"name": "model_completion", "prior": "random"}])
        )
        result = run_experiment(cfg)
        return result.attacks[0].value, result.utility.value

    vanilla, vanilla_utility = mc([])
    defended, defended_utility = mc([{"name": "label_dp", "epsilon": 0.5}])
    assert vanilla > 0.55
    assert defended < vanilla - 0.05
    assert defended_utility < vanilla_utility  # 85% of the labels are randomised: the task suffers too
