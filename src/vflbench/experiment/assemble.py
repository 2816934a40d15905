"""A run's result (``result.json``) assembled from its trained run, in one place for every way of running it.

``vflbench run`` (all parties in one process) and ``vflbench launch`` (each party in its own process) train the
same federation over different transports; both hand their trained run, their scores and their traffic to
:func:`assemble_result`, which writes the same fields the same way: the utility (:func:`utility_of`), the
defenses' entries with their details (:func:`defense_entries`), the baselines (:func:`baselines_of`), the attacks
marked with their undefended leakage (:func:`mark_undefended`) and the detectors' honest reference
(:func:`mark_honest_reference`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from vflbench.defenses import defense_class
from vflbench.defenses.detectors import Detector
from vflbench.errors import ConfigError
from vflbench.experiment.config import ExperimentConfig
from vflbench.experiment.results import AttackResult, RunResult, Timing, TrainedRun, UtilityResult
from vflbench.metrics.scores import attack_leakage, leaks
from vflbench.metrics.stats import mean_interval
from vflbench.protocol import History

log = logging.getLogger(__name__)
#: Why a run whose parties run in separate processes has no ``vanilla`` baseline of its own.
NO_SECOND_FEDERATION = (
    "a run with defenses across processes trains no second, undefended federation; run the "
    "config without defenses, or use `vflbench run`"
)


def utility_of(cfg: ExperimentConfig, history: History) -> UtilityResult:
    """The configured utility metric: final test value and its per-epoch curve."""
    key = f"test_{cfg.train.metric}"
    per_epoch = [r[key] for r in history.epochs if key in r]
    if not per_epoch:
        raise ConfigError(
            f"train.metric {cfg.train.metric!r} is not available for this task (AUC needs a binary task); use accuracy"
        )
    final = {k.removeprefix("test_"): v for k, v in history.epochs[-1].items() if k.startswith("test_")}
    diverged = any(r.get("diverged") for r in history.epochs)
    return UtilityResult(cfg.train.metric, per_epoch[-1], per_epoch, final, diverged=diverged)


def defense_details(
    run: TrainedRun, name: str, reported: Mapping[str, Mapping[str, dict[str, Any]]] | None = None
) -> dict[str, Any]:
    """``{"details": ...}`` of the first instance of defense ``name`` that reports any (else nothing), the instances
    of this process's parties first, then those ``reported`` by the parties in other processes (by party, in order);
    a detector's are the decisions of all its instances together (:func:`detector_details`)."""
    found = [
        details
        for party in run.federation.parties()
        for d in party.defenses
        if d.name == name and (details := d.details())
    ]
    found += [r[name] for r in (reported or {}).values() if r.get(name)]
    if is_detector(name):
        return {"details": detector_details(found)} if found else {}
    return {"details": found[0]} if found else {}


