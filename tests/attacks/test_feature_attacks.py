"""Feature attacks by a malicious active party (DMAVFL, DMAVFL_sync, AGN, FSHA), their scoring and SSIM.

Runs on scikit-learn's digits (8x8 images, left/right 8x4 strips) with small settings: 300 aux
rows, a few epochs, Adam 3e-3 for the victim and 1e-3 for the attacker (the papers' 1e-4 needs far
more steps).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
from conftest import minimal
from test_label_attacks import _assert_holds_none_of, _tensors

from vflbench.attacks import ATTACKS
from vflbench.attacks.base import FeatureInference
from vflbench.attacks.feature.common import takeover_by
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.plan import aux_data, validate_attacks
from vflbench.experiment.run import run_experiment, train_run
from vflbench.experiment.scenario import build_federation, load_vertical_data
from vflbench.experiment.scoring import run_attacks
from vflbench.experiment.views import _view, feature_targets
from vflbench.metrics.reconstruction import cosine_distance, gaussian_window, ssim

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
TRAIN = {"epochs": 6, "batch_size": 32, "optimizer": "adam", "lr": 3e-3}
SMALL = {"aux_batch_size": 32, "lr": 1e-3, "disc_lr": 3e-4}
DATA = {"name": "digits", "parties": 2, "aux_pool": 300}  # the aux rows: 300 held out of training


def _cfg(attack: dict, train: dict | None = None, defenses: list | None = None):
    return build_config(minimal(data=DATA, train={**TRAIN, **(train or {})}, attacks=[attack], defenses=defenses or []))


@pytest.fixture(scope="module")
def dmavfl_and_agn():
    """One DMAVFL run and one AGN run with the same VFL settings (8 epochs: the 300 aux rows are held out of
    training, so 1,137 training rows give 288 steps of batch 32, about the 270 that 6 epochs gave when
    they were trained on too; with 216 steps DMAVFL's error is still above the aux-mean guess)."""
    out = {}
    for name, extra in (("dmavfl", {"pretrain_epochs": 20}), ("agn", {})):
        cfg = _cfg({"name": name, **SMALL, **extra}, {"epochs": 8})
        vd = load_vertical_data(cfg)
        plan = validate_attacks(cfg, vd)
        run = train_run(cfg, vd, attacks=plan)
        [result], _ = run_attacks(plan, run)
        out[name] = (result, run)
    return out


@pytest.mark.slow
def test_dmavfl_reconstructs_better_than_agn(dmavfl_and_agn):
    dm, _ = dmavfl_and_agn["dmavfl"]
    agn, _ = dmavfl_and_agn["agn"]
    assert dm.metric == agn.metric == "mse" and dm.target == "features"
    assert dm.value < agn.value
    assert dm.value < 0.9 * dm.prior  # beats guessing the aux mean
    assert dm.direction == "lower" and dm.leakage == pytest.approx(100 * (1 - dm.value / dm.prior))
    assert dm.prior_name == "aux_mean"
    assert 0.0 < dm.details["ssim"] <= 1.0 and dm.details["ssim"] > agn.details["ssim"]
    assert dm.details["ssim_leakage"] == pytest.approx(100 * (dm.details["ssim"] - dm.details["prior_ssim"]))
    assert {"emb_mse", "emb_cos"} <= set(dm.details) and "emb_mse" not in agn.details  # AGN has no shadow
    assert dm.details["n_targets"] == 360 and dm.details["split"] == "test"


@pytest.mark.slow
def test_malicious_active_party_never_trains_its_top_model(dmavfl_and_agn):
    for name in ("dmavfl", "agn"):
        _, run = dmavfl_and_agn[name]
        active = run.federation.active
        assert takeover_by(active) == name
        assert "decoder" in active.models() and "discriminator" in active.models()
        fresh = build_config(minimal(data=DATA, train=TRAIN))
        vd = load_vertical_data(fresh)
        honest_top = build_federation(fresh, vd).active.top
        for p, q in zip(active.top.parameters(), honest_top.parameters(), strict=True):
            assert torch.equal(p, q)  # the top model is never stepped


def test_dmavfl_utility_comes_from_its_discriminator(dmavfl_and_agn):
    _, run = dmavfl_and_agn["dmavfl"]
    acc = run.history.epochs[-1]["test_accuracy"]
    assert acc > 0.2  # the DAC classifies (10 classes; chance 0.1)


@pytest.mark.parametrize("name", ["dmavfl_sync", "fsha"])
def test_other_malicious_attacks_run_and_report(name):
    params = {**SMALL, **({"lr": 1e-3} if name == "fsha" else {})}
    result = run_experiment(_cfg({"name": name, **params}, {"epochs": 2}))
    [a] = result.attacks
    assert a.metric == "mse" and math.isfinite(a.value) and a.value >= 0
    assert a.prior > 0 and "emb_cos" in a.details and "ssim" in a.details
    assert result.data["n_held_out"] == 300  # the aux rows were not trained on


# Pure Algorithm 3 (no pretraining) on digits, 15 epochs. With the test's SMALL settings the shadow/decoder
# trained alongside reach 0.70-0.75 of the aux-mean guess's MSE (seeds 0-2); with the attack's defaults
# (aux 1/11 = 131 rows, Adam 1e-4, aux batch 128) 0.83, 0.74, 0.81, 0.93 (seeds 0-3). With 2-4 epochs
# both are still worse than the guess (the decoder has had only ~100-150 steps).
@pytest.mark.slow
@pytest.mark.parametrize(("params", "bound"), [(SMALL, 0.85), ({}, 1.0)], ids=["small", "defaults"])
def test_dmavfl_sync_reconstructs_better_than_its_aux_mean_prior(params, bound):
    cfg = _cfg({"name": "dmavfl_sync", **params}, {"epochs": 15})
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    run = train_run(cfg, vd, attacks=plan)
    [result], _ = run_attacks(plan, run)
    attack = plan.attacks[0].attack
    assert attack.pretrain_epochs == 0 and attack.pretrain_losses_ == []
    assert result.value < bound * result.prior
    assert result.details["emb_cos"] < 0.5  # the victim's bottom was pulled towards the shadow


def test_dmavfl_aux_rows_are_held_out_of_every_partys_training():
    cfg = _cfg({"name": "dmavfl", **SMALL, "pretrain_epochs": 1}, {"epochs": 2})
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    plan.keep.setdefault("passive_1", set()).add("embedding")  # observe the training batches' ids
    run = train_run(cfg, vd, attacks=plan)
    aux = plan.attacks[0].aux.ids
    assert len(aux) == 300 and torch.equal(plan.held_out(), aux)
    sent = run.federation.passives[0].transcript.of_kind("embedding")
    for epoch in (0, 1):
        ids = torch.cat([m.ids for m in sent if m.epoch == epoch])
        assert len(ids) == len(vd.y_train) - 300 and len(ids.unique()) == len(ids)  # every other row, once
        assert not torch.isin(ids, aux).any()
    # the active party trains on exactly the batches the passive parties embed
    assert run.federation.train_rows is not None and len(run.federation.train_rows) == len(vd.y_train) - 300


def test_held_out_rows_follow_the_data_section_and_the_seed_only():
    attack = {"name": "dmavfl", **SMALL}
    vd = load_vertical_data(_cfg(attack))
    held = validate_attacks(_cfg(attack), vd).held_out()
    assert len(held) == 300
    # a defense, another attack, or no attack at all: the same rows (one scenario per seed)
    defended = validate_attacks(_cfg(attack, defenses=[{"name": "embedding_noise", "sigma": 0.1}]), vd).held_out()
    assert torch.equal(held, defended)
    assert torch.equal(held, validate_attacks(_cfg({"name": "gia", "aux_size": 300}), vd).held_out())
    assert torch.equal(held, validate_attacks(build_config(minimal(data=DATA, train=TRAIN)), vd).held_out())
    other_seed = build_config({**minimal(data=DATA, train=TRAIN, attacks=[attack]), "seed": 1})
    assert not torch.equal(held, validate_attacks(other_seed, vd).held_out())
    # GIA's aux rows are trained on (it inserts them), so they are drawn from the rows the parties train on
    gia = validate_attacks(_cfg({"name": "gia", "aux_size": 300}), vd).attacks[0].attack
    assert not torch.isin(aux_data(gia, vd, None, 0, held).ids, held).any()
    assert all(ATTACKS.get(n).factory.aux_disjoint for n in ("dmavfl", "dmavfl_sync", "agn", "fsha", "sdar", "pcat"))
    with pytest.raises(ConfigError, match="holds 300"):
        validate_attacks(_cfg({"name": "dmavfl", "aux_fraction": 0.5}, {"epochs": 25}), vd)  # default recipe: 25


def test_dmavfl_sync_refuses_pretraining_unless_a_hybrid_is_asked_for():
    cfg = _cfg({"name": "dmavfl_sync", **SMALL, "pretrain_epochs": 20})
    vd = load_vertical_data(cfg)
    with pytest.raises(ConfigError, match="has no pretraining.*hybrid: true"):
        validate_attacks(cfg, vd)
    hybrid = validate_attacks(_cfg({"name": "dmavfl_sync", **SMALL, "pretrain_epochs": 20, "hybrid": True}), vd)
    assert hybrid.attacks[0].attack.pretrain_epochs == 20


def test_reproduction_builds_pure_algorithm_3_sync_rows(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports its sibling swap.py, as when run
    spec = importlib.util.spec_from_file_location("reproduce_dmavfl", BENCHMARKS / "reproduce_dmavfl.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    rows = [exp for exp in module.EXPERIMENTS.values() if exp.attack == "dmavfl_sync"]
    assert {exp.config for exp in rows} == {
        "dmavfl_mnist",
        "dmavfl_credit",
        "dmavfl_mnist_paper",
        "dmavfl_credit_paper",
        "dmavfl_mnist_convmap",
        "dmavfl_mnist_paper_convmap",
    }
    for exp in rows:
        [attack] = module.build(exp).attacks
        assert attack.params().get("pretrain_epochs", 0) == 0 and not attack.params().get("hybrid", False)
    for exp in (module.EXPERIMENTS["mnist_dmavfl"], module.EXPERIMENTS["credit_dmavfl"]):
        assert module.build(exp).attacks[0].params()["pretrain_epochs"] > 0  # Algorithm 1 stays for DMAVFL


def test_dmavfl_refuses_a_single_logit_objective_before_training():
    cfg = build_config(
        minimal(
            data={"name": "breast_cancer", "parties": 2, "aux_pool": 100},
            train={"algorithm": "vlr"},
            model={"bottom": "logreg", "top": "identity"},
            attacks=[{"name": "dmavfl", **SMALL}],
        )
    )
    with pytest.raises(CompatibilityError, match="one logit"):
        validate_attacks(cfg, load_vertical_data(cfg))


def test_feature_attacker_view_carries_no_victim_state():
    cfg = _cfg({"name": "dmavfl", **SMALL, "pretrain_epochs": 1}, {"epochs": 1})
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    run = train_run(cfg, vd, attacks=plan)
    victim = run.federation.passives[0]
    forbidden = [vd.y_train, vd.y_test, vd.passive[0].x_train, vd.passive[0].x_test, *victim.bottom.parameters()]
    [planned] = plan.attacks
    view = _view(run, planned)
    assert view.party == "active"
    assert {"bottom", "top", "shadow", "decoder", "discriminator"} == set(view.models)
    assert all("active" in (m.sender, m.receiver) for m in view.transcript.messages)
    assert [r.sender for r in view.received] == ["passive_1"] and len(view.received[0].ids) == len(vd.y_test)
    assert view.aux is not None and len(view.aux.ids) == 300 and view.aux.victim_party == "passive_1"
    reachable = list(_tensors(view))
    assert reachable
    _assert_holds_none_of(reachable, forbidden)
    # what it may hold: its own slice, aux rows of the victim's slice, the victim's messages
    assert torch.equal(view.aux.victim, vd.passive[0].x_train[view.aux.ids])
    inference = planned.attack.infer(view)
    assert isinstance(inference, FeatureInference) and inference.features.shape == vd.passive[0].x_test.shape


def test_aux_rows_are_disjoint_from_train_targets_and_can_leave_classes_out():
    cfg = _cfg({"name": "dmavfl", **SMALL, "aux_classes": [0, 1, 2], "target_split": "train", "n_targets": 200})
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    attack = plan.attacks[0].attack
    aux = aux_data(attack, vd, vd.active.x_train, cfg.seed, plan.pool)
    assert set(aux.labels.tolist()) <= {0, 1, 2} and aux.classes == (0, 1, 2)
    assert torch.isin(aux.ids, plan.pool).all()  # the pool's rows of those classes
    ids, split = feature_targets(attack, vd, aux, cfg.seed, plan.pool)
    assert split == "train" and len(ids) == 200
    assert not set(ids.tolist()) & set(plan.pool.tolist())  # targets are rows the parties trained on
    again = aux_data(attack, vd, vd.active.x_train, cfg.seed, plan.pool)
    assert torch.equal(aux.ids, again.ids)  # seeded


def test_aux_size_takes_precedence_over_fraction():
    cfg = _cfg({"name": "agn", "aux_size": 50, "aux_fraction": 0.5})
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    assert len(aux_data(plan.attacks[0].attack, vd, None, 0, plan.pool).ids) == 50


@pytest.mark.parametrize(
    ("attack", "error", "message"),
    [
        ({"name": "dmavfl", "victim": "passive_2"}, ConfigError, "victim 'passive_2' must be a passive party"),
        ({"name": "dmavfl", "prior": "scratch"}, ConfigError, "no parameter 'prior'"),
    ],
)
def test_bad_feature_attack_configs_fail_before_training(attack, error, message):
    cfg = _cfg(attack)
    with pytest.raises(error, match=message):
        validate_attacks(cfg, load_vertical_data(cfg))


def test_two_malicious_active_attacks_are_refused_before_training():
    cfg = build_config(minimal(data=DATA, train=TRAIN, attacks=[{"name": "agn", **SMALL}, {"name": "fsha", **SMALL}]))
    vd = load_vertical_data(cfg)
    with pytest.raises(CompatibilityError, match="already run by malicious attack 'agn'"):
        train_run(cfg, vd, attacks=validate_attacks(cfg, vd))


def test_feature_attacks_declare_their_threat_model():
    for name in ("dmavfl", "dmavfl_sync", "agn", "fsha"):
        cls = ATTACKS.get(name).factory
        assert cls.target == "features" and cls.phase == "malicious" and cls.reads == ("embedding",)
        assert cls.party == "active" and "auxiliary labelled samples" in cls.threat


# -- SSIM and distances -------------------------------------------------------------------


def test_ssim_of_identical_images_is_one_and_noise_lowers_it():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 1, 28, 14, generator=g)
    assert torch.allclose(ssim(x, x), torch.ones(4, dtype=x.dtype))
    noisy = (x + 0.1 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    noisier = (x + 0.4 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    s1, s2 = ssim(x, noisy), ssim(x, noisier)
    assert (s1 < 1).all() and (s2 < s1).all()
    assert torch.allclose(ssim(noisy, x), s1)  # symmetric


def test_ssim_of_constant_images_is_the_luminance_term():
    # constant images have zero variance: SSIM = (2ab + C1)/(a^2 + b^2 + C1), C1 = (0.01 L)^2
    a, b = 0.3, 0.6
    expected = (2 * a * b + 1e-4) / (a * a + b * b + 1e-4)
    got = ssim(torch.full((16, 16), a, dtype=torch.float64), torch.full((16, 16), b, dtype=torch.float64))
    assert float(got) == pytest.approx(expected, abs=1e-12)


def test_ssim_on_one_window_matches_the_weighted_formula():
    # an 11x11 image has one window position, so SSIM is Wang et al.'s formula with Gaussian weights
    g = torch.Generator().manual_seed(1)
    x = torch.rand(11, 11, generator=g, dtype=torch.float64)
    y = (0.7 * x + 0.2 + 0.05 * torch.rand(11, 11, generator=g, dtype=torch.float64)).clamp(0, 1)
    w = gaussian_window(11, 1.5)
    assert float(w.sum()) == pytest.approx(1.0) and w[5, 5] == w.max()
    mx, my = (w * x).sum(), (w * y).sum()
    vx, vy = (w * (x - mx) ** 2).sum(), (w * (y - my) ** 2).sum()
    cxy = (w * (x - mx) * (y - my)).sum()
    c1, c2 = (0.01) ** 2, (0.03) ** 2
    expected = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    assert float(ssim(x, y)) == pytest.approx(float(expected), abs=1e-10)
    # data range scales the constants: images in [0, 255] with L = 255 give the same value
    assert float(ssim(255 * x, 255 * y, data_range=255.0)) == pytest.approx(float(expected), abs=1e-9)


def test_ssim_is_defined_on_strips_smaller_than_the_window():
    x = torch.rand(3, 1, 8, 4, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(ssim(x, x), torch.ones(3))
    assert (ssim(x, 1 - x) < 0.5).all()


def test_cosine_distance():
    a = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    b = torch.tensor([[0.0, 2.0], [2.0, 2.0]])
    assert torch.allclose(cosine_distance(a, b), torch.tensor([1.0, 0.0]), atol=1e-6)


# -- several target parties (DMAVFL §7.4, Table 6) ----------------------------------------------


def _three_parties(attack: dict, name: str = "digits", train: dict | None = None, pool: int = 300):
    return build_config(
        minimal(data={"name": name, "parties": 3, "aux_pool": pool}, train={**TRAIN, **(train or {})}, attacks=[attack])
    )


# the aux rows are held out of training: digits keeps 1,137 training rows (8 epochs: about the steps 6 epochs
# gave before), breast_cancer's 455 would keep only 155 with 300 aux rows, so it gets 100 (355 train)
@pytest.mark.slow
@pytest.mark.parametrize(("dataset", "pool", "train"), [("digits", 300, {"epochs": 8}), ("breast_cancer", 100, {})])
def test_dmavfl_attacks_two_target_parties_at_once(dataset, pool, train):
    cfg = _three_parties(
        {"name": "dmavfl", **SMALL, "pretrain_epochs": 10, "victim": ["passive_1", "passive_2"]}, dataset, train, pool
    )
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    run = train_run(cfg, vd, attacks=plan)
    view = _view(run, plan.attacks[0])
    assert [r.sender for r in view.received] == ["passive_1", "passive_2"]
    widths = tuple(int(p.x_train.shape[-1]) for p in vd.passive)
    assert view.aux.victim_widths == widths and view.aux.victim_party == "passive_1+passive_2"
    assert view.aux.victim.shape[1:-1] == vd.passive[0].x_train.shape[1:-1]
    assert view.aux.victim.shape[-1] == sum(widths)
    inference = plan.attacks[0].attack.infer(view)
    assert inference.features.shape[1:] == view.aux.victim.shape[1:]  # both slices reconstructed
    [result], _ = run_attacks(plan, run)
    assert result.value < 0.95 * result.prior  # beats the aux-mean guess over both slices
    assert {"emb_mse", "emb_cos"} <= set(result.details)
    # every victim received malicious gradients: its bottom model moved away from its initialisation
    assert all(_moved(run, cfg, vd))


def _moved(run, cfg, vd) -> list[bool]:
    """Whether each passive party's bottom model differs from its initialisation after ``run``."""
    fresh = build_federation(cfg, vd)
    return [
        any(
            bool((a.detach() != b.detach()).any())
            for a, b in zip(party.bottom.parameters(), untouched.bottom.parameters(), strict=True)
        )
        for party, untouched in zip(run.federation.passives, fresh.passives, strict=True)
    ]


def test_a_party_that_is_not_a_target_gets_zero_gradients():
    cfg = _three_parties({"name": "dmavfl", **SMALL, "pretrain_epochs": 1, "victim": ["passive_2"]})
    vd = load_vertical_data(cfg)
    run = train_run(cfg, vd, attacks=validate_attacks(cfg, vd))
    assert _moved(run, cfg, vd) == [False, True]


@pytest.mark.parametrize(
    ("attack", "message"),
    [
        (
            {"name": "agn", **SMALL, "victim": ["passive_1", "passive_2"]},
            "'victim' = .* is not valid; expected a string",
        ),
        ({"name": "agn", **SMALL, "victim": ["passive_1"]}, "'victim' = .* is not valid; expected a string"),
        ({"name": "dmavfl", **SMALL, "victim": ["passive_1", "passive_1"]}, "name a party twice"),
        ({"name": "dmavfl", **SMALL, "victim": ["passive_1", "passive_3"]}, "victim 'passive_3' must be a passive"),
    ],
)
def test_bad_victim_lists_fail_before_training(attack, message):
    cfg = _three_parties(attack)
    with pytest.raises(ConfigError, match=message):
        validate_attacks(cfg, load_vertical_data(cfg))
