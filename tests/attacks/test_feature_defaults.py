"""Feature attacks with their DEFAULT parameters beat the aux-mean guess on the embedded data.

A new user's first run: a 2-party VHNN (mlp2 bottoms and top, the library's default SGD 0.1,
batch 64) on ``digits`` (8x8 images; the victim holds the left 8x4 strip) or ``breast_cancer``
(standardised; the victim holds the first 15 columns), seeds 0 and 1, every attack parameter
left at its default (MI: 10% of the training rows, drawn from the rows the parties train on). The
attacks whose auxiliary set is disjoint from the training set take the pool of held-out rows, whose
size is the paper's setting, given in the data section: SDAR's original 1:1 (``aux_pool: 0.5``, 718
and 228 rows), DMAVFL's 1:10 (``0.0909``), PCAT's 10%. Only the VFL epochs are set: 10 (the library's default) for the
honest attacks, 25 (URVFL's) for DMAVFL, whose distribution transfer has not converged after 10
epochs here (docs/decisions/attacks.md). The whole file takes about 30 s of CPU (55 s wall on a shared core).

PCAT is tested on ``breast_cancer`` only: on ``digits`` its pseudo-client is not the victim's
bottom model and its decoder does worse than the mean guess on the victim's embeddings, as in
DMAVFL Table 1 on MNIST (docs/methods.md).
"""

from __future__ import annotations

import pytest

from vflbench.attacks.feature.dmavfl import DMAVFL
from vflbench.experiment.config import build_config
from vflbench.experiment.plan import validate_attacks
from vflbench.experiment.run import train_run
from vflbench.experiment.scenario import load_vertical_data
from vflbench.experiment.scoring import run_attacks
from vflbench.experiment.views import _view, feature_targets
from vflbench.metrics.reconstruction import ssim

pytestmark = pytest.mark.slow

CASES = [(name, seed) for name in ("digits", "breast_cancer") for seed in (0, 1)]


def _attack(dataset, seed, attacks, epochs, pool):
    cfg = build_config(
        {
            "data": {"name": dataset, "parties": 2, "aux_pool": pool},
            "model": {"bottom": "mlp2", "top": "mlp2"},
            "train": {"algorithm": "vhnn", "epochs": epochs, "checkpoint": "none"},
            "attacks": attacks,
            "seed": seed,
        }
    )
    vd = load_vertical_data(cfg)
    plan = validate_attacks(cfg, vd)
    run = train_run(cfg, vd, attacks=plan)
    results, _ = run_attacks(plan, run)
    return run, plan, results


def _mean_image_ssim(run, planned):
    """SSIM of the aux rows' mean image against the target strips (the prior in Kang's metric)."""
    view = _view(run, planned)
    ids, split = feature_targets(planned.attack, run.data, view.aux, run.config.seed)
    part = run.data.passive[0]
    truth = (part.x_test if split == "test" else part.x_train)[ids]
    return float(ssim(view.aux.victim.mean(0, keepdim=True).expand_as(truth), truth).mean())


def _assert_beats_the_prior(run, planned, result):
    assert result.prior_name == "aux_mean"
    assert result.value < result.prior, f"{result.name}: MSE {result.value:.4f} >= mean guess {result.prior:.4f}"
    if "ssim" in result.details:
        assert result.details["ssim"] > _mean_image_ssim(run, planned), result.name


@pytest.mark.parametrize(("dataset", "seed"), CASES)
def test_sdar_and_model_inversion_defaults_beat_the_mean_guess(dataset, seed):
    """Catches query-free MI as the default (MSE 0.127 vs 0.068 on digits, 4.89 vs 0.87 on breast_cancer)
    and SDAR's former 10% aux set on breast_cancer (46 held-out rows; in this run MSE 1.51 vs 0.85 at seed 0).
    """
    run, plan, results = _attack(dataset, seed, [{"name": "sdar"}, {"name": "model_inversion"}], epochs=10, pool=0.5)
    for planned, result in zip(plan.attacks, results, strict=True):
        _assert_beats_the_prior(run, planned, result)
    assert results[0].details["aux_rows"] > 0.45 * len(run.data.y_train)  # |D_aux| = |D_train|: the whole pool
    assert results[-1].details["mode"] == "black_box"


@pytest.mark.parametrize("seed", [0, 1])
def test_pcat_defaults_beat_the_mean_guess_on_breast_cancer(seed):
    """Catches PCAT's decoder trained for URVFL's 1,080 steps on the Adam 1e-4 pseudo-client, whose
    embeddings are 3-5x smaller than the victim's (MSE 2.6 vs 0.85 at seed 0)."""
    run, plan, results = _attack("breast_cancer", seed, [{"name": "pcat"}], epochs=10, pool=0.1)
    _assert_beats_the_prior(run, plan.attacks[0], results[0])


@pytest.mark.parametrize(("dataset", "seed"), CASES)
def test_dmavfl_defaults_beat_the_mean_guess(dataset, seed):
    """Catches 20 pretraining passes as the default (40 Adam steps on digits: MSE 0.18 vs 0.068)."""
    run, plan, results = _attack(dataset, seed, [{"name": "dmavfl"}], epochs=25, pool=0.0909)
    _assert_beats_the_prior(run, plan.attacks[0], results[0])


@pytest.mark.parametrize("seed", [0, 1])
def test_agn_blowing_up_on_breast_cancer_is_flagged_not_reported_bare(seed):
    """AGN with its defaults after 25 epochs on breast_cancer reconstructs with MSE 11.8 and 8.6 (seeds 0, 1)
    against a mean guess of 0.85, far outside the data's range, which the scorer flags."""
    _, _, (result,) = _attack("breast_cancer", seed, [{"name": "agn"}], epochs=25, pool=0.0909)
    assert result.value > 5 * result.prior
    assert result.details["out_of_range"] and result.details["out_of_range_share"] > 0.1


@pytest.mark.parametrize("dataset", ["digits", "breast_cancer"])
def test_sdar_at_the_default_epochs_is_not_flagged(dataset):
    """The flag's false alarms: SDAR's reconstructions beat the mean guess and stay in the data's range."""
    _, _, (result,) = _attack(dataset, 0, [{"name": "sdar"}], epochs=10, pool=0.5)
    assert result.value < result.prior and not result.details["out_of_range"]


def test_dmavfl_pretrains_for_urvfl_steps_on_small_aux_sets():
    attack = DMAVFL()
    assert attack.pretrain_passes(143) == 360  # 2 batches of 128 a pass: 720 steps
    assert attack.pretrain_passes(4545) == 20  # URVFL's own aux set: its 20 epochs
    assert DMAVFL(pretrain_epochs=3).pretrain_passes(143) == 3
