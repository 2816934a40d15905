"""Running attacks on a trained run: compatibility, views, priors, scoring.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from vflbench.attacks.base import (
    Attack,
    AuxData,
    BatchRecord,
    FeatureInference,
    KnownLabels,
    LabelInference,
    PartyView,
    ReceivedEmbeddings,
    Scenario,
    Scores,
    draws_of,
    victims_of,
)
from vflbench.config import ExperimentConfig
from vflbench.data import VerticalData, known_label_indices
from vflbench.data.sampling import aux_indices
from vflbench.errors import CompatibilityError, ConfigError
from vflbench.eval.auc import batched_binary_auc
from vflbench.eval.results import AttackResult
from vflbench.eval.scenario import DEFAULT_EMBED_DIM
from vflbench.eval.scores import direction_of, leakage_points
from vflbench.models import build_bottom
from vflbench.protocol import ACTIVE, Federation, Message, PassiveParty, StepState
from vflbench.protocol.federation import EVAL_BATCH
from vflbench.registry import Registry
from vflbench.rng import generator

if TYPE_CHECKING:
    from vflbench.eval.run import TrainedRun

ATTACKS: Registry[Attack] = Registry("attack")
log = logging.getLogger(__name__)


def create_attack(name: str, **params: Any) -> Attack:
    """Build attack ``name`` from keyword parameters, checked by :func:`vflbench.registry.check_params`."""
    ATTACKS.check(name, params)
    cls = ATTACKS.get(name).factory
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
    """One configured attack and the state the runner keeps for it.

    ``aux_exclude``: rows its auxiliary set is not drawn from. For an attack whose aux set is
    disjoint from the training set these are the aux rows of the other attacks whose threat
    models have their aux rows trained on (GIA, GRNA: they read the victim's training-time
    embeddings of them), so that no row has to be both held out and trained on.
    """

    attack: Attack
    spec_params: dict[str, Any]
    records: list[BatchRecord] = field(default_factory=list)
    snapshots: list[dict[str, nn.Module]] = field(default_factory=list)
    aux: AuxData | None = None
    aux_exclude: Tensor | None = None


def known_labels(attack: Attack, y_train: Tensor, seed: int) -> KnownLabels | None:
    """The labelled rows the attack's threat model grants (seeded per attack)."""
    if not attack.known_per_class:
        return None
    ids = known_label_indices(y_train, per_class=attack.known_per_class,
                              generator=generator(seed, "attack", draws_of(attack), "known"))
    return KnownLabels(ids, y_train[ids])


def wants_aux(attack: Attack) -> bool:
    """Whether the attack's threat model grants an auxiliary set."""
    return attack.aux_size is not None or attack.aux_fraction is not None


def aux_data(attack: Attack, vd: VerticalData, own: Tensor | None, seed: int,
             exclude: Tensor | None = None) -> AuxData | None:
    """The auxiliary rows the attack's threat model grants (seeded per attack), or ``None``.

    ``aux_size`` (a count) takes precedence over ``aux_fraction``; ``aux_classes`` restricts the
    draw to those classes (an out-of-distribution aux set).
    ``own`` is the attacker's own training slice (``None`` when it holds no features); the
    victim's slice and the labels come from ``vd`` (the runner's ground truth). ``exclude``: rows
    the draw avoids (:attr:`PlannedAttack.aux_exclude`).
    """
    if not wants_aux(attack):
        return None
    ids = aux_ids(attack, vd.y_train, seed, exclude)
    names = victims_of(attack)
    victim, widths = victim_features(vd, names, "train", ids)
    classes = tuple(int(c) for c in attack.aux_classes) if attack.aux_classes is not None else None
    return AuxData(ids, None if own is None else own[ids].clone(), victim.clone(), vd.y_train[ids].clone(),
                   "+".join(names), classes, widths if len(names) > 1 else ())


