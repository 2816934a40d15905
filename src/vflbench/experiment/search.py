"""The attacker search (``evaluation.attacker_search``): the strongest setting of each attack that the attacker
itself can select, run beside the default attacker.

A defense is only as good as the strongest attacker its threat model allows. Every attack declares a small grid
of its own settings (:attr:`~vflbench.attacks.base.Attack.search_space`, narrowed per instance by
:meth:`~vflbench.attacks.base.Attack.search_grid`). On one trained model the runner tries the default setting and
the others of the grid (a seeded random subset when the grid holds more than ``evaluation.search_budget``
settings), scores each on rows the attacker owns and did not use, and runs the best with the configured repeats:

* a label attack on a **validation split of its known labels** (``val_per_class`` rows of every class, drawn once
  per attack and held out of every setting's fine-tuning: :attr:`~vflbench.attacks.base.PartyView.holdout`),
  scored under the attack's metric at the epoch its own selection rule reports (the last epoch under
  ``select: last``; the best validation epoch under ``validation`` and, as the nearest rule an attacker can run,
  under ``test_oracle``);
* a feature attack on a **held-out part of its auxiliary rows** (:data:`HOLDOUT_SHARE` of them): every setting
  fits on the rest, reconstructs the held-out rows from the embeddings the victim sends for them at inference
  time, and is scored by the MSE against their features, which the attacker knows.

Selection never reads a test label or a test feature: it sees only the attacker's own labels and auxiliary rows
(the functions here take no ground truth). The default setting comes first and wins ties, so the search changes
the attacker only when its own rows say another setting does better. The chosen attacker is then scored like
the default one (its value, its prior with the same setting, its leakage per repeat, with the same repeat
streams, so the two are compared on the same draws). Its numbers go into :class:`AttackResult`'s ``*_worst``
fields and ``attacker_setting``; ``details["search"]`` records every setting tried with its validation score.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from vflbench.attacks.base import (
    Attack,
    AuxData,
    FeatureAttack,
    FeatureInference,
    KnownLabels,
    LabelAttack,
    LabelInference,
    PartyView,
    Scale,
    Scenario,
    Scores,
    draws_of,
    split_validation,
    victims_of,
)
from vflbench.attacks.registry import create_attack
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.experiment.plan import AttackPlan, PlannedAttack, scenario_of
from vflbench.experiment.results import AttackResult
from vflbench.experiment.scoring import _label_inference, _per_batch, attack_metric, repeated
from vflbench.experiment.views import _view, query_embeddings
from vflbench.metrics.scores import leakage_points
from vflbench.metrics.stats import mean_interval
from vflbench.rng import generator

if TYPE_CHECKING:
    from vflbench.experiment.results import TrainedRun

log = logging.getLogger(__name__)

#: The share of a feature attack's auxiliary rows held out to score its settings on.
HOLDOUT_SHARE = 0.2
#: The fewest auxiliary rows a feature attack needs for a search: two to fit on, two to score on.
MIN_AUX_ROWS = 4
DEFAULT_ONLY = (
    "default attacker only: its settings act during training (or it has none to search), so they "
    "cannot be searched on one trained model"
)


def candidate_settings(
    attack: Attack, scenario: Scenario, budget: int, stream: torch.Generator
) -> tuple[list[dict[str, Any]], int]:
    """The settings the search tries (the default first, then at most ``budget - 1`` others of the grid, a
    random subset drawn from ``stream`` when there are more) and the number of distinct settings in the grid
    (the default included). No settings when the attack has no grid here."""
    grid = attack.search_grid(scenario)
    if not grid:
        return [], 0
    keys = list(grid)
    default = {k: getattr(attack, k) for k in keys}
    others: list[dict[str, Any]] = []
    for values in itertools.product(*(grid[k] for k in keys)):
        setting = {k: v.of(default[k]) if isinstance(v, Scale) else v for k, v in zip(keys, values, strict=True)}
        if setting != default and setting not in others:
            others.append(setting)
    size = len(others) + 1
    if len(others) > budget - 1:
        pick = torch.randperm(len(others), generator=stream)[: budget - 1].sort().values
        others = [others[int(i)] for i in pick]
    return [default, *others], size


def with_setting(planned: PlannedAttack, setting: Mapping[str, Any], scenario: Scenario) -> PlannedAttack:
    """``planned`` with its attack's parameters ``setting`` changed. The new parameters pass the registry's
    checks and the attack's own (a fresh instance is built and checked); the attack keeps what it recorded
    during training (its state is shared with the trained instance, whose parameters are left as they were)."""
    attack = planned.attack
    params = {**planned.spec_params, **setting}
    fresh = create_attack(attack.name, **params)
    fresh.check(scenario)
    candidate = copy.copy(attack)
    for key in setting:
        setattr(candidate, key, getattr(fresh, key))
    return dataclasses.replace(planned, attack=candidate, spec_params=params)


def choose(trials: Sequence[Mapping[str, Any]]) -> int:
    """The index of the trial with the best validation score (higher is better; the earliest among ties, so the
    default setting, tried first, wins a tie). Trials without a score (refused settings) are never chosen."""
    scored = [
        (t["score"], -i) for i, t in enumerate(trials) if t.get("score") is not None and not math.isnan(t["score"])
    ]
    if not scored:
        raise CompatibilityError("the attacker search could not score any setting on the attacker's validation rows")
    return -max(scored)[1]


def label_holdout(known: KnownLabels, val_per_class: int, stream: torch.Generator) -> KnownLabels:
    """``val_per_class`` of the known labels of every class, the rows every setting of a label attack is scored
    on and none fine-tunes on."""
    _, held = split_validation(known, "validation", val_per_class, stream)
    assert held is not None
    return held


def score_known(scores: Scores, known: KnownLabels, metric: str) -> float | None:
    """The ``metric`` of ``scores`` of rows of ``known`` against the labels the attacker knows for them (no other
    ground truth is read)."""
    ids = known.ids.cpu()
    order = torch.argsort(ids)
    at = torch.searchsorted(ids[order], scores.ids.cpu()).clamp(max=len(ids) - 1)
    if not torch.equal(ids[order][at], scores.ids.cpu()):
        raise CompatibilityError("the attack scored rows other than the validation rows it was given")
    truth = known.labels.cpu()[order][at]
    return _per_batch([Scores(torch.arange(len(truth)), scores.scores.cpu())], truth, metric)[0]


def label_validation_score(inference: LabelInference, holdout: KnownLabels, metric: str, select: str) -> float | None:
    """A label attack's score of the held-out known labels, at the epoch its selection rule reports (the last
    under ``last``; the best validation epoch otherwise: ``test_oracle`` has no attacker's counterpart but this)."""
    if inference.per_epoch:
        if any(e.validation is None for e in inference.per_epoch):
            raise CompatibilityError(
                "the attack returned no scores of the held-out known labels, so its settings cannot be compared"
            )
        curve = [score_known(e.validation, holdout, metric) for e in inference.per_epoch]  # type: ignore[arg-type]
        if select == "last":
            return curve[-1]
        finite = [v for v in curve if v is not None]
        return max(finite) if finite else None
    if inference.validation is None:
        raise CompatibilityError(
            "the attack returned no scores of the held-out known labels, so its settings cannot be compared"
        )
    return score_known(inference.validation, holdout, metric)


