"""Scoring attacks on a trained run against ground truth and priors.

The runner is the only place that holds ground truth. It checks every attack against the
scenario before training, tells the attacker's transcript what to retain, installs the
attacker's own observers (and, for malicious attacks, lets it corrupt its own party), then
builds the attacker's :class:`PartyView`, runs the attack, and scores what it returns.

Feature attacks (:class:`FeatureInference`) are scored by the reconstruction MSE against the
victim's true features of the target rows (metric ``"mse"``, lower is more leakage; SSIM too
for images, and the embedding MSE/cosine distance of the attacker's shadow model, DMAVFL
Table 1). Their prior is the MSE of guessing the mean of the victim's slice over the attacker's
auxiliary rows (the training mean when it has none), and ``leakage = 100·(1 - MSE / prior)``
in points (higher = more leakage, as for label attacks): the share of the guess's error the
attack removes, positive when it beats the guess. For images ``details`` also hold
``prior_ssim`` (the SSIM of the same mean guess) and ``ssim_leakage = 100·(SSIM - prior_ssim)``.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from vflbench.attacks.base import (
    AuxData,
    FeatureInference,
    LabelInference,
    Scores,
    victims_of,
)
from vflbench.errors import CompatibilityError
from vflbench.experiment.plan import AttackPlan, victim_features
from vflbench.experiment.results import AttackResult
from vflbench.experiment.views import _view, scratch_models
from vflbench.metrics.auc import batched_binary_auc
from vflbench.metrics.scores import direction_of, leakage_points
from vflbench.models.finetune import EVAL_BATCH
from vflbench.protocol import PassiveParty
from vflbench.protocol.messages import passive_index

if TYPE_CHECKING:
    from vflbench.experiment.run import TrainedRun


log = logging.getLogger(__name__)


def metric_name(num_classes: int, metric: str = "auto") -> str:
    """``metric`` as chosen; ``"auto"``: AUC for binary tasks, accuracy otherwise (Kang Table 7; VMask Table II)."""
    if metric != "auto":
        return metric
    return "auc" if num_classes == 2 else "accuracy"


def _finite(s: Scores, like: Tensor) -> Tensor:
    """A score set's scores with non-finite entries (a diverged model) as ties at zero, on ``like``'s device (the
    ground truth's: an attack may return its scores from another device)."""
    return torch.nan_to_num(s.scores.detach().float().to(like.device), nan=0.0, posinf=0.0, neginf=0.0)


def _positive(scores: Tensor) -> Tensor:
    """The positive class's score of each row (the last column of a two-column score set)."""
    return scores if scores.dim() == 1 else scores[:, -1]


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
        out.append(float((predicted == y[s.ids]).float().mean()))
    return out


def _score(s: Scores, y: Tensor, metric: str) -> float | None:
    """The metric of one score set; non-finite scores (a diverged model) count as ties."""
    return _per_batch([s], y, metric)[0]


def score_inference(inf: LabelInference, y_train: Tensor, y_test: Tensor, metric: str,
                    select: str = "best") -> tuple[float, dict[str, Any]]:
    """The attack's value under ``metric`` and diagnostics (per-split values, batches used)."""
    details: dict[str, Any] = dict(inf.details)
    if inf.per_epoch:
        values = [score_inference(e, y_train, y_test, metric)[0] for e in inf.per_epoch]
        details["finetune_curve"] = values
        best = max(range(len(values)), key=values.__getitem__) if select == "best" else len(values) - 1
        value, inner = score_inference(inf.per_epoch[best], y_train, y_test, metric)
        details.update(inner, selected_epoch=best, select=select)
        return value, details
    if inf.batches:
        per_batch = [v for v in _per_batch(inf.batches, y_train, metric) if v is not None]
        if not per_batch:
            raise CompatibilityError("no batch had both classes, so no AUC could be computed")
        details.update(batches_scored=len(per_batch), batches_seen=len(inf.batches))
        return float(sum(per_batch) / len(per_batch)), details
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
        details["split_fallback"] = (f"the test {metric} is undefined (the test rows hold one class), "
                                     "so the attack is scored on the training split")
        log.warning("attack scored on the training split: %s", details["split_fallback"])
    chosen = by_split[split]
    assert chosen is not None
    return float(chosen), details


def random_prior(metric: str, num_classes: int) -> float:
    """A random classifier's expected score."""
    return 0.5 if metric == "auc" else 1.0 / num_classes


def feature_prior(truth: Tensor, aux: AuxData | None, train_slice: Tensor | None) -> float:
    """MSE of guessing the per-feature mean of the victim's slice (aux rows, else all training rows)."""
    reference = aux.victim if aux is not None else train_slice
    assert reference is not None, "feature_prior needs the aux rows or the training slice"
    mean = reference.float().mean(0, keepdim=True)
    return float(((truth.float() - mean) ** 2).mean())


@torch.no_grad()
def score_features(inf: FeatureInference, run: TrainedRun, victims: Sequence[str],
                   aux: AuxData | None) -> tuple[float, float, dict[str, Any]]:
    """Reconstruction MSE (the value), the aux-mean prior, and diagnostics of a feature attack.

    ``details``: ``mse`` per split, ``ssim`` for image slices (Wang et al. 2004, 11x11 Gaussian
    window, sigma 1.5, data range 1), ``emb_mse``/``emb_cos`` between the attacker's shadow
    model and the victim's real bottom model on the true features of the target rows (cosine
    distance ``1 - cos`` of the embeddings, DMAVFL Table 1), and ``n_targets``. With several
    victims the truth is their slices concatenated along the last axis, and the real
    embeddings are each victim's bottom model on its own slice, concatenated.
    """
    from vflbench.metrics.reconstruction import cosine_distance, ssim

    part = run.data.passive[passive_index(victims[0])]
    truth, widths = victim_features(run.data, victims, inf.split, inf.ids)
    truth = truth.float()
    train_slice = victim_features(run.data, victims, "train")[0] if aux is None else None
    recon = inf.features.detach().float().to(truth.device).reshape(truth.shape)
    recon = torch.nan_to_num(recon, nan=0.0, posinf=0.0, neginf=0.0)
    value = float(((recon - truth) ** 2).mean())
    prior = feature_prior(truth, aux, train_slice)
    details: dict[str, Any] = {**inf.details, "split": inf.split, "n_targets": len(inf.ids), "mse": value,
                               "prior_mse": prior}
    if part.kind == "image" and truth.dim() == 4:
        details["ssim"] = float(ssim(recon, truth, data_range=1.0).mean())
        reference = aux.victim if aux is not None else train_slice
        assert reference is not None
        guess = reference.float().mean(0, keepdim=True).expand_as(truth).contiguous()
        details["prior_ssim"] = float(ssim(guess, truth, data_range=1.0).mean())
    parties = {p.name: p for p in run.federation.passives}
    withheld = [v for v in victims if inf.shadow is not None and parties[v].bottom is None]
    if withheld:  # a victim in its own process refused the evaluation-only query of its bottom model
        why = f"{', '.join(withheld)} refused evaluation-only queries of its bottom model (passive.oracle_bottom)"
        details["not_computed"] = {"emb_mse": why, "emb_cos": why}
        log.warning("feature attack scores emb_mse and emb_cos not computed: %s", why)
    elif inf.shadow is not None:
        inf.shadow.eval()
        real = torch.cat([_embed(parties[v], x) for v, x in zip(victims, truth.split(widths, -1), strict=True)], 1)
        est = torch.cat([inf.shadow(truth[i : i + EVAL_BATCH]) for i in range(0, len(truth), EVAL_BATCH)])
        details["emb_mse"] = float(((est - real) ** 2).mean())
        details["emb_cos"] = float(cosine_distance(est, real).mean())
    return value, prior, details


def _embed(party: PassiveParty, x: Tensor) -> Tensor:
    """``party``'s real bottom model on ``x`` in eval mode (its training mode restored)."""
    assert party.bottom is not None
    was = party.bottom.training
    party.bottom.eval()
    out = torch.cat([party.bottom(x[i : i + EVAL_BATCH]) for i in range(0, len(x), EVAL_BATCH)])
    party.bottom.train(was)
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


def run_attacks(plan: AttackPlan, run: TrainedRun) -> tuple[list[AttackResult], dict[str, float]]:
    """Run every planned attack on ``run``; return scored results and seconds per attack."""
    results: list[AttackResult] = []
    seconds: dict[str, float] = {}
    y_train, y_test = run.data.y_train, run.data.y_test
    for planned in plan.attacks:
        attack = planned.attack
        tic = time.perf_counter()
        if attack.target == "features":
            view = _view(run, planned)
            inference = attack.infer(view)
            if not isinstance(inference, FeatureInference):
                raise CompatibilityError(f"feature attack {attack.name!r} returned {type(inference).__name__}")
            value, prior, details = score_features(inference, run, victims_of(attack), view.aux)
            seconds[_timing_key(seconds, attack.name)] = time.perf_counter() - tic
            if "ssim" in details:
                details["ssim_leakage"] = leakage_points("ssim", details["ssim"], details["prior_ssim"])
            results.append(AttackResult(name=attack.name, target=attack.target, metric="mse",
                                        direction=direction_of("mse"), value=value, prior=prior,
                                        prior_name="aux_mean", leakage=leakage_points("mse", value, prior),
                                        details={"params": planned.spec_params, **details}))
            continue
        metric = metric_name(run.data.num_classes, attack.metric)
        select = getattr(attack, "select", "best")
        view = _view(run, planned)
        value, details = score_inference(_label_inference(attack.infer(view)), y_train, y_test, metric, select)
        if attack.prior == "random":
            prior = random_prior(metric, run.data.num_classes)
        elif attack.prior == "scratch":
            scratch = _label_inference(attack.infer(view.with_models(scratch_models(run, attack.party))))
            prior, prior_details = score_inference(scratch, y_train, y_test, metric, select)
            details["scratch"] = prior_details
        else:
            local_view = view.with_models(scratch_models(run, attack.party))
            prior, prior_details = score_inference(attack.local(local_view), y_train, y_test, metric, select)
            details["local"] = prior_details
        per_epoch = None
        if attack.every_epoch:
            per_epoch = []
            for snapshot in planned.snapshots:
                models = {k: copy.deepcopy(m) for k, m in snapshot.items()}
                per_epoch.append(score_inference(_label_inference(attack.infer(view.with_models(models))), y_train,
                                                 y_test, metric, select)[0])
        seconds[_timing_key(seconds, attack.name)] = time.perf_counter() - tic
        results.append(AttackResult(name=attack.name, target=attack.target, metric=metric,
                                    direction=direction_of(metric), value=value, prior=prior,
                                    prior_name=attack.prior, leakage=leakage_points(metric, value, prior),
                                    per_epoch=per_epoch, details={"params": planned.spec_params, **details}))
    return results, seconds