def aux_ids(attack: Attack, y_train: Tensor, seed: int, exclude: Tensor | None = None) -> Tensor:
    """The training rows of the attack's auxiliary set (sorted; the same draw for a seed, an attack name and
    ``exclude``, the rows the draw avoids)."""
    size, fraction = attack.aux_size, attack.aux_fraction if attack.aux_size is None else None  # a count first
    if fraction is not None and exclude is not None and 0.0 < fraction <= 1.0:
        # the fraction is of the training split (of its rows of aux_classes), whatever the draw avoids
        pool = y_train if attack.aux_classes is None else y_train[torch.isin(
            y_train, torch.as_tensor(list(attack.aux_classes), dtype=y_train.dtype))]
        size, fraction = max(1, round(fraction * len(pool))), None
    return aux_indices(y_train, generator=generator(seed, "attack", attack.name, "aux"), size=size,
                       fraction=fraction, classes=attack.aux_classes, exclude=exclude)


def victim_features(vd: VerticalData, victims: Sequence[str], split: str,
                    ids: Tensor | None = None) -> tuple[Tensor, tuple[int, ...]]:
    """The victims' slices of ``split`` (rows ``ids``, all when ``None``) concatenated along the last
    axis, and each one's width there."""
    parts = [getattr(vd.passive[passive_index(v)], "x_test" if split == "test" else "x_train") for v in victims]
    if ids is not None:
        parts = [x[ids] for x in parts]
    return (parts[0] if len(parts) == 1 else torch.cat(parts, -1)), tuple(int(x.shape[-1]) for x in parts)


def _check_victims(name: str, attack: Attack, victims: tuple[str, ...], vd: VerticalData) -> None:
    """A list of target parties: an attack built for them, distinct parties, slices that concatenate."""
    if not attack.multi_victim:
        raise ConfigError(f"attack {name!r} targets one passive party; give victim as one name (several target "
                          "parties are supported by dmavfl and dmavfl_sync, DMAVFL Table 6)")
    if len(set(victims)) != len(victims):
        raise ConfigError(f"attack {name!r}: the victims {list(victims)} name a party twice")
    shapes = [tuple(vd.passive[passive_index(v)].x_train.shape[1:]) for v in victims]
    if len({shape[:-1] for shape in shapes}) != 1:
        raise ConfigError(f"attack {name!r}: the victims' slices must agree in every axis but the last to be "
                          f"reconstructed together; their shapes are {shapes}")


def passive_index(name: str) -> int:
    """0-based index of passive party ``passive_<k>``."""
    return int(name.removeprefix("passive_")) - 1