def split_aux(aux: AuxData, stream: torch.Generator) -> tuple[AuxData, Tensor]:
    """The part of ``aux`` every setting of a feature attack fits on, and the positions of the held-out rows
    (:data:`HOLDOUT_SHARE`, at least two, leaving at least two)."""
    n = len(aux.ids)
    held = max(2, round(HOLDOUT_SHARE * n))
    if n - held < 2:
        raise CompatibilityError(
            f"the attacker search holds out {held} of the {n} auxiliary rows to score settings "
            f"on, which leaves fewer than 2 to fit on; give the attack at least {MIN_AUX_ROWS}"
        )
    order = torch.randperm(n, generator=stream)
    out, keep = order[:held].sort().values, order[held:].sort().values
    fit = AuxData(
        aux.ids[keep],
        None if aux.own is None else aux.own[keep],
        aux.victim[keep],
        aux.labels[keep],
        aux.victim_party,
        aux.classes,
        aux.victim_widths,
    )
    return fit, out


def feature_validation_mse(inference: FeatureInference, aux: AuxData, held: Tensor) -> float:
    """The reconstruction MSE of the held-out auxiliary rows (whose features the attacker knows)."""
    truth = aux.victim[held].float()
    if not torch.equal(inference.ids.cpu(), aux.ids[held].cpu()):
        raise CompatibilityError("the attack reconstructed rows other than the held-out auxiliary rows it was given")
    recon = torch.nan_to_num(
        inference.features.detach().float().to(truth.device).reshape(truth.shape), nan=0.0, posinf=0.0, neginf=0.0
    )
    return float(((recon - truth) ** 2).mean())


