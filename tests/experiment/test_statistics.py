"""Verdicts are statistics: intervals over seeds × repeats, no test-set oracle, priors a constant guess
cannot beat, no credit for a defense that changes nothing, one scenario per seed."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from conftest import minimal
from scipy import stats

import vflbench as vb
from vflbench.attacks.base import LabelInference, Scores
from vflbench.errors import ConfigError
from vflbench.experiment.config import build_config
from vflbench.experiment.scoring import constant_guess, metric_name, random_prior, score_inference
from vflbench.experiment.sweep import scores_table
from vflbench.metrics.scores import leaks
from vflbench.metrics.stats import difference_interval, mean_interval
from vflbench.report.build import build_report

# -- intervals -------------------------------------------------------------------------------------------------


def test_the_interval_is_over_per_seed_means_with_seeds_minus_one_degrees_of_freedom():
    per_seed = {0: [10.0, 12.0], 1: [14.0, 16.0], 2: [9.0, 9.0]}
    means = [11.0, 15.0, 9.0]
    half = stats.t.ppf(0.975, 2) * stats.tstd(means) / math.sqrt(3)
    interval = mean_interval(per_seed)
    assert interval.basis == "seeds" and interval.seeds == 3 and interval.repeats == 2
    assert interval.mean == pytest.approx(35 / 3)
    assert (interval.low, interval.high) == pytest.approx((35 / 3 - half, 35 / 3 + half))


def test_one_seed_gives_an_interval_over_its_repeats_and_a_single_measurement_none():
    repeats = mean_interval({0: [1.0, 2.0, 3.0, 4.0]})
    assert repeats.basis == "repeats" and repeats.defined and repeats.low < 2.5 < repeats.high
    single = mean_interval({0: [5.0]})
    assert single.basis == "none" and not single.defined and single.mean == 5.0
    deterministic = mean_interval({0: [5.0, 5.0, 5.0]})  # repeats that measure no randomness
    assert deterministic.basis == "none" and not deterministic.defined


def test_a_difference_is_paired_by_seed():
    # a constant shift of -3 on every seed is certain, however much the seeds differ from each other
    treated = {0: [7.0], 1: [27.0], 2: [47.0]}
    control = {0: [10.0], 1: [30.0], 2: [50.0]}
    paired = difference_interval(treated, control)
    assert paired.basis == "seeds" and paired.mean == pytest.approx(-3.0)
    assert paired.below(0.0)
    # unpaired, the same numbers would not be distinguishable at all
    assert not mean_interval(treated).below(mean_interval(control).low)


def test_an_attack_leaks_only_when_its_whole_interval_is_above_zero():
    assert leaks(mean_interval({0: [0.01], 1: [0.02], 2: [0.015]})) is True
    assert leaks(mean_interval({0: [0.01], 1: [-2.0], 2: [3.0]})) is False  # prior + noise: not a leak
    assert leaks(mean_interval({0: [0.01]})) is None  # one measurement: unknown


# -- priors a constant guess cannot beat ------------------------------------------------------------------------


def _constant(y: torch.Tensor, cls: int, classes: int = 2) -> LabelInference:
    scores = torch.zeros(len(y), classes)
    scores[:, cls] = 1.0
    return LabelInference(test=Scores(torch.arange(len(y)), scores, "test"))


@pytest.mark.parametrize("cls", [0, 1])
@pytest.mark.parametrize("metric", ["accuracy", "balanced_accuracy", "auc"])
def test_a_constant_prediction_never_shows_positive_leakage_on_an_88_12_task(metric, cls):
    y = torch.cat([torch.zeros(88, dtype=torch.long), torch.ones(12, dtype=torch.long)])
    value, details = score_inference(_constant(y, cls), y, y, metric)
    prior = max(random_prior(metric, 2), details["constant_guess"])
    assert 100.0 * (value - prior) <= 1e-9
    if metric == "accuracy":
        assert details["constant_guess"] == pytest.approx(0.88)  # not 1/C = 0.5


def test_constant_guess_of_batches_is_the_mean_of_their_majorities():
    assert constant_guess("accuracy", [torch.tensor([0, 0, 0, 1]), torch.tensor([1, 1])]) == pytest.approx(0.875)
    assert constant_guess("balanced_accuracy", [torch.tensor([0, 1, 2, 2])]) == pytest.approx(1 / 3)


def test_auto_metric_is_auc_for_binary_and_balanced_accuracy_for_imbalanced_tasks():
    assert metric_name(torch.tensor([0, 1, 1]), 2) == "auc"
    assert metric_name(torch.tensor([0, 1, 2] * 10), 3) == "accuracy"
    assert metric_name(torch.tensor([0] * 20 + [1] * 5 + [2] * 5), 3) == "balanced_accuracy"


# -- no test-set oracle ----------------------------------------------------------------------------------------


def _epochs(test_correct: list[int], val_correct: list[int]) -> LabelInference:
    """Per-epoch inferences on 4 test rows and 2 validation rows with the given numbers of correct rows."""
    y_test, y_train = torch.tensor([0, 1, 0, 1]), torch.tensor([0, 1, 0, 1])

    def scores(y: torch.Tensor, correct: int) -> torch.Tensor:
        predicted = torch.cat([y[:correct], 1 - y[correct:]])
        return torch.nn.functional.one_hot(predicted, 2).float()

    return LabelInference(
        per_epoch=[
            LabelInference(
                test=Scores(torch.arange(4), scores(y_test, t), "test"),
                validation=Scores(torch.tensor([2, 3]), scores(y_train[2:], v)),
            )
            for t, v in zip(test_correct, val_correct, strict=True)
        ]
    )


def test_selection_rules_pick_the_last_the_validation_best_or_flag_the_test_oracle():
    y = torch.tensor([0, 1, 0, 1])
    inference = _epochs(test_correct=[1, 4, 2, 3], val_correct=[0, 1, 2, 2])
    value, details = score_inference(inference, y, y, "accuracy", "last")
    assert (value, details["selected_epoch"], details["selection"]) == (0.75, 3, "last")
    value, details = score_inference(inference, y, y, "accuracy", "validation")
    assert (value, details["selected_epoch"]) == (0.75, 3)  # best validation score, latest among ties
    assert details["validation_curve"] == [0.0, 0.5, 1.0, 1.0]
    value, details = score_inference(inference, y, y, "accuracy", "test_oracle")
    assert (value, details["selected_epoch"], details["selection"]) == (1.0, 1, "test_oracle")


def test_the_default_selection_is_never_the_test_oracle_and_best_is_refused_with_the_way_out():
    result = vb.run(minimal(train={"epochs": 2}, attacks=[{"name": "model_completion", "epochs": 3}]))
    assert result.attacks[0].details["selection"] == "last"
    with pytest.raises(ConfigError, match="test_oracle"):
        vb.run(minimal(attacks=[{"name": "model_completion", "select": "best"}]))


def test_validation_selection_fine_tunes_on_the_remaining_known_labels():
    result = vb.run(
        minimal(
            train={"epochs": 2},
            attacks=[{"name": "model_completion", "epochs": 3, "known_per_class": 4, "select": "validation"}],
        )
    )
    details = result.attacks[0].details
    assert details["selection"] == "validation" and details["validation_labels"] == 10
    assert details["known_labels"] == 30 and len(details["validation_curve"]) == 3
    with pytest.raises(ConfigError, match="leaves none to fine-tune"):
        vb.run(minimal(attacks=[{"name": "model_completion", "known_per_class": 1, "select": "validation"}]))


# -- repeats ------------------------------------------------------------------------------------------------------


def test_repeats_are_independent_attack_runs_on_one_trained_model():
    attacks = [{"name": "model_completion", "epochs": 5}]
    single = vb.run(minimal(train={"epochs": 3}, attacks=attacks))
    repeated = vb.run(minimal(train={"epochs": 3}, attacks=attacks, evaluation={"repeats": 3}))
    assert repeated.utility.value == single.utility.value  # the same trained model
    mc = repeated.attacks[0]
    assert len(mc.leakages) == 3 and len(set(mc.leakages)) > 1  # its own stream and known labels each
    assert mc.leakages[0] == single.attacks[0].leakage  # repeat 0 is the single run's draw
    assert mc.leakage == pytest.approx(sum(mc.leakages) / 3)
    assert mc.ci_basis == "repeats" and mc.leakage_ci[0] < mc.leakage < mc.leakage_ci[1]
    assert single.attacks[0].leaks_without_defense is None  # one measurement: no interval, unknown


# -- one scenario per seed ----------------------------------------------------------------------------------------


def test_the_attack_list_does_not_change_the_trained_model():
    data = {"name": "digits", "parties": 2, "aux_pool": 0.2}
    alone = vb.run(minimal(data=data, train={"epochs": 3}, attacks=[{"name": "model_completion", "epochs": 5}]))
    more = vb.run(
        minimal(
            data=data,
            train={"epochs": 3},
            attacks=[{"name": "model_completion", "epochs": 5}, {"name": "sdar"}, {"name": "grna", "epochs": 1}],
        )
    )
    assert alone.utility.value == more.utility.value and alone.utility.per_epoch == more.utility.per_epoch
    assert alone.attacks[0].value == more.attacks[0].value
    assert alone.data["n_held_out"] == more.data["n_held_out"] == round(0.2 * alone.data["n_train"])


def test_an_attack_with_a_disjoint_aux_set_needs_the_pool_and_cannot_exceed_it():
    with pytest.raises(ConfigError, match="data.aux_pool"):
        vb.run(minimal(attacks=[{"name": "sdar"}]))
    with pytest.raises(ConfigError, match="pool .* holds 144"):
        vb.run(
            minimal(
                data={"name": "digits", "parties": 2, "aux_pool": 0.1}, attacks=[{"name": "sdar", "aux_fraction": 0.5}]
            )
        )
    with pytest.raises(ConfigError, match="aux_pool"):
        build_config(minimal(data={"name": "digits", "parties": 2, "aux_pool": 0.7}))


# -- no credit for doing nothing ----------------------------------------------------------------------------------


def _summary_rows(
    defense: str, strength: float | None, leak: list[float], undefended: list[float], loss: float
) -> list[dict]:
    return [
        {
            "dataset": "d",
            "algorithm": "vhnn",
            "setting": "",
            "defense": defense,
            "strength": strength,
            "seed": s,
            "attack": "a",
            "attack_target": "labels",
            "attack_metric": "auc",
            "utility": 0.9,
            "utility_loss": loss,
            "leakage": v,
            "undefended_leakage": u,
            "confidence": 0.95,
        }
        for s, (v, u) in enumerate(zip(leak, undefended, strict=True))
    ]


def _scores(rows: list[dict]) -> pd.DataFrame:
    from vflbench.experiment.sweep import _group_statistics

    table = pd.DataFrame(rows)
    _group_statistics(table, [([r["leakage"]], [r["undefended_leakage"]]) for r in rows])
    return scores_table(table)


def test_a_defense_that_changes_nothing_is_not_significant_and_ranks_below_no_protect():
    undefended = [10.0, 12.0, 11.0]
    rows = (
        _summary_rows("none", None, undefended, undefended, 0.0)
        + _summary_rows("noop", 0.5, [10.5, 11.5, 11.2], undefended, 2.8)  # no change, costs accuracy
        + _summary_rows("real", 1.0, [2.0, 3.0, 2.5], undefended, 0.5)
    )
    scores = _scores(rows).set_index("defense")
    assert list(scores.index) == ["real", "none", "noop"]
    assert not scores.loc["noop", "significant"] and not pd.isna(scores.loc["noop", "significant"])
    assert scores.loc["noop", "verdict"] == "no measurable protection" and pd.isna(scores.loc["noop", "s_pu"])
    assert "no measurable protection" in scores.loc["noop", "note"]
    assert scores.loc["real", "verdict"] == "protects" and scores.loc["real", "s_pu"] == 5
    assert scores.loc["none", "s_pu"] == 0


def test_a_sweep_with_a_defense_that_changes_nothing_gives_it_no_pu_score(tmp_path):
    cfg = minimal(
        data={"name": "breast_cancer", "parties": 2},
        train={"epochs": 3, "metric": "auc", "batch_size": 32, "lr": 0.05, "momentum": 0.0},
        attacks=[{"name": "direction_scoring", "known_per_class": 1}],
        defenses=[{"name": "isotropic_noise", "strength": 1e-9}],
        sweep={"seeds": [0, 1, 2]},
    )
    vb.sweep(cfg, out=tmp_path)
    scores = pd.read_csv(tmp_path / "scores.csv").set_index("defense")
    assert not scores.loc["isotropic_noise", "significant"]
    assert scores.loc["isotropic_noise", "verdict"] == "no measurable protection"
    assert pd.isna(scores.loc["isotropic_noise", "s_pu"]) and scores.loc["none", "s_pu"] == 0
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert {"leakage_ci_low", "leakage_ci_high", "delta_ci_low", "delta_ci_high"} <= set(summary.columns)
    report = build_report(tmp_path).read_text()
    assert "no measurable protection" in report and "nan" not in report.lower()
