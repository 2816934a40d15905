"""Scoring attacks on a trained run against ground truth and priors.

The runner is the only place that holds ground truth. It checks every attack against the
scenario before training, tells the attacker's transcript what to retain, installs each
attack on its own party (:meth:`Attack.install`: observers, or a malicious attack's changes to its party), then
builds the attacker's :class:`PartyView`, runs the attack, and scores what it returns.

Feature attacks (:class:`FeatureInference`) are scored by the reconstruction MSE against the
victim's true features of the target rows (metric ``"mse"``, lower is more leakage; SSIM too
for images, and the embedding MSE/cosine distance of the attacker's shadow model, DMAVFL
Table 1). Their prior is the MSE of guessing the mean of the victim's slice over the attacker's
auxiliary rows (the training mean when it has none), and ``leakage = 100·(1 - MSE / prior)``
in points (higher = more leakage, as for label attacks): the share of the guess's error the
attack removes, positive when it beats the guess. For images ``details`` also hold
``prior_ssim`` (the SSIM of the same mean guess) and ``ssim_leakage = 100·(SSIM - prior_ssim)``.
A reconstruction is checked against the range of the victim's slice on the same reference rows
(:func:`out_of_range_share`): ``details.out_of_range_share`` is the share of its values outside
(``truth_out_of_range_share`` that of the true values, which the reference rows need not bound), and
``details.out_of_range`` flags it (with a warning) when the first exceeds the second by more than
:data:`OUT_OF_RANGE_FLAG`, so that an attack that reconstructs values the data do not take is not reported as a
bare MSE.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from vflbench.attacks.base import (
    AuxData,
    FeatureAttack,
    FeatureInference,
    LabelAttack,
    LabelInference,
    Scores,
    victims_of,
)
from vflbench.errors import CompatibilityError
from vflbench.experiment.plan import AttackPlan, PlannedAttack, victim_features
from vflbench.experiment.results import AttackResult
from vflbench.experiment.views import _view, scratch_models
from vflbench.metrics.auc import batched_binary_auc
from vflbench.metrics.scores import direction_of, leakage_points
from vflbench.metrics.stats import mean_interval
from vflbench.models.finetune import EVAL_BATCH
from vflbench.protocol.messages import passive_index

if TYPE_CHECKING:
    from vflbench.experiment.results import TrainedRun


log = logging.getLogger(__name__)


#: A task is imbalanced when its largest class has more than this many times the rows of its smallest.
IMBALANCE_RATIO = 1.5
#: A reconstructed value is out of range when it lies outside the data's range on the reference rows by more than
#: this share of the whole slice's range (:func:`out_of_range_share`).
OUT_OF_RANGE_MARGIN = 0.05
#: A reconstruction is flagged ``out_of_range`` when the share of its values out of range exceeds the share of the
#: true values out of the same range (rows the reference rows do not bound) by more than this.
OUT_OF_RANGE_FLAG = 0.05


def imbalanced(y: Tensor, num_classes: int) -> bool:
    """Whether the classes of ``y`` are imbalanced (:data:`IMBALANCE_RATIO`)."""
    counts = torch.bincount(y.long(), minlength=num_classes)
    return bool(counts.max() > IMBALANCE_RATIO * counts.min())


def metric_name(y_train: Tensor, num_classes: int, metric: str = "auto") -> str:
    """``metric`` as chosen; ``"auto"``: AUC for binary tasks (Kang Table 7), balanced accuracy for imbalanced
    tasks of more classes (a majority-class guess scores 1/C there, not the majority's share), accuracy otherwise
    (VMask Table II)."""
    if metric != "auto":
        return metric
    if num_classes == 2:
        return "auc"
    return "balanced_accuracy" if imbalanced(y_train, num_classes) else "accuracy"


def _finite(s: Scores, like: Tensor) -> Tensor:
    """A score set's scores with non-finite entries (a diverged model) as ties at zero, on ``like``'s device (the
    ground truth's: an attack may return its scores from another device)."""
    return torch.nan_to_num(s.scores.detach().float().to(like.device), nan=0.0, posinf=0.0, neginf=0.0)


def _positive(scores: Tensor) -> Tensor:
    """The positive class's score of each row (the last column of a two-column score set)."""
    return scores if scores.dim() == 1 else scores[:, -1]


def _balanced_accuracy(predicted: Tensor, y: Tensor) -> float:
    """The mean over the classes present in ``y`` of the share of their rows predicted correctly."""
    return float(torch.stack([(predicted[y == c] == c).float().mean() for c in torch.unique(y)]).mean())


def _per_batch(sets: Sequence[Scores], y: Tensor, metric: str) -> list[float | None]:
    """The metric of every score set (``None`` for an AUC of a set with a single class).

    AUCs of all sets are computed in one vectorised pass (:func:`batched_binary_auc`).
    """
    if metric == "auc":
        aucs = batched_binary_auc([_positive(_finite(s, y)) for s in sets], [y[s.ids] for s in sets])
        return [None if v != v else v for v in aucs.tolist()]
    out: list[float | None] = []
    for s in sets:
        scores = _finite(s, y)
        predicted = scores.argmax(1) if scores.dim() == 2 else (scores > 0.5).long()
        truth = y[s.ids]
        out.append(
            _balanced_accuracy(predicted, truth)
            if metric == "balanced_accuracy"
            else float((predicted == truth).float().mean())
        )
    return out


def _score(s: Scores, y: Tensor, metric: str) -> float | None:
    """The metric of one score set; non-finite scores (a diverged model) count as ties."""
    return _per_batch([s], y, metric)[0]


def constant_guess(metric: str, groups: Sequence[Tensor]) -> float:
    """The best score a constant prediction reaches on the scored rows (the mean over ``groups``, each the labels
    of one scored set): the majority class's share for accuracy, ``1/C`` (of the classes present) for balanced
    accuracy, 0.5 for AUC. No attacker that predicts a constant can score above it."""
    if metric == "auc" or not groups:
        return 0.5
    values = []
    for y in groups:
        counts = torch.bincount(y.long())
        values.append(float(counts.max()) / len(y) if metric == "accuracy" else 1.0 / int((counts > 0).sum()))
    return sum(values) / len(values)


def _select(
    inf: LabelInference, values: list[float], y_train: Tensor, metric: str, select: str, details: dict[str, Any]
) -> int:
    """The epoch of ``inf.per_epoch`` the selection rule picks (``values``: each epoch's test score)."""
    if select == "last":
        return len(values) - 1
    if select == "test_oracle":
        return max(range(len(values)), key=values.__getitem__)
    assert inf.per_epoch is not None
    if select != "validation" or any(e.validation is None for e in inf.per_epoch):
        raise CompatibilityError(f"selection {select!r} needs the attack's validation scores, which it did not return")
    val = [_score(e.validation, y_train, metric) for e in inf.per_epoch]  # type: ignore[arg-type]
    details["validation_curve"] = val
    scored = [(v if v is not None else -math.inf, i) for i, v in enumerate(val)]
    return max(scored)[1]  # the best validation score, the latest epoch among ties


def score_inference(
    inf: LabelInference, y_train: Tensor, y_test: Tensor, metric: str, select: str = "last"
) -> tuple[float, dict[str, Any]]:
    """The attack's value under ``metric`` and diagnostics (per-split values, batches used, the selection rule
    and the epoch it picked, and ``constant_guess``: what a constant prediction scores on the same rows)."""
    details: dict[str, Any] = dict(inf.details)
    if inf.per_epoch:
        values = [score_inference(e, y_train, y_test, metric)[0] for e in inf.per_epoch]
        details["finetune_curve"] = values
        chosen = _select(inf, values, y_train, metric, select, details)
        value, inner = score_inference(inf.per_epoch[chosen], y_train, y_test, metric)
        details.update(inner, selected_epoch=chosen, selection=select)
        return value, details
    details["selection"] = "last"
    if inf.batches:
        scored = [
            (v, s) for v, s in zip(_per_batch(inf.batches, y_train, metric), inf.batches, strict=True) if v is not None
        ]
        if not scored:
            raise CompatibilityError("no batch had both classes, so no AUC could be computed")
        details.update(
            batches_scored=len(scored),
            batches_seen=len(inf.batches),
            constant_guess=constant_guess(metric, [y_train[s.ids] for _, s in scored]),
        )
        return float(sum(v for v, _ in scored) / len(scored)), details
    by_split: dict[str, float | None] = {}
    for split, s, y in (("train", inf.train, y_train), ("test", inf.test, y_test)):
        if s is not None:
            by_split[split] = _score(s, y, metric)
    if not by_split:
        raise CompatibilityError("the attack returned no inference to score")
    details.update({f"{k}_{metric}": v for k, v in by_split.items()})
    split = "test" if by_split.get("test") is not None else "train"
    if by_split.get(split) is None:
        raise CompatibilityError(f"the attack's {metric} is undefined on every split it returned (one class only)")
    details["scored_split"] = split
    if split == "train" and "test" in by_split:
        details["split_fallback"] = (
            f"the test {metric} is undefined (the test rows hold one class), "
            "so the attack is scored on the training split"
        )
        log.warning("attack scored on the training split: %s", details["split_fallback"])
    scores = inf.test if split == "test" else inf.train
    assert scores is not None
    details["constant_guess"] = constant_guess(metric, [(y_test if split == "test" else y_train)[scores.ids]])
    picked = by_split[split]
    assert picked is not None
    return float(picked), details


def random_prior(metric: str, num_classes: int) -> float:
    """A random classifier's expected score (the prior is never below :func:`constant_guess` either)."""
    return 0.5 if metric == "auc" else 1.0 / num_classes


def out_of_range_share(recon: Tensor, reference: Tensor) -> float:
    """The share of the values of ``recon`` outside the data's range on the ``reference`` rows, widened on both sides
    by :data:`OUT_OF_RANGE_MARGIN` times the range of the whole reference slice: each feature's own minimum and
    maximum for a tabular slice (rows x features), the slice's for an image strip (every pixel takes the same range,
    and a pixel that happens to be blank in the reference rows is no bound). Non-finite values count as outside."""
    ref = reference.float()
    if ref.dim() == 2:
        low, high = ref.amin(0, keepdim=True), ref.amax(0, keepdim=True)
    else:
        low, high = ref.min(), ref.max()
    margin = OUT_OF_RANGE_MARGIN * float(ref.max() - ref.min())
    outside = ~torch.isfinite(recon) | (recon < low - margin) | (recon > high + margin)
    return float(outside.float().mean())


def feature_prior(truth: Tensor, aux: AuxData | None, train_slice: Tensor | None) -> float:
    """MSE of guessing the per-feature mean of the victim's slice (aux rows, else all training rows)."""
    reference = aux.victim if aux is not None else train_slice
    assert reference is not None, "feature_prior needs the aux rows or the training slice"
    mean = reference.float().mean(0, keepdim=True)
    return float(((truth.float() - mean) ** 2).mean())


@torch.no_grad()
def score_features(
    inf: FeatureInference, run: TrainedRun, victims: Sequence[str], aux: AuxData | None
) -> tuple[float, float, dict[str, Any]]:
    """Reconstruction MSE (the value), the aux-mean prior, and diagnostics of a feature attack.

    ``details``: ``mse`` per split, ``ssim`` for image slices (Wang et al. 2004, 11x11 Gaussian
    window, sigma 1.5, data range 1), ``emb_mse``/``emb_cos`` between the attacker's shadow
    model and the victim's real bottom model on the true features of the target rows (cosine
    distance ``1 - cos`` of the embeddings, DMAVFL Table 1), and ``n_targets``. With several
    victims the truth is their slices concatenated along the last axis, and the real
    embeddings are each victim's bottom model on its own slice, concatenated.
    """
    from vflbench.metrics.reconstruction import ssim

    part = run.data.passive[passive_index(victims[0])]
    truth, widths = victim_features(run.data, victims, inf.split, inf.ids)
    truth = truth.float()
    train_slice = victim_features(run.data, victims, "train")[0] if aux is None else None
    recon = inf.features.detach().float().to(truth.device).reshape(truth.shape)
    reference = aux.victim if aux is not None else train_slice
    assert reference is not None
    outside = out_of_range_share(recon, reference.to(truth.device))
    natural = out_of_range_share(truth, reference.to(truth.device))
    recon = torch.nan_to_num(recon, nan=0.0, posinf=0.0, neginf=0.0)
    value = float(((recon - truth) ** 2).mean())
    prior = feature_prior(truth, aux, train_slice)
    details: dict[str, Any] = {
        **inf.details,
        "split": inf.split,
        "n_targets": len(inf.ids),
        "mse": value,
        "prior_mse": prior,
        "out_of_range_share": outside,
        "truth_out_of_range_share": natural,
        "out_of_range": outside > natural + OUT_OF_RANGE_FLAG,
        "range_reference": "aux rows" if aux is not None else "training slice",
    }
    if details["out_of_range"]:
        log.warning(
            "feature attack on %s: %.1f%% of the reconstructed values lie outside the range of the victim's "
            "slice on the %s (%.1f%% of the true values; MSE %.4g against the mean guess's %.4g): the attack "
            "reconstructs values the data do not take",
            "+".join(victims),
            100 * outside,
            details["range_reference"],
            100 * natural,
            value,
            prior,
        )
    if part.kind == "image" and truth.dim() == 4:
        details["ssim"] = float(ssim(recon, truth, data_range=1.0).mean())
        guess = reference.float().mean(0, keepdim=True).expand_as(truth).contiguous()
        details["prior_ssim"] = float(ssim(guess, truth, data_range=1.0).mean())
    details.update(_embedding_details(inf, run, victims, truth, widths))
    return value, prior, details


def _embedding_details(
    inf: FeatureInference, run: TrainedRun, victims: Sequence[str], truth: Tensor, widths: tuple[int, ...]
) -> dict[str, Any]:
    """``emb_mse``/``emb_cos`` of the shadow model against the victims' real bottom models (see
    :func:`score_features`), or why they were not computed; empty when the attack has no shadow model."""
    from vflbench.metrics.reconstruction import cosine_distance

    details: dict[str, Any] = {}
    bottoms = {v: run.federation.bottom_of(v) for v in victims}
    withheld = [v for v in victims if inf.shadow is not None and bottoms[v] is None]
    if withheld:  # a victim in its own process refused the evaluation-only query of its bottom model
        why = f"{', '.join(withheld)} refused evaluation-only queries of its bottom model (passive.oracle_bottom)"
        details["not_computed"] = {"emb_mse": why, "emb_cos": why}
        log.warning("feature attack scores emb_mse and emb_cos not computed: %s", why)
    elif inf.shadow is not None:
        inf.shadow.eval()
        real = torch.cat([_embed(bottoms[v], x) for v, x in zip(victims, truth.split(widths, -1), strict=True)], 1)
        est = torch.cat([inf.shadow(truth[i : i + EVAL_BATCH]) for i in range(0, len(truth), EVAL_BATCH)])
        details["emb_mse"] = float(((est - real) ** 2).mean())
        details["emb_cos"] = float(cosine_distance(est, real).mean())
    return details


def _embed(bottom: nn.Module | None, x: Tensor) -> Tensor:
    """A victim's real bottom model on ``x`` in eval mode (its training mode restored)."""
    assert bottom is not None
    was = bottom.training
    bottom.eval()
    out = torch.cat([bottom(x[i : i + EVAL_BATCH]) for i in range(0, len(x), EVAL_BATCH)])
    bottom.train(was)
    return out


def _label_inference(inference: LabelInference | FeatureInference) -> LabelInference:
    if not isinstance(inference, LabelInference):
        raise CompatibilityError(f"a label attack returned {type(inference).__name__}")
    return inference


def _timing_key(seconds: dict[str, float], name: str) -> str:
    """``name``, or ``name#2``, ``name#3``, ... when the same attack is configured more than once."""
    key, n = name, 1
    while key in seconds:
        n += 1
        key = f"{name}#{n}"
    return key


def _feature_once(planned: PlannedAttack, run: TrainedRun, repeat: int) -> tuple[float, float, dict[str, Any]]:
    """One repeat of a feature attack: the reconstruction MSE, the aux-mean prior and the diagnostics."""
    attack = planned.attack
    assert isinstance(attack, FeatureAttack)
    view = _view(run, planned, repeat=repeat)
    inference = attack.infer(view)
    if not isinstance(inference, FeatureInference):
        raise CompatibilityError(f"feature attack {attack.name!r} returned {type(inference).__name__}")
    value, prior, details = score_features(inference, run, victims_of(attack), view.aux)
    details["selection"] = "last"
    if "ssim" in details:
        details["ssim_leakage"] = leakage_points("ssim", details["ssim"], details["prior_ssim"])
    return value, prior, details


def _label_once(
    planned: PlannedAttack, run: TrainedRun, metric: str, repeat: int
) -> tuple[float, float, dict[str, Any]]:
    """One repeat of a label attack: its value, its prior (never below what a constant guess scores on the same
    rows) and the diagnostics."""
    attack = planned.attack
    assert isinstance(attack, LabelAttack)
    y_train, y_test = run.data.y_train, run.data.y_test
    select = attack.select
    view = _view(run, planned, repeat=repeat)
    value, details = score_inference(_label_inference(attack.infer(view)), y_train, y_test, metric, select)
    if attack.prior == "random":
        model_prior = random_prior(metric, run.data.num_classes)
    else:
        models = scratch_models(run, attack.party, repeat)
        inference = (
            attack.infer(view.with_models(models))
            if attack.prior == "scratch"
            else attack.local(view.with_models(models))
        )
        model_prior, prior_details = score_inference(_label_inference(inference), y_train, y_test, metric, select)
        details[attack.prior] = prior_details
    floor = details.get("constant_guess", 0.5 if metric == "auc" else 0.0)
    details["prior_model"] = model_prior
    if floor > model_prior:
        details["prior_floor"] = (
            "the prior is what a constant guess scores on the same rows, "
            f"{floor:.4f}, above the {attack.prior} prior's {model_prior:.4f}"
        )
    return value, max(model_prior, floor), details


def attack_metric(planned: PlannedAttack, run: TrainedRun) -> str:
    """The metric ``planned``'s attack is scored under on ``run`` (``"mse"`` for a feature attack)."""
    attack = planned.attack
    if isinstance(attack, LabelAttack):
        return metric_name(run.data.y_train, run.data.num_classes, attack.metric)
    return "mse"


def repeated(planned: PlannedAttack, run: TrainedRun, metric: str) -> list[tuple[float, float, dict[str, Any]]]:
    """Every repeat's value, prior and diagnostics of ``planned``'s attack on ``run`` (``evaluation.repeats`` of
    them when the attack is repeatable, else one)."""
    attack = planned.attack
    repeats = run.config.evaluation.repeats if attack.repeatable else 1
    return [
        _label_once(planned, run, metric, r) if isinstance(attack, LabelAttack) else _feature_once(planned, run, r)
        for r in range(repeats)
    ]


def run_attacks(plan: AttackPlan, run: TrainedRun) -> tuple[list[AttackResult], dict[str, float]]:
    """Run every planned attack on ``run``; return scored results and seconds per attack.

    Every attack that declares itself ``repeatable`` runs ``evaluation.repeats`` times on the trained model,
    each repeat with its own random stream (and, unless it used them during training, its own known labels):
    its value, prior and leakage are the means over the repeats, which are kept (``values``, ``priors``,
    ``leakages``) with the interval they give (:func:`~vflbench.metrics.stats.mean_interval`).
    """
    results: list[AttackResult] = []
    seconds: dict[str, float] = {}
    evaluation = run.config.evaluation
    for planned in plan.attacks:
        attack = planned.attack
        tic = time.perf_counter()
        metric = attack_metric(planned, run)
        outcomes = repeated(planned, run, metric)
        repeats = len(outcomes)
        per_epoch = None
        if isinstance(attack, LabelAttack) and attack.every_epoch:
            select = attack.select
            per_epoch = []
            for snapshot in planned.snapshots:  # each epoch with the draws of a single run, as the final model
                view = _view(run, planned, {k: copy.deepcopy(m) for k, m in snapshot.items()})
                per_epoch.append(
                    score_inference(
                        _label_inference(attack.infer(view)),
                        run.data.y_train,
                        run.data.y_test,
                        metric,
                        select,
                    )[0]
                )
        seconds[_timing_key(seconds, attack.name)] = time.perf_counter() - tic
        values = [v for v, _, _ in outcomes]
        priors = [p for _, p, _ in outcomes]
        leakages = [leakage_points(metric, v, p) for v, p in zip(values, priors, strict=True)]
        interval = mean_interval({run.config.seed: leakages}, evaluation.confidence)
        details = {"params": planned.spec_params, **outcomes[0][2], "repeats": repeats}
        results.append(
            AttackResult(
                name=attack.name,
                target=attack.target,
                metric=metric,
                direction=direction_of(metric),
                value=sum(values) / repeats,
                prior=sum(priors) / repeats,
                prior_name=attack.prior if isinstance(attack, LabelAttack) else "aux_mean",
                leakage=sum(leakages) / repeats,
                per_epoch=per_epoch,
                details=details,
                values=values,
                priors=priors,
                leakages=leakages,
                leakage_ci=[interval.low, interval.high] if interval.defined else None,
                ci_basis=interval.basis,
            )
        )
    return results, seconds