class _Validation:
    """What every setting of one attack is scored on: the attacker's view of repeat 0 with the rows it holds out,
    and the same fresh search stream for every setting."""

    def __init__(self, planned: PlannedAttack, run: TrainedRun, metric: str) -> None:
        attack = planned.attack
        self.seed = run.config.seed
        self.name = draws_of(attack)
        self.metric = metric
        self.run = run
        base = _view(run, planned)
        if isinstance(attack, FeatureAttack):
            if base.aux is None or len(base.aux.ids) < MIN_AUX_ROWS:
                raise CompatibilityError(
                    f"the attacker search scores {attack.name}'s settings on held-out auxiliary "
                    f"rows, but it has {0 if base.aux is None else len(base.aux.ids)} (at least "
                    f"{MIN_AUX_ROWS} are needed)"
                )
            self.aux = base.aux
            fit, self.held = split_aux(base.aux, self._stream("holdout"))
            received = [
                query_embeddings(run.federation, victim, base.aux.ids[self.held], "train")
                for victim in victims_of(attack)
            ]
            self.view = dataclasses.replace(base, aux=fit, received=received)
            self.selected_on = (
                f"{len(self.held)} of the attacker's {len(base.aux.ids)} auxiliary rows, held out of "
                "every setting's fit (reconstruction MSE)"
            )
        else:
            if base.known is None:
                raise CompatibilityError(
                    f"the attacker search scores {attack.name}'s settings on its known labels, but it has none"
                )
            self.holdout = label_holdout(base.known, int(getattr(attack, "val_per_class", 1)), self._stream("holdout"))
            self.view = dataclasses.replace(base, holdout=self.holdout)
            self.selected_on = (
                f"{len(self.holdout.ids)} of the attacker's {len(base.known.ids)} known labels, held "
                f"out of every setting's fine-tuning ({metric})"
            )

    def _stream(self, *what: str) -> torch.Generator:
        return generator(self.seed, "attack", self.name, "search", *what)

    def score(self, planned: PlannedAttack) -> float | None:
        """The setting's validation score (higher is better: minus the MSE for a feature attack)."""
        attack = planned.attack
        view: PartyView = dataclasses.replace(self.view, generator=self._stream("run"))
        inference = attack.infer(view)
        if isinstance(attack, FeatureAttack):
            if not isinstance(inference, FeatureInference):
                raise CompatibilityError(f"feature attack {attack.name!r} returned {type(inference).__name__}")
            return -feature_validation_mse(inference, self.aux, self.held)
        return label_validation_score(
            _label_inference(inference), self.holdout, self.metric, getattr(attack, "select", "last")
        )


