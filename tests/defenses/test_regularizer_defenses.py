"""Regulariser and bottleneck defenses: dCor, MID, NoPeek, embedding noise, FedPass, PRECODE."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import minimal

from vflbench.defenses import DEFENSES, create_defense
from vflbench.defenses.bottlenecks import VariationalBottleneck
from vflbench.defenses.embedding import PassportLayer
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.run import run_experiment, train_run
from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.metrics.correlation import distance_correlation
from vflbench.protocol.hooks import BindContext, StepState

NAMES = ["dcor", "mid", "nopeek", "embedding_noise", "fedpass", "precode"]


def _reference_dcor(x: np.ndarray, y: np.ndarray) -> float:
    """Distance correlation by the textbook double loops (V-statistic)."""
    n = len(x)

    def centred(z: np.ndarray) -> np.ndarray:
        d = np.array([[np.sqrt(((z[i] - z[j]) ** 2).sum()) for j in range(n)] for i in range(n)])
        return d - d.mean(0, keepdims=True) - d.mean(1, keepdims=True) + d.mean()

    a, b = centred(x), centred(y)
    dcov2, dvx2, dvy2 = (a * b).mean(), (a * a).mean(), (b * b).mean()
    return float(np.sqrt(dcov2 / np.sqrt(dvx2 * dvy2)))


def _bound(name: str, party: str = "passive_1", **params) -> object:
    d = create_defense(name, **params)
    d.bind(BindContext(party, "vhnn", 10, 2, torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)))
    return d


@pytest.mark.parametrize(("n", "dx", "dy"), [(12, 3, 2), (40, 5, 1)])  # 40 rows: cdist's matrix-product path
def test_distance_correlation_matches_numpy_reference(n, dx, dy):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, dx, generator=g, dtype=torch.float64)
    y = torch.tanh(x[:, :dy]) + 0.5 * torch.randn(n, dy, generator=g, dtype=torch.float64)
    assert float(distance_correlation(x, y)) == pytest.approx(_reference_dcor(x.numpy(), y.numpy()), abs=1e-7)


def test_distance_correlation_is_one_for_similarities_and_small_for_independent_draws():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 2, generator=g)
    q = torch.linalg.qr(torch.randn(2, 2, generator=g))[0]
    assert float(distance_correlation(x, 3 * x @ q + 1)) == pytest.approx(1.0, abs=1e-4)
    assert float(distance_correlation(x[:, 0], -2.5 * x[:, 0] + 1)) == pytest.approx(1.0, abs=1e-4)
    assert float(distance_correlation(x, torch.randn(1000, 2, generator=g))) < 0.12


def test_distance_correlation_gradient_is_exact_and_finite_at_coincident_rows():
    g = torch.Generator().manual_seed(0)
    y = torch.nn.functional.one_hot(torch.randint(0, 3, (40,), generator=g), 3).double()
    x = torch.randn(40, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: distance_correlation(a, y), (x,))
    dup = torch.randn(1, 16, generator=g).repeat(32, 1)  # e.g. dead ReLUs: identical embeddings
    dup[:4] = 0
    h = (3 * dup).requires_grad_()
    distance_correlation(h, y[:32].float()).log().backward()
    assert torch.isfinite(h.grad).all()


@pytest.mark.parametrize(
    "spec", [{"name": "dcor", "weight": 0}, {"name": "nopeek", "alpha": 0}, {"name": "embedding_noise", "strength": 0}]
)
def test_strength_zero_is_the_identity(spec):
    def curve(defenses):
        return run_experiment(build_config(minimal(train={"epochs": 3}, defenses=defenses))).utility.per_epoch

    assert curve([spec]) == curve([])


def test_registered_with_metadata_and_validated_parameters():
    for name in NAMES:
        cls = DEFENSES.get(name).factory
        assert cls.name == name and cls.paper and cls.threat and cls.side in ("active", "passive", "both")
        if cls.strength_param is not None:
            assert create_defense(name, strength=0.25).get_params()[cls.strength_param] == 0.25
    assert DEFENSES.get("precode").factory.strength_param is None
    assert create_defense("dcor").get_params() == {"weight": 0.15, "form": "dcor"}
    for name, bad in [
        ("dcor", {"form": "square"}),
        ("dcor", {"weight": -1}),
        ("nopeek", {"weighting": "mixed"}),
        ("nopeek", {"alpha": 2, "weighting": "convex"}),
        ("fedpass", {"active_passport": "side"}),
        ("mid", {"bottleneck_scale": 0}),
        ("embedding_noise", {"sigma": -0.1}),
    ]:
        with pytest.raises(ConfigError, match=name):
            create_defense(name, **bad)


def test_mid_puts_one_bottleneck_per_passive_slice_and_its_kl_reaches_the_loss():
    cfg = build_config(
        minimal(
            data={"parties": 3},
            train={"optimizer": "adam", "lr": 0.01},  # Adam as in VFLAIR
            defenses=[{"name": "mid"}],
        )
    )
    vd = load_vertical_data(cfg)
    fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1", "passive_2"]))
    top, [mid] = fed.active.top, fed.active.defenses
    assert len(top.mids) == 2 and top.which == [False, True, True]  # the active party's own slice is left alone
    assert top.bounds == [(0, 16), (16, 32), (32, 48)]
    opt_params = {id(p) for group in fed.active.optimizer.param_groups for p in group["params"]}
    assert {id(p) for p in top.mids.parameters()} <= opt_params
    before = [p.detach().clone() for p in top.mids.parameters()]
    fed.train_step(torch.arange(64), epoch=0, step=0)
    assert top.loss_ is None  # taken by the regularizer
    assert all(not torch.equal(a, b) for a, b in zip(before, top.mids.parameters(), strict=True))
    top.train()
    top(torch.randn(8, 48, generator=torch.Generator().manual_seed(0)).to(vd.device))  # where the run's embeddings are
    kl = mid.regularizer(StepState(0, 0, torch.arange(8), "active"))
    assert kl is not None and kl.item() > 0 and mid.regularizer(StepState(0, 0, torch.arange(8), "active")) is None
    copy.deepcopy(top)  # a stored loss term never blocks copies
    assert run_experiment(cfg).utility.value > 0.7


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (minimal(train={"aggregation": "sum"}, defenses=[{"name": "mid"}]), "aggregation: concat"),
        (
            minimal(
                data={"name": "breast_cancer"},
                model={"bottom": "logreg", "top": "identity"},
                train={"algorithm": "vlr"},
                defenses=[{"name": "mid"}],
            ),
            "VLR",
        ),
    ],
)
def test_mid_needs_concatenated_embeddings_and_a_top_model(config, message):
    with pytest.raises(CompatibilityError, match=message):
        run_experiment(build_config(config))


@pytest.mark.parametrize(
    ("spec", "train"),
    [
        ({"name": "fedpass"}, {"optimizer": "adam", "lr": 0.01}),
        ({"name": "fedpass", "active_passport": "top"}, {"optimizer": "adam", "lr": 0.01}),
        ({"name": "precode"}, {}),
    ],
)
def test_bottleneck_wrappers_train_and_belong_to_their_owner(spec, train):
    cfg = build_config(minimal(train=train, defenses=[spec]))
    vd = load_vertical_data(cfg)
    fed = build_federation(cfg, vd, defenses=plan_defenses(cfg, ["passive_1"]))
    [passive], active = fed.passives, fed.active
    kind = VariationalBottleneck if spec["name"] == "precode" else PassportLayer
    added = [m for m in passive.bottom.modules() if isinstance(m, kind)]
    assert len(added) == 1
    params = {id(p) for p in added[0].parameters()}
    passive_opt = {id(p) for group in passive.optimizer.param_groups for p in group["params"]}
    active_opt = {id(p) for group in active.optimizer.param_groups for p in group["params"]}
    assert params <= passive_opt and not params & active_opt
    if spec["name"] == "fedpass":
        where = active.top if spec.get("active_passport") == "top" else active.bottom
        [own] = [m for m in where.modules() if isinstance(m, PassportLayer)]
        assert {id(p) for p in own.parameters()} <= active_opt
        assert not torch.equal(added[0].skey, own.skey)  # each party's private keys
        assert float(added[0].skey.mean()) == pytest.approx(-1.0, abs=0.6)  # N(-1, 1), FATE's default
    run = train_run(cfg, vd)
    assert run.history.epochs[-1]["test_accuracy"] > 0.7
    copy.deepcopy(run.federation.passives[0].bottom)


def test_embedding_noise_has_the_configured_std_in_training_and_evaluation():
    noise = _bound("embedding_noise", sigma=0.3)
    h = torch.zeros(20000, 8)
    out = noise.transform_embedding(h, StepState(0, 0, torch.arange(20000), "passive_1"))
    assert float(out.std()) == pytest.approx(0.3, rel=0.01)
    assert abs(float(out.mean())) < 4 * 0.3 / np.sqrt(out.numel())
    assert not torch.equal(out, noise.transform_embedding(h, StepState(0, 1, torch.arange(20000), "passive_1")))
    cfg = build_config(minimal(train={"epochs": 1}, defenses=[{"name": "embedding_noise", "sigma": 0.3}]))
    run = train_run(cfg, load_vertical_data(cfg))
    p = run.federation.passives[0]
    sent = p.forward(torch.arange(300), epoch=-1, step=-1, split="test", train=False)
    with torch.no_grad():
        clean = p.bottom(p.features("test")[:300])
    assert float((sent - clean).std()) == pytest.approx(0.3, rel=0.05)


def test_dcor_lowers_model_completion_on_breast_cancer():
    attack = [{"name": "model_completion", "prior": "scratch", "finetune_bottom": False}]

    def run(defenses):
        return run_experiment(
            build_config(
                minimal(data={"name": "breast_cancer"}, train={"batch_size": 32}, defenses=defenses, attacks=attack)
            )
        )

    plain, defended = run([]), run([{"name": "dcor", "weight": 1.0}])
    assert plain.attacks[0].value > 0.95
    assert defended.attacks[0].value < plain.attacks[0].value - 0.25
    assert defended.utility.value > 0.85  # the task still trains


def test_nopeek_lowers_the_input_embedding_distance_correlation():
    def dcor_x_h(defenses):
        cfg = build_config(minimal(defenses=defenses))
        run = train_run(cfg, load_vertical_data(cfg))
        p = run.federation.passives[0]
        with torch.no_grad():
            x = p.features("test")
            return float(distance_correlation(x, p.bottom.eval()(x)))

    plain, defended = dcor_x_h([]), dcor_x_h([{"name": "nopeek", "alpha": 1.0}])
    assert defended < plain - 0.2


def test_noise_and_sampling_come_from_the_bound_generators():
    a, b = _bound("embedding_noise"), _bound("embedding_noise")
    state = StepState(0, 0, torch.arange(4), "passive_1")
    assert torch.equal(a.transform_embedding(torch.zeros(4, 3), state), b.transform_embedding(torch.zeros(4, 3), state))
    bottom = torch.nn.Linear(5, 4)

    def wrapped(global_seed: int) -> VariationalBottleneck:
        torch.manual_seed(global_seed)  # the global RNG must not matter
        return _bound("precode").wrap_bottom(copy.deepcopy(bottom), "passive_1")  # type: ignore[return-value]

    first, second = wrapped(123), wrapped(456)
    assert all(torch.equal(x, y) for x, y in zip(first.parameters(), second.parameters(), strict=True))