@dataclass
class AttackPlan:
    """Validated attacks of a config and what each party's transcript must retain."""

    scenario: Scenario | None = None
    attacks: list[PlannedAttack] = field(default_factory=list)
    keep: dict[str, set[str]] = field(default_factory=dict)
    seed: int = 0
    y_train: Tensor | None = None
    data: VerticalData | None = None

    def held_out(self) -> Tensor | None:
        """Training rows no party may train on: the auxiliary rows of every attack whose threat model
        keeps its auxiliary set disjoint from the training set (``aux_disjoint``; DMAVFL §3.2,
        §6.1), sorted; ``None`` when there are none. A function of the config's attacks and seed
        only, so a sweep's no-defense baseline (same attacks, same seed) holds out the same rows."""
        assert self.y_train is not None
        drawn = [aux_ids(p.attack, self.y_train, self.seed, p.aux_exclude) for p in self.attacks
                 if p.attack.aux_disjoint and wants_aux(p.attack)]
        return torch.cat(drawn).unique() if drawn else None

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
            attack.observe(party)
            if {"model_gradient", "cut_gradient"} & set(attack.reads) and isinstance(party, PassiveParty):
                party.observers.append(_recorder(planned, party, with_params="model_gradient" in attack.reads))
            assert self.y_train is not None
            known = known_labels(attack, self.y_train, self.seed)
            if wants_aux(attack):
                assert self.data is not None
                own = party.data.x_train if party.data is not None else None
                planned.aux = aux_data(attack, self.data, own, self.seed, planned.aux_exclude)
                attack.corrupt(party, known, aux=planned.aux,
                               generator=generator(self.seed, "attack", attack.name, "corrupt"))
            else:
                attack.corrupt(party, known)

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
    plan = AttackPlan(scenario, seed=cfg.seed, y_train=vd.y_train, data=vd)
    valid_parties = [f"passive_{i + 1}" for i in range(len(vd.passive))] + ["active"]
    for spec in cfg.attacks:
        attack = create_attack(spec.name, **spec.params())
        if attack.party not in valid_parties:
            raise ConfigError(f"attack {spec.name!r}: party {attack.party!r} does not exist; "
                              f"valid parties are: {', '.join(valid_parties)}")
        if attack.target == "features":
            passives = valid_parties[:-1]
            victims = victims_of(attack)
            for victim in victims:
                if victim not in passives or victim == attack.party:
                    raise ConfigError(f"attack {spec.name!r}: victim {victim!r} must be a passive party other than "
                                      f"the attacker; valid victims are: {', '.join(passives)}")
            if not isinstance(attack.victim, str):
                _check_victims(spec.name, attack, victims, vd)
            if attack.prior != "random":
                raise CompatibilityError(f"attack {spec.name!r} is a feature attack: its prior is the aux-mean guess; "
                                         "use prior: random")
        attack.check(scenario)
        if attack.prior == "local" and type(attack).local is Attack.local:
            raise CompatibilityError(f"attack {spec.name!r} has no 'local' prior; use prior: random or scratch")
        plan.attacks.append(PlannedAttack(attack, spec.params()))
        kinds = {"cut_gradient"} & set(attack.reads)
        if kinds:
            plan.keep.setdefault(attack.party, set()).update(kinds)
    trained = [aux_ids(p.attack, vd.y_train, cfg.seed) for p in plan.attacks
               if wants_aux(p.attack) and not p.attack.aux_disjoint]
    if trained:
        kept = torch.cat(trained).unique()
        for planned in plan.attacks:
            if planned.attack.aux_disjoint:
                planned.aux_exclude = kept
    held = plan.held_out()
    if held is not None and len(held) >= len(vd.y_train):
        raise ConfigError(f"the auxiliary sets of the attacks hold out all {len(vd.y_train)} training rows "
                          "(they are disjoint from the training set); give a smaller aux_size or aux_fraction")
    return plan


def metric_name(num_classes: int, metric: str = "auto") -> str:
    """``metric`` as chosen; ``"auto"``: AUC for binary tasks, accuracy otherwise (Kang Table 7; VMask Table II)."""
    if metric != "auto":
        return metric
    return "auc" if num_classes == 2 else "accuracy"


def _finite(s: Scores) -> Tensor:
    """A score set's scores with non-finite entries (a diverged model) as ties at zero."""
    return torch.nan_to_num(s.scores.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)


def _positive(scores: Tensor) -> Tensor:
    """The positive class's score of each row (the last column of a two-column score set)."""
    return scores if scores.dim() == 1 else scores[:, -1]


def _per_batch(sets: Sequence[Scores], y: Tensor, metric: str) -> list[float | None]:
    """The metric of every score set (``None`` for an AUC of a set with a single class).

    AUCs of all sets are computed in one vectorised pass (:func:`batched_binary_auc`).
    """
    if metric == "auc":
        aucs = batched_binary_auc([_positive(_finite(s)) for s in sets], [y[s.ids] for s in sets])
        return [None if v != v else v for v in aucs.tolist()]
    out: list[float | None] = []
    for s in sets:
        scores = _finite(s)
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
    values = {}
    for split, s, y in (("train", inf.train, y_train), ("test", inf.test, y_test)):
        if s is not None:
            values[split] = _score(s, y, metric)
    if not values:
        raise CompatibilityError("the attack returned no inference to score")
    details.update({f"{k}_{metric}": v for k, v in values.items()})
    split = "test" if values.get("test") is not None else "train"
    if values.get(split) is None:
        raise CompatibilityError(f"the attack's {metric} is undefined on every split it returned (one class only)")
    details["scored_split"] = split
    if split == "train" and "test" in values:
        details["split_fallback"] = (f"the test {metric} is undefined (the test rows hold one class), "
                                     "so the attack is scored on the training split")
        log.warning("attack scored on the training split: %s", details["split_fallback"])
    return float(values[split]), details