def search_attack(planned: PlannedAttack, run: TrainedRun, result: AttackResult) -> None:
    """Run the attacker search for one attack whose default ``result`` is scored; fill in its ``*_worst`` fields,
    ``attacker_setting`` and ``details["search"]`` (module docstring)."""
    attack = planned.attack
    evaluation = run.config.evaluation
    scenario = scenario_of(run.config, run.data)
    settings, size = candidate_settings(
        attack,
        scenario,
        evaluation.search_budget,
        generator(run.config.seed, "attack", draws_of(attack), "search", "grid"),
    )
    if not settings:
        result.details["search"] = {"status": "default attacker only", "why": DEFAULT_ONLY}
        return
    metric = attack_metric(planned, run)
    validation = _Validation(planned, run, metric)
    trials: list[dict[str, Any]] = []
    candidates: list[PlannedAttack | None] = []
    for setting in settings:
        trial: dict[str, Any] = {"setting": setting}
        try:
            candidate = with_setting(planned, setting, scenario)
            trial["score"] = validation.score(candidate)
        except (ValueError, TypeError, CompatibilityError, ConfigError) as exc:  # a setting this scenario refuses
            candidate, trial["refused"] = None, str(exc)
        if trial.get("score") is not None:
            trial["validation"] = -trial["score"] if attack.target == "features" else trial["score"]
        log.info("attacker search %s: %s -> %s", attack.name, setting, trial.get("validation", trial.get("refused")))
        trials.append(trial)
        candidates.append(candidate)
    best = choose(trials)
    chosen, planned_best = settings[best], candidates[best]
    assert planned_best is not None
    if best == 0:  # the default attacker won: its scored repeats are the searched attacker's
        values, priors, leakages = list(result.values), list(result.priors), list(result.leakages)
    else:
        outcomes = repeated(planned_best, run, metric)
        values = [v for v, _, _ in outcomes]
        priors = [p for _, p, _ in outcomes]
        leakages = [leakage_points(metric, v, p) for v, p in zip(values, priors, strict=True)]
    interval = mean_interval({run.config.seed: leakages}, evaluation.confidence)
    result.attacker_setting = dict(chosen)
    result.value_worst = sum(values) / len(values)
    result.prior_worst = sum(priors) / len(priors)
    result.leakage_worst = sum(leakages) / len(leakages)
    result.leakages_worst = leakages
    result.leakage_worst_ci = [interval.low, interval.high] if interval.defined else None
    result.details["search"] = {
        "status": "searched",
        "grid_size": size,
        "budget": evaluation.search_budget,
        "selected_on": validation.selected_on,
        "validation_metric": metric,
        "tried": [{k: v for k, v in t.items() if k != "score"} for t in trials],
        "chosen": dict(chosen),
        "chosen_is_default": best == 0,
    }


def search_attacks(plan: AttackPlan, run: TrainedRun, results: Sequence[AttackResult]) -> dict[str, float]:
    """The attacker search for every attack of ``plan`` (whose default results are ``results``, in order) when
    ``evaluation.attacker_search`` is on; return the seconds each took (keyed ``"<attack> (search)"``)."""
    seconds: dict[str, float] = {}
    if not run.config.evaluation.attacker_search:
        return seconds
    for planned, result in zip(plan.attacks, results, strict=True):
        tic = time.perf_counter()
        search_attack(planned, run, result)
        key, n = f"{planned.attack.name} (search)", 1
        while key in seconds:
            n += 1
            key = f"{planned.attack.name} (search)#{n}"
        seconds[key] = time.perf_counter() - tic
    return seconds


def check_search(plan: AttackPlan) -> None:
    """Before training: every label attack the search will score on held-out known labels has more known labels
    per class than it holds out (``val_per_class``)."""
    assert plan.scenario is not None
    for planned in plan.attacks:
        attack = planned.attack
        if not isinstance(attack, LabelAttack) or not attack.search_grid(plan.scenario):
            continue
        held = attack.val_per_class
        if attack.known_per_class <= held:
            raise ConfigError(
                f"attack {attack.name!r}: the attacker search scores its settings on val_per_class "
                f"({held}) of its known labels of every class, held out of their fine-tuning, but "
                f"known_per_class is {attack.known_per_class}; raise known_per_class or turn "
                "evaluation.attacker_search off"
            )
