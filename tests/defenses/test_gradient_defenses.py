"""Cut-gradient defenses (Kang et al. eq. 13-19): definitions, statistics, and effect on attacks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import minimal
from scipy.optimize import minimize
from sklearn.metrics import roc_auc_score

from vflbench.defenses import DEFENSES, create_defense
from vflbench.defenses.gradient import marvell_objective, marvell_power, marvell_solve
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.run import run_experiment
from vflbench.protocol import BindContext, StepState

NAMES = ["dp_laplace", "isotropic_noise", "max_norm", "marvell", "gradient_compression", "discrete_sgd"]


def bound(name: str, seed: int = 0, num_classes: int = 2, **params):
    d = create_defense(name, **params)
    d.bind(
        BindContext(
            "active", "vhnn", num_classes, 2, torch.Generator().manual_seed(seed), torch.Generator().manual_seed(999)
        )
    )
    return d


def state(targets: torch.Tensor | None = None, batch: int = 0) -> StepState:
    n = len(targets) if targets is not None else batch
    return StepState(0, 0, torch.arange(n), "active", receiver="passive_1", targets=targets)


def gradient(batch: int = 64, width: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, width, generator=torch.Generator().manual_seed(seed)) * 1e-2


# ------------------------------------------------------------------------------------ registry


def test_all_six_registered_with_their_threat_model():
    for name in NAMES:
        cls = DEFENSES.get(name).factory
        assert cls.name == name and cls.side == "active" and cls.paper and cls.threat
        if cls.strength_param is not None:
            assert cls.strength_param in create_defense(name).get_params()
    assert DEFENSES.get("max_norm").factory.strength_param is None
    assert DEFENSES.get("gradient_compression").factory.strength_direction == "smaller is stronger"
    assert DEFENSES.get("discrete_sgd").factory.strength_direction == "smaller is stronger"
    assert DEFENSES.get("marvell").factory.strength_direction == "larger is stronger"


def test_strength_alias_and_parameter_validation():
    assert create_defense("gradient_compression", strength=0.1).ratio == 0.1
    assert create_defense("dp_laplace", strength=0.01).scale == 0.01
    assert create_defense("isotropic_noise", strength=5).alpha == 5
    assert create_defense("marvell", strength=4).init_scale == 4
    assert create_defense("discrete_sgd", strength=12).bins == 12
    assert create_defense("dp_laplace").get_params() == {"scale": 1e-3}
    assert create_defense("discrete_sgd").get_params() == {"bins": 6, "mode": "kang", "bound": 3e-2}
    with pytest.raises(ConfigError, match="has no parameter 'strength'"):
        create_defense("max_norm", strength=1.0)
    for name, params in [
        ("gradient_compression", {"ratio": 0}),
        ("gradient_compression", {"ratio": 1.5}),
        ("discrete_sgd", {"bins": 0}),
        ("discrete_sgd", {"bins": 2.5}),
        ("discrete_sgd", {"mode": "other"}),
        ("dp_laplace", {"scale": -1}),
        ("isotropic_noise", {"alpha": -1}),
        ("marvell", {"init_scale": -1}),
    ]:
        with pytest.raises(ConfigError, match=name):
            create_defense(name, **params)


# ------------------------------------------------------------------------------------ identity


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("dp_laplace", {"scale": 0}),
        ("isotropic_noise", {"alpha": 0}),
        ("marvell", {"init_scale": 0}),
        ("gradient_compression", {"ratio": 1.0}),
    ],
)
def test_neutral_strength_is_the_identity(name, params):
    g = gradient()
    y = (torch.arange(64) % 3 == 0).long()
    out = bound(name, **params).transform_cut_gradient(g.clone(), state(y))
    assert torch.equal(out, g)


def test_randomness_comes_only_from_the_bound_generator():
    g, y = gradient(), (torch.arange(64) % 2).long()
    for name in ["dp_laplace", "isotropic_noise", "max_norm", "marvell"]:
        before = torch.get_rng_state()
        a = bound(name, seed=3).transform_cut_gradient(g, state(y))
        b = bound(name, seed=3).transform_cut_gradient(g, state(y))
        c = bound(name, seed=4).transform_cut_gradient(g, state(y))
        assert torch.equal(torch.get_rng_state(), before)
        assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, g)


# --------------------------------------------------------------------------------------- noise


def test_laplace_noise_statistics():
    g = gradient(400, 50)
    noise = bound("dp_laplace", scale=0.1).transform_cut_gradient(g, state(batch=400)) - g
    assert abs(float(noise.mean())) < 0.005
    assert float(noise.std()) == pytest.approx(math.sqrt(2) * 0.1, rel=0.03)
    assert float(noise.abs().mean()) == pytest.approx(0.1, rel=0.03)  # E|X| = b (a Gaussian would give 1.13 b)


def test_isotropic_noise_std_follows_the_max_row_norm():
    g = gradient(500, 20)
    g[7] *= 10  # the largest row sets sigma for the whole batch
    sigma = 2.0 * float(g.norm(dim=1).max()) / math.sqrt(20)
    noise = bound("isotropic_noise", alpha=2.0).transform_cut_gradient(g, state(batch=500)) - g
    assert abs(float(noise.mean())) < 0.05 * sigma
    assert float(noise.std()) == pytest.approx(sigma, rel=0.03)


def test_max_norm_equalises_expected_squared_norms():
    base = gradient(5, 8) * torch.tensor([1.0, 0.2, 3.0, 0.5, 1.5])[:, None]
    reps = 20000
    out = bound("max_norm").transform_cut_gradient(base.repeat(reps, 1), state(batch=5 * reps))
    sq = out.double().square().sum(1).view(reps, 5).mean(0)
    target = float(base.double().norm(dim=1).max()) ** 2
    assert torch.allclose(sq, torch.full((5,), target, dtype=torch.float64), rtol=0.05)
    largest = int(base.norm(dim=1).argmax())
    assert torch.equal(out[largest], base[largest])  # the largest row is the only one left as is
    # every row keeps its direction up to sign (multiplicative scalar noise)
    cos = torch.nn.functional.cosine_similarity(out[:5], base, dim=1).abs()
    assert torch.allclose(cos, torch.ones(5), atol=1e-5)
    zero = torch.zeros(3, 4)
    assert torch.equal(bound("max_norm").transform_cut_gradient(zero, state(batch=3)), zero)


# ------------------------------------------------------------------------------------- Marvell


def _feasible(p: float, d: int, P: float, weights: np.ndarray) -> np.ndarray:
    coef = np.array([1 - p, (1 - p) * (d - 1), p, p * (d - 1)])  # (l10, l20, l11, l21)
    lam = np.zeros(4)
    ok = (coef > 0) & (weights > 0)
    if not ok.any():  # e.g. all weight on a perpendicular variance when d = 1: all power to l10
        lam[0] = P / coef[0]
        return lam
    lam[ok] = weights[ok] / weights[ok].sum() * P / coef[ok]
    return lam


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # SLSQP probing where the objective is infinite
@pytest.mark.parametrize(
    ("u", "v", "G", "p", "d", "P"),
    [
        (1.0, 2.0, 3.0, 0.3, 16, 3.0),
        (2.0, 1.0, 3.0, 0.3, 16, 3.0),
        (0.0, 0.0, 1.0, 0.4, 8, 2.0),
        (1e-9, 5e-9, 1e-6, 0.5, 1, 1e-6),
        (0.0, 1.0, 1.0, 0.5, 4, 10.0),
        (0.3, 0.0, 2.0, 0.7, 128, 24.0),
        (4e-8, 3e-8, 2e-7, 0.2, 16, 8e-7),
        (1.0, 1.0, 0.5, 0.5, 2, 0.05),
    ],
)
def test_marvell_solver_is_feasible_and_beats_simple_points(u, v, G, p, d, P):
    lam = marvell_solve(u, v, G, p, d, P)
    assert min(lam) >= 0
    assert marvell_power(*lam, p=p, d=d) == pytest.approx(P, rel=1e-9)
    assert (lam[3] if u <= v else lam[1]) == 0  # Li's case split: l21 = 0 when u <= v, else l20 = 0
    f = marvell_objective(*lam, u=u, v=v, G=G, p=p, d=d)

    def objective(x):
        return marvell_objective(*x, u=u, v=v, G=G, p=p, d=d)

    rng = np.random.default_rng(0)
    candidates = [_feasible(p, d, P, w) for w in np.eye(4)] + [_feasible(p, d, P, np.ones(4))]
    candidates += [_feasible(p, d, P, rng.dirichlet(np.ones(4))) for _ in range(500)]
    coef = np.array([1 - p, (1 - p) * (d - 1), p, p * (d - 1)])
    for x0 in candidates[:25]:  # a generic local solver over all four variances, from many starts
        r = minimize(
            objective,
            x0,
            method="SLSQP",
            bounds=[(0, None)] * 4,
            constraints=[{"type": "eq", "fun": lambda x: (coef @ x - P) / P}],
        )
        if r.success and abs(coef @ r.x - P) <= 1e-8 * P:
            candidates.append(np.clip(r.x, 0, None))
    assert all(marvell_power(*x, p=p, d=d) == pytest.approx(P, rel=1e-6) for x in candidates)
    best = min(objective(x) for x in candidates)
    assert math.isfinite(best)
    assert f <= best * (1 + 1e-6)
    assert marvell_solve(u, v, G, p, d, 0.0) == (0.0, 0.0, 0.0, 0.0)


def _two_class_batch(batch: int = 512, width: int = 16, seed: int = 0):
    """Positives: large gradients along one direction; negatives: small, noisy (NS separates them)."""
    gen = torch.Generator().manual_seed(seed)
    y = (torch.rand(batch, generator=gen) < 0.3).long()
    direction = torch.randn(width, generator=gen)
    g = 0.02 * torch.randn(batch, width, generator=gen)
    g[y == 1] += direction
    g[y == 0] -= 0.2 * direction
    return g, y


def test_marvell_meets_the_power_budget_and_hides_the_norm():
    g, y = _two_class_batch()
    pos, neg = y == 1, y == 0
    p = float(pos.double().mean())
    G = float((g[pos].double().mean(0) - g[neg].double().mean(0)).square().sum())
    auc_before = roc_auc_score(y, g.norm(dim=1))
    assert auc_before > 0.99
    defense = bound("marvell", init_scale=4.0)
    draws = torch.stack([(defense.transform_cut_gradient(g, state(y)) - g).double() for _ in range(150)])
    powers = p * draws[:, pos].square().sum(2).mean(1) + (1 - p) * draws[:, neg].square().sum(2).mean(1)
    assert float(powers.mean()) == pytest.approx(4.0 * G, rel=0.03)
    sol = defense.last_solution_
    assert sol["P"] == pytest.approx(4.0 * G)
    aucs = [roc_auc_score(y, (g + noise).norm(dim=1)) for noise in draws[:30]]
    assert abs(np.mean(aucs) - 0.5) < 0.5 * abs(auc_before - 0.5)
    # the noise has the solved covariance: l1y along g_diff, l2y in each direction across it
    e = (g[pos].double().mean(0) - g[neg].double().mean(0)) / math.sqrt(G)
    along = draws @ e
    across = (draws - along[..., None] * e).square().sum(-1) / (g.shape[1] - 1)
    tol = {"rel": 0.05, "abs": 1e-3 * sol["P"]}
    assert float(along[:, pos].var()) == pytest.approx(sol["l11"], **tol)
    assert float(along[:, neg].var()) == pytest.approx(sol["l10"], **tol)
    assert float(across[:, pos].mean()) == pytest.approx(sol["l21"], **tol)
    assert float(across[:, neg].mean()) == pytest.approx(sol["l20"], **tol)


def test_marvell_passes_single_class_batches_and_counts_them():
    defense = bound("marvell", init_scale=4.0)
    g = gradient(8, 4)
    assert torch.equal(defense.transform_cut_gradient(g, state(torch.ones(8, dtype=torch.long))), g)
    assert torch.equal(defense.transform_cut_gradient(g, state(torch.zeros(8, dtype=torch.long))), g)
    assert not torch.equal(defense.transform_cut_gradient(g, state(torch.arange(8) % 2)), g)
    assert defense.on_epoch_end(0) == {"single_class_batches": 2}
    assert defense.on_epoch_end(1) == {"single_class_batches": 0}


def test_marvell_needs_binary_labels():
    with pytest.raises(CompatibilityError, match="needs binary labels.*10 classes"):
        bound("marvell", num_classes=10)


# --------------------------------------------------------------------------------- compression


@pytest.mark.parametrize("ratio", [0.1, 0.25, 0.5, 0.75])
def test_gradient_compression_keeps_the_largest_fraction(ratio):
    g = gradient(64, 16)
    out = bound("gradient_compression", ratio=ratio).transform_cut_gradient(g, state(batch=64))
    kept = out != 0
    k = int(g.numel() * ratio)
    assert int(kept.sum()) == k - 1  # strictly above the k-th largest magnitude (Fu's rule)
    assert torch.equal(out[kept], g[kept])
    assert float(g[kept].abs().min()) > float(g[~kept].abs().max())


@pytest.mark.parametrize("bins", [2, 4, 6, 12, 18])
def test_discrete_sgd_takes_at_most_bins_plus_one_values_and_zero(bins):
    g = gradient(128, 16)
    out = bound("discrete_sgd", bins=bins).transform_cut_gradient(g, state(batch=128))
    values = set(out.unique().tolist()) - {0.0}
    assert 2 <= len(values) <= bins + 1
    mu, sigma = g.double().mean(), g.double().std(correction=0)
    lb, ub = float(mu - 2 * sigma), float(mu + 2 * sigma)
    outside = (g < lb) | (g > ub)
    assert outside.any() and torch.all(out[outside] == 0)
    width = (ub - lb) / bins
    assert float((out[~outside] - g[~outside]).abs().max()) <= width / 2 + 1e-6
    endpoints = torch.tensor([lb + w * width for w in range(bins + 1)])
    assert all(float((endpoints - x).abs().min()) < 1e-6 for x in values)


def test_discrete_sgd_fu_mode_rounds_to_the_grid_without_clipping():
    g = torch.tensor([[0.0, 0.004, 0.006, -0.031, 0.5]])
    out = bound("discrete_sgd", bins=6, mode="fu").transform_cut_gradient(g, state(batch=1))
    interval = 2 * 3e-2 / 6
    assert torch.allclose(out, torch.tensor([[0.0, 0.0, interval, -3 * interval, 50 * interval]]))


# ---------------------------------------------------------------------------- end to end (AUCs)


def _vhnn(defenses):
    return build_config(
        minimal(
            data={"name": "breast_cancer"},
            train={"batch_size": 32, "epochs": 2},
            defenses=defenses,
            attacks=[{"name": "norm_scoring", "epochs": [0]}, {"name": "direction_scoring", "epochs": [0]}],
        )
    )


def _vlr(defenses):
    return build_config(
        minimal(
            data={"name": "breast_cancer"},
            model={"bottom": "logreg", "top": "identity"},
            train={"algorithm": "vlr", "batch_size": 32, "epochs": 2},
            defenses=defenses,
            attacks=[{"name": "direct_label_inference"}],
        )
    )


@pytest.fixture(scope="module")
def vhnn_baseline():
    ns, ds = run_experiment(_vhnn([])).attacks
    assert ns.value > 0.7 and ds.value > 0.9
    return ns.value, ds.value


def test_marvell_lowers_norm_scoring(vhnn_baseline):
    result = run_experiment(_vhnn([{"name": "marvell", "init_scale": 8}]))
    ns, ds = result.attacks
    assert abs(ns.value - 0.5) < 0.5 * abs(vhnn_baseline[0] - 0.5)
    assert ds.value < vhnn_baseline[1] - 0.2


def test_isotropic_noise_lowers_direction_scoring(vhnn_baseline):
    ns, ds = run_experiment(_vhnn([{"name": "isotropic_noise", "alpha": 5}])).attacks
    assert abs(ds.value - 0.5) < 0.5 * abs(vhnn_baseline[1] - 0.5)


@pytest.mark.parametrize(
    ("name", "params"),
    [("dp_laplace", {"scale": 0.1}), ("gradient_compression", {"ratio": 0.1}), ("discrete_sgd", {"bins": 2})],
)
def test_vlr_defenses_lower_direct_label_inference(name, params):
    [dl] = run_experiment(_vlr([{"name": name, **params}])).attacks
    assert dl.value < 0.75  # 1.0 without defense (tests/attacks/test_label_attacks.py)


def test_vlr_direct_label_inference_is_exact_without_defense():
    [dl] = run_experiment(_vlr([])).attacks
    assert dl.value == pytest.approx(1.0)