def random_prior(metric: str, num_classes: int) -> float:
    """A random classifier's expected score."""
    return 0.5 if metric == "auc" else 1.0 / num_classes


def _view(run: TrainedRun, planned: PlannedAttack, models: dict[str, nn.Module] | None = None) -> PartyView:
    attack = planned.attack
    party = {p.name: p for p in run.federation.parties()}[attack.party]
    known = known_labels(attack, run.data.y_train, run.config.seed)
    aux = planned.aux
    if aux is None and wants_aux(attack):
        aux = aux_data(attack, run.data, party.data.x_train if party.data is not None else None, run.config.seed,
                       planned.aux_exclude)
    received = []
    if attack.target == "features" and "embedding" in attack.reads and party.name == ACTIVE:
        ids, split = feature_targets(attack, run.data, aux, run.config.seed)
        received += [query_embeddings(run.federation, victim, ids, split) for victim in victims_of(attack)]
    assert party.data is not None or attack.target == "features"
    return PartyView(
        party=party.name, scenario=scenario_of(run.config, run.data), data=party.data,
        models=models if models is not None else {k: attacker_copy(m) for k, m in party.models().items()},
        transcript=party.transcript, records=planned.records, known=known,
        generator=generator(run.config.seed, "attack", draws_of(attack), "run"), aux=aux, received=received)


def feature_targets(attack: Attack, vd: VerticalData, aux: AuxData | None, seed: int) -> tuple[Tensor, str]:
    """The rows a feature attack is scored on: ``n_targets`` rows of ``target_split`` (all when
    ``None``), drawn with a seeded generator; training rows never include the auxiliary rows."""
    split = attack.target_split
    n = len(vd.y_test) if split == "test" else len(vd.y_train)
    allowed = torch.ones(n, dtype=torch.bool)
    if split == "train" and aux is not None:
        allowed[aux.ids] = False
    rows = torch.nonzero(allowed).flatten()
    if attack.n_targets is not None and attack.n_targets < len(rows):
        pick = torch.randperm(len(rows), generator=generator(seed, "attack", attack.name, "targets"))
        rows = rows[pick[: attack.n_targets]].sort().values
    return rows, split


def query_embeddings(fed: Federation, sender: str, ids: Tensor, split: str) -> ReceivedEmbeddings:
    """The embeddings ``sender`` sends the active party for rows ``ids`` at inference time.

    The same messages as :meth:`Federation.outputs` (through the channel, phase ``"eval"``,
    after the sender's own defenses), for the rows the active party asks about.
    """
    party = {p.name: p for p in fed.passives}[sender]
    chunks = []
    for start in range(0, len(ids), EVAL_BATCH):
        batch = ids[start : start + EVAL_BATCH]
        h = party.forward(batch, epoch=-1, step=-1, split=split, train=False)  # type: ignore[arg-type]
        chunks.append(fed.channel.send(Message("embedding", sender, ACTIVE, h, batch, -1, -1, "eval")).payload)
    embeddings = torch.cat(chunks) if chunks else torch.empty(0)
    return ReceivedEmbeddings(sender, split, ids, embeddings)  # type: ignore[arg-type]


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
    from vflbench.eval.metrics import cosine_distance, ssim

    part = run.data.passive[passive_index(victims[0])]
    truth, widths = victim_features(run.data, victims, inf.split, inf.ids)
    truth = truth.float()
    train_slice = victim_features(run.data, victims, "train")[0] if aux is None else None
    recon = inf.features.detach().float().reshape(truth.shape)
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
    if inf.shadow is not None:
        parties = {p.name: p for p in run.federation.passives}
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
    results, seconds = [], {}
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
