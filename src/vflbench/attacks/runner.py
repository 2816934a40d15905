"""Running attacks on a trained run: compatibility, views, priors, scoring.

The runner is the only place that holds ground truth. It checks every attack against the
scenario before training, tells the attacker's transcript what to retain, installs the
attacker's own observers (and, for malicious attacks, lets it corrupt its own party), then
builds the attacker's :class:`PartyView`, runs the attack, and scores what it returns.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from sklearn.metrics import roc_auc_score
from torch import Tensor, nn

from vflbench.attacks.base import Attack, BatchRecord, KnownLabels, LabelInference, PartyView, Scenario, Scores
from vflbench.config import ExperimentConfig
from vflbench.data import VerticalData, known_label_indices
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.eval.results import AttackResult
from vflbench.eval.scenario import DEFAULT_EMBED_DIM
from vflbench.models import build_bottom
from vflbench.protocol import Federation, PassiveParty, StepState
from vflbench.registry import Registry
from vflbench.rng import generator

if TYPE_CHECKING:
    from vflbench.eval.run import TrainedRun

ATTACKS: Registry[Attack] = Registry("attack")


def create_attack(name: str, **params: Any) -> Attack:
    """Build attack ``name`` from keyword parameters; unknown keys are errors."""
    import inspect

    cls = ATTACKS.get(name).factory
    valid = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ConfigError(f"attack {name!r} has no parameter {', '.join(map(repr, unknown))}; "
                          f"valid parameters are: {', '.join(valid) or '(none)'}.")
    try:
        return cls(**params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"attack {name!r}: {exc}") from None


def scenario_of(cfg: ExperimentConfig, vd: VerticalData) -> Scenario:
    """The public protocol facts of a config."""
    cfg = cfg.resolved()
    single = cfg.train.algorithm == "vlr" and vd.num_classes == 2
    out = 1 if single else vd.num_classes
    embed = out if cfg.train.algorithm == "vlr" else (cfg.model.embed_dim or DEFAULT_EMBED_DIM)
    assert cfg.train.aggregation and cfg.model.bottom and cfg.model.top
    return Scenario(cfg.train.algorithm, cfg.train.aggregation, vd.num_classes, vd.num_parties,
                    cfg.model.bottom, cfg.model.top, embed, single)


@dataclass
class PlannedAttack:
    """One configured attack and the state the runner keeps for it."""

    attack: Attack
    spec_params: dict[str, Any]
    records: list[BatchRecord] = field(default_factory=list)
    snapshots: list[dict[str, nn.Module]] = field(default_factory=list)


def known_labels(attack: Attack, y_train: Tensor, seed: int) -> KnownLabels | None:
    """The labelled rows the attack's threat model grants (seeded per attack)."""
    if not attack.known_per_class:
        return None
    ids = known_label_indices(y_train, per_class=attack.known_per_class,
                              generator=generator(seed, "attack", attack.name, "known"))
    return KnownLabels(ids, y_train[ids])


@dataclass
class AttackPlan:
    """Validated attacks of a config and what each party's transcript must retain."""

    scenario: Scenario | None = None
    attacks: list[PlannedAttack] = field(default_factory=list)
    keep: dict[str, set[str]] = field(default_factory=dict)
    seed: int = 0
    y_train: Tensor | None = None

    def extra_dims(self) -> dict[str, int]:
        """Embedding dimensions malicious passive attackers append, by party."""
        out: dict[str, int] = {}
        for planned in self.attacks:
            extra = planned.attack.extra_embedding_dims()
            if extra:
                out[planned.attack.party] = out.get(planned.attack.party, 0) + extra
        return out

    def prepare(self, fed: Federation) -> None:
        """Install each attack on its own party before training."""
        parties = {p.name: p for p in fed.parties()}
        for planned in self.attacks:
            attack = planned.attack
            party = parties[attack.party]
            if {"model_gradient", "cut_gradient"} & set(attack.reads) and isinstance(party, PassiveParty):
                party.observers.append(_recorder(planned, party, with_params="model_gradient" in attack.reads))
            assert self.y_train is not None
            attack.corrupt(party, known_labels(attack, self.y_train, self.seed))

    def on_epoch_end(self, fed: Federation) -> None:
        """Snapshot the attacker's models for attacks evaluated at every epoch."""
        parties = {p.name: p for p in fed.parties()}
        for planned in self.attacks:
            if planned.attack.every_epoch:
                models = parties[planned.attack.party].models()
                planned.snapshots.append({k: attacker_copy(m) for k, m in models.items()})


def _recorder(planned: PlannedAttack, party: PassiveParty, *, with_params: bool) -> Callable[[StepState, Tensor], None]:
    def observe(state: StepState, gradient: Tensor) -> None:
        grads = None
        if with_params:
            assert party.bottom is not None
            grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                     for p in party.bottom.parameters()]
        assert state.embedding is not None
        planned.records.append(BatchRecord(state.epoch, state.step, state.ids, state.embedding.detach(),
                                           gradient.detach(), grads))

    return observe