def detector_details(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A detector's decisions over the passive parties it watches at (each instance's
    :meth:`~vflbench.defenses.detectors.Detector.details`): ``decisions`` and ``flagged`` summed, ``rate`` their
    share (``None`` without a decision), ``detected`` whether any instance flagged, and each party's own under
    ``parties``."""
    decisions = sum(int(p["decisions"]) for p in parts)
    flagged = sum(int(p["flagged"]) for p in parts)
    return {
        "decisions": decisions,
        "flagged": flagged,
        "rate": flagged / decisions if decisions else None,
        "detected": any(p["first_flag_step"] is not None for p in parts),
        "parties": {p["party"]: {k: v for k, v in p.items() if k != "party"} for p in parts},
    }


def is_detector(name: str) -> bool:
    """Whether defense ``name`` is a detector (it decides whether the training is hijacked, and reports how often
    it flags: :class:`~vflbench.defenses.detectors.Detector`)."""
    return issubclass(defense_class(name), Detector)


def defense_entries(
    run: TrainedRun, reported: Mapping[str, Mapping[str, dict[str, Any]]] | None = None
) -> list[dict[str, Any]]:
    """``result.json``'s ``defense``: each configured defense's name, parameters and details (:func:`defense_details`),
    in config order."""
    return [
        {"name": s.name, "params": s.params(), **defense_details(run, s.name, reported)} for s in run.config.defenses
    ]


def baselines_of(
    cfg: ExperimentConfig,
    utility: UtilityResult,
    *,
    undefended: Mapping[str, Any] | None,
    malicious: bool,
    train: Callable[[bool], UtilityResult],
    active_has_features: bool = True,
    second_federation: bool = True,
) -> dict[str, Any]:
    """The configured baselines of a run whose utility is ``utility``.

    ``vanilla`` is this run's utility when it has no defenses; the undefended run's (``undefended``) when the
    attackers only observe (not ``malicious``: the undefended run trained exactly vanilla); otherwise a federation
    trained without defenses (``train(False)``), or skipped without ``second_federation``. ``alone`` is the active
    party trained on its own features (``train(True)``; skipped when it holds none, in VSNN)."""
    baselines: dict[str, Any] = {}
    for name in cfg.baselines:
        if name == "vanilla" and not cfg.defenses:
            baselines["vanilla"] = utility.__dict__
        elif name == "vanilla" and undefended is not None and not malicious:
            baselines["vanilla"] = dict(undefended["utility"])
        elif name == "vanilla" and second_federation:
            baselines["vanilla"] = train(False).__dict__
        elif name == "vanilla":
            baselines["vanilla"] = {"skipped": NO_SECOND_FEDERATION}
        elif not active_has_features:
            baselines["alone"] = {"skipped": "in VSNN the active party holds no features, so it cannot train alone"}
        else:
            baselines["alone"] = train(True).__dict__
    return baselines


def mark_undefended(
    attacks: list[AttackResult], undefended: list[dict[str, Any]] | None, *, seed: int, confidence: float
) -> None:
    """Set each attack's undefended leakage (mean and per repeat), its interval and ``leaks_without_defense``
    (attacks match by position: the undefended run has the same attack list and repeats), and the searched
    attacker's undefended leakage where both runs searched; ``undefended=None``: the run itself has no defenses,
    so its own leakage is the undefended one."""
    for i, attack in enumerate(attacks):
        if undefended is None:
            base = list(attack.leakages) or [attack.leakage]
        else:
            base = [float(v) for v in undefended[i].get("leakages") or [attack_leakage(undefended[i])]]
        interval = mean_interval({seed: base}, confidence)
        worst = (
            attack.leakages_worst
            if undefended is None
            else [float(v) for v in undefended[i].get("leakages_worst") or []] or None
        )
        if worst:
            attack.undefended_leakage_worst = sum(worst) / len(worst)
            attack.undefended_leakages_worst = list(worst)
        attack.undefended_leakage = sum(base) / len(base)
        attack.undefended_leakages = base
        attack.undefended_ci = [interval.low, interval.high] if interval.defined else None
        attack.leaks_without_defense = leaks(interval)
        if attack.leaks_without_defense is False:
            log.warning(
                "attack %s does not leak measurably without a defense (leakage %.2f points, %d%% interval "
                "[%.2f, %.2f] does not lie above 0): no defense can be credited for stopping it",
                attack.name,
                attack.undefended_leakage,
                round(100 * confidence),
                interval.low,
                interval.high,
            )


def mark_honest_reference(
    defense: list[dict[str, Any]], honest: dict[str, Any] | None, *, config_hash: str, malicious: list[str]
) -> None:
    """Give each detector entry of ``defense`` (a run's ``result.json`` entries) its ``honest_reference``: the same
    detector's decisions on honest training of the same scenario (``honest``: that run's result; ``None``: the run
    has no malicious attack, so it is its own reference) and the malicious attacks left out for it (``without``).
    Entries match by position (same defense list)."""
    for i, entry in enumerate(defense):
        if not is_detector(entry["name"]):
            continue
        source = entry if honest is None else honest["defense"][i]
        numbers = source.get("details", {})
        entry["honest_reference"] = {
            "config_hash": config_hash if honest is None else honest["config_hash"],
            "same_run": honest is None,
            "without": list(malicious),
            **{k: numbers.get(k) for k in ("decisions", "flagged", "rate")},
        }


def assemble_result(
    run: TrainedRun,
    *,
    utility: UtilityResult,
    defense: list[dict[str, Any]],
    attacks: list[AttackResult],
    attack_seconds: dict[str, float],
    comm: dict[str, Any],
    baselines: dict[str, Any],
    grants: list[dict[str, Any]],
    held_out: Tensor | None,
) -> RunResult:
    """The :class:`RunResult` of ``run``: its data's description (with the training, test and held-out row counts),
    utility, defense entries, attacks, timing, traffic (``comm``), baselines and grants."""
    cfg, vd = run.config, run.data
    return RunResult(
        config_hash=cfg.hash(),
        seed=cfg.seed,
        data={
            **vd.info,
            "n_train": len(vd.y_train),
            "n_test": len(vd.y_test),
            "n_held_out": 0 if held_out is None else len(held_out),
        },
        utility=utility,
        defense=defense,
        attacks=attacks,
        timing=Timing(run.train_seconds, run.history.epoch_seconds, attack_seconds),
        comm=comm,
        baselines=baselines,
        grants=grants,
        device=str(vd.device),
    )