def validate_attacks(cfg: ExperimentConfig, vd: VerticalData) -> AttackPlan:
    """Check every configured attack against the scenario before any training."""
    scenario = scenario_of(cfg, vd)
    plan = AttackPlan(scenario, seed=cfg.seed, y_train=vd.y_train)
    valid_parties = [f"passive_{i + 1}" for i in range(len(vd.passive))] + ["active"]
    for spec in cfg.attacks:
        attack = create_attack(spec.name, **spec.params())
        if attack.party not in valid_parties:
            raise ConfigError(f"attack {spec.name!r}: party {attack.party!r} does not exist; "
                              f"valid parties are: {', '.join(valid_parties)}")
        attack.check(scenario)
        if attack.prior == "local" and type(attack).local is Attack.local:
            raise CompatibilityError(f"attack {spec.name!r} has no 'local' prior; use prior: random or scratch")
        plan.attacks.append(PlannedAttack(attack, spec.params()))
        kinds = {"cut_gradient"} & set(attack.reads)
        if kinds:
            plan.keep.setdefault(attack.party, set()).update(kinds)
    return plan


def metric_name(num_classes: int) -> str:
    """AUC for binary tasks, accuracy otherwise (Kang Table 7; VMask Table II)."""
    return "auc" if num_classes == 2 else "accuracy"


def _score(s: Scores, y: Tensor, metric: str) -> float | None:
    """The metric of one score set; non-finite scores (a diverged model) count as ties."""
    truth = y[s.ids]
    scores = torch.nan_to_num(s.scores.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)
    if metric == "auc":
        if len(torch.unique(truth)) < 2:
            return None
        positive = scores if scores.dim() == 1 else scores[:, -1]
        return float(roc_auc_score(truth.numpy(), positive.double().numpy()))
    predicted = scores.argmax(1) if scores.dim() == 2 else (scores > 0.5).long()
    return float((predicted == truth).float().mean())


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
        per_batch = [v for b in inf.batches if (v := _score(b, y_train, metric)) is not None]
        if not per_batch:
            raise CompatibilityError("no batch had both classes, so no AUC could be computed")
        details.update(batches_scored=len(per_batch), batches_seen=len(inf.batches))
        return float(sum(per_batch) / len(per_batch)), details
    values = {}
    for split, s, y in (("train", inf.train, y_train), ("test", inf.test, y_test)):
        if s is not None:
            values[split] = _score(s, y, metric)
    if not values:
        raise CompatibilityError("the attack returned no inference to score")
    details.update({f"{k}_{metric}": v for k, v in values.items()})
    return float(values["test"] if values.get("test") is not None else values["train"]), details


def random_prior(metric: str, num_classes: int) -> float:
    """A random classifier's expected score."""
    return 0.5 if metric == "auc" else 1.0 / num_classes


def _view(run: TrainedRun, planned: PlannedAttack, models: dict[str, nn.Module] | None = None) -> PartyView:
    attack = planned.attack
    party = {p.name: p for p in run.federation.parties()}[attack.party]
    known = known_labels(attack, run.data.y_train, run.config.seed)
    assert party.data is not None
    return PartyView(
        party=party.name, scenario=scenario_of(run.config, run.data), data=party.data,
        models=models if models is not None else {k: attacker_copy(m) for k, m in party.models().items()},
        transcript=party.transcript, records=planned.records, known=known,
        generator=generator(run.config.seed, "attack", attack.name, "run"))


def attacker_copy(model: nn.Module) -> nn.Module:
    """The attacker's private copy of one of its models: what it can run on its own.

    A model that involves another party provides ``attacker_copy()`` (VMask's bottom), or holds
    layers that provide ``attacker_module()`` (e.g. a Paillier-encrypted layer): the attacker cannot
    run those on its own, so the copy holds what the attacker can use in their place.
    """
    own = getattr(model, "attacker_copy", None)
    if callable(own):
        return own()
    clone = copy.deepcopy(model)
    for name, module in list(clone.named_modules()):
        replace = getattr(module, "attacker_module", None)
        if name and callable(replace):
            parent, _, child = name.rpartition(".")
            setattr(clone.get_submodule(parent) if parent else clone, child, replace())
    return clone


def scratch_models(run: TrainedRun, party: str) -> dict[str, nn.Module]:
    """A randomly initialised bottom model of the attacker's architecture."""
    cfg = run.config.resolved()
    parties = {p.name: p for p in run.federation.parties()}
    data = parties[party].data
    scenario = scenario_of(run.config, run.data)
    assert data is not None and cfg.model.bottom
    bottom = build_bottom(cfg.model.bottom, data, scenario.embed_dim, generator(cfg.seed, party, "scratch"),
                          **cfg.model.bottom_options)
    return {"bottom": bottom}


def run_attacks(plan: AttackPlan, run: TrainedRun) -> tuple[list[AttackResult], dict[str, float]]:
    """Run every planned attack on ``run``; return scored results and seconds per attack."""
    results, seconds = [], {}
    y_train, y_test = run.data.y_train, run.data.y_test
    for planned in plan.attacks:
        attack = planned.attack
        tic = time.perf_counter()
        metric = metric_name(run.data.num_classes)
        select = getattr(attack, "select", "best")
        view = _view(run, planned)
        value, details = score_inference(attack.infer(view), y_train, y_test, metric, select)
        if attack.prior == "random":
            prior = random_prior(metric, run.data.num_classes)
        elif attack.prior == "scratch":
            prior, prior_details = score_inference(attack.infer(view.with_models(scratch_models(run, attack.party))),
                                                   y_train, y_test, metric, select)
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
                per_epoch.append(score_inference(attack.infer(view.with_models(models)), y_train, y_test,
                                                 metric, select)[0])
        seconds[attack.name] = time.perf_counter() - tic
        results.append(AttackResult(name=attack.name, target=attack.target, metric=metric, value=value,
                                    prior=prior, prior_name=attack.prior, leakage=100.0 * (value - prior),
                                    per_epoch=per_epoch, details={"params": planned.spec_params, **details}))
    return results, seconds
