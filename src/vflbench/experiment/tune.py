"""``vflbench tune``: the strength of a defense with the best utility whose worst-case leakage
meets a privacy budget (VMask's tunable budget, generalised to every defense). The search
bisects in log space towards the weakest strength that meets the budget; of the strengths it
tried that meet it, the one with the lowest utility loss is chosen.

The budget bounds Kang's label leakage ε_p (points of AUC or accuracy above the prior), so tune
takes label attacks only: a feature attack's leakage is on another scale (points of
``100·(1 − MSE/MSE_prior)``) and is refused rather than compared with the same budget. Every
attack must leak measurably without the defense (the confidence interval of its undefended leakage over
the seeds and repeats lies above 0 points): otherwise any strength "meets" the budget and the defense would be
credited for stopping nothing. A strength meets the budget when the upper end of the worst attack's interval
does (its mean, when the seeds and repeats give no interval).

With the attacker search (``evaluation.attacker_search``, or ``sweep.attacker_search``) every attack with a search
grid counts twice, as the default attacker and as the attacker its search selected (``"<attack> [searched]"``);
the worst attack is the strongest of all of them, so tune meets the budget against the worst case. An attacker
(default or searched) that does not leak measurably without the defense is left out of the worst case; an attack
none of whose attackers does is refused."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vflbench.defenses import defense_class
from vflbench.experiment.config import ConfigError, ExperimentConfig, apply_override, build_config
from vflbench.experiment.results import RunResult, read_result, write_json
from vflbench.experiment.sweep import RUNS, SEARCHED, SweepPoint, collect, is_done
from vflbench.metrics.scores import leaks
from vflbench.metrics.stats import Interval, mean_interval

log = logging.getLogger(__name__)


@dataclass
class TuneResult:
    """The search trace (means over ``seeds``) and the chosen strength (``None`` when no tried strength
    meets the budget)."""

    defense: str
    budget: float
    seeds: list[int] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    chosen: dict[str, Any] | None = None


def _evaluate(cfg: ExperimentConfig, out: Path, data_root: str | None) -> RunResult:
    from vflbench.experiment.run import run_experiment

    point = SweepPoint(cfg, {})
    if not is_done(out, point):
        run_experiment(cfg, out_dir=out / RUNS, data_root=data_root)
    return read_result(out / RUNS / point.hash / "result.json")


def tune(
    cfg: ExperimentConfig,
    out_dir: str | Path,
    *,
    budget: float,
    low: float,
    high: float,
    steps: int = 6,
    data_root: str | None = None,
) -> TuneResult:
    """Search ``cfg.defenses[0]``'s strength in [low, high] for the best utility with worst ε_p <= budget.

    Every tried strength runs each seed of the config's ``sweep.seeds`` (the config's ``seed`` when it
    has none); its utility and each attack's leakage are the means over them."""
    name, larger_is_stronger = _check_tune(cfg, low, high)
    out = Path(out_dir)
    seeds = [int(s) for s in (cfg.sweep or {}).get("seeds") or [cfg.seed]]
    base = cfg.model_dump(mode="json", exclude={"sweep"})
    if (cfg.sweep or {}).get("attacker_search"):
        base["evaluation"]["attacker_search"] = True
    points: list[SweepPoint] = []

    def evaluate(raw: dict[str, Any], knobs: dict[str, Any]) -> tuple[float, dict[str, Interval]]:
        """Mean utility over the seeds and the leakage (points) of every attacker (each attack's default one and,
        with the attacker search, the one it selected) with its interval over seeds × repeats."""
        results = []
        for seed in seeds:
            point = SweepPoint(build_config({**raw, "seed": seed}), {**knobs, "seed": seed})
            points.append(point)
            results.append((seed, _evaluate(point.config, out, data_root)))
        utility = sum(r.utility.value for _, r in results) / len(results)
        return utility, _leakage_intervals(cfg, results)

    log.info("tune %s: seeds %s (each tried strength is the mean over them)", name, seeds)
    vanilla, undefended = evaluate({**base, "defenses": []}, {})
    usable = _usable_attackers(cfg, undefended, seeds)
    result = TuneResult(name, budget, seeds)

    def trial(strength: float) -> bool:
        raw = json.loads(json.dumps(base))
        apply_override(raw, ["defenses", "0", "strength"], strength)
        utility, leakage = evaluate(raw, {"strength": strength})
        label, worst = max(((k, v) for k, v in leakage.items() if k in usable), key=lambda kv: kv[1].mean)
        return _record_trial(result, strength, label, worst, utility, vanilla)

    strong, weak = (high, low) if larger_is_stronger else (low, high)
    _bisect(trial, strong, weak, steps)
    met = [t for t in result.trace if t["meets"]]
    result.chosen = min(met, key=lambda t: t["utility_loss"]) if met else None
    collect(out, points)
    write_json(out / "tune.json", asdict(result))
    return result


def _check_tune(cfg: ExperimentConfig, low: float, high: float) -> tuple[str, bool]:
    """Refuse a config :func:`tune` cannot search (not exactly one defense with a strength knob, no attack, a
    feature attack, not ``0 < low < high``); the defense's name, and whether a larger strength is stronger."""
    if len(cfg.defenses) != 1:
        raise ConfigError("tune needs exactly one defense in the config (its strength is searched)")
    if not cfg.attacks:
        raise ConfigError("tune needs at least one attack: the budget bounds the worst attack's leakage")
    if not 0 < low < high:
        raise ConfigError(f"tune needs 0 < low < high, got low={low}, high={high}")
    name = cfg.defenses[0].name
    cls = defense_class(name)
    if cls.strength_param is None:
        raise ConfigError(f"defense {name!r} has no strength knob to tune")
    larger_is_stronger = cls.strength_direction.startswith("larger")
    from vflbench.attacks import ATTACKS

    features = [s.name for s in cfg.attacks if getattr(ATTACKS.get(s.name).factory, "target", None) != "labels"]
    if features:
        raise ConfigError(
            f"tune bounds label leakage (points of AUC or accuracy above the prior) and cannot take "
            f"the feature attack(s) {', '.join(features)}: their leakage is in points of "
            "100*(1 - MSE/MSE_prior), another scale. Tune against label attacks only, or sweep the "
            "strength with `vflbench sweep` and read the feature leakage there"
        )
    return name, larger_is_stronger


def _leakage_intervals(cfg: ExperimentConfig, results: list[tuple[int, RunResult]]) -> dict[str, Interval]:
    """The leakage (points) of every attacker over the ``results`` of the seeds (each attack's default one and,
    with the attacker search, the one it selected) with its interval over seeds × repeats, by its label."""
    leakage: dict[str, Interval] = {}
    for i, spec in enumerate(cfg.attacks):
        label = spec.name if spec.name not in leakage else f"{spec.name}#{i}"
        leakage[label] = mean_interval(
            {seed: [float(v) for v in r.attacks[i].leakages or [r.attacks[i].leakage]] for seed, r in results},
            cfg.evaluation.confidence,
        )
        searched = {seed: [float(v) for v in r.attacks[i].leakages_worst or []] for seed, r in results}
        if any(searched.values()):
            leakage[label + SEARCHED] = mean_interval(searched, cfg.evaluation.confidence)
    return leakage


def _usable_attackers(cfg: ExperimentConfig, undefended: dict[str, Interval], seeds: list[int]) -> set[str]:
    """The attackers that leak measurably without a defense (whose leakage the budget bounds); a clear error for an
    attack none of whose attackers does, or whose leakage has no interval."""
    usable: set[str] = set()
    for label, interval in undefended.items():
        if leaks(interval):
            usable.add(label)
    for label, interval in undefended.items():
        if label.endswith(SEARCHED) or label in usable or label + SEARCHED in usable:
            continue
        if leaks(interval) is None:
            raise ConfigError(
                f"tune cannot tell whether attack {label!r} leaks without a defense: seeds {seeds} "
                f"with evaluation.repeats {cfg.evaluation.repeats} give no interval of its leakage; "
                "give sweep.seeds (at least 3) or evaluation.repeats >= 2"
            )
        raise ConfigError(
            f"attack {label!r} does not leak measurably without a defense (undefended "
            f"leakage {interval.mean:.2f} points, {round(100 * interval.confidence)}% interval "
            f"[{interval.low:.2f}, {interval.high:.2f}] over seeds {seeds}), so every strength "
            "would meet the budget and tune would credit the defense for stopping nothing; "
            "strengthen the attack (more epochs, other parameters, evaluation.attacker_search) or "
            "leave it out"
        )
    return usable


def _record_trial(
    result: TuneResult, strength: float, label: str, worst: Interval, utility: float, vanilla: float
) -> bool:
    """Add the trial of ``strength`` (worst attacker ``label`` with leakage ``worst``) to ``result.trace`` and log
    it; whether it meets the budget (the upper end of the worst leakage's interval, else its mean, within it)."""
    name, budget = result.defense, result.budget
    bound = worst.high if worst.defined else worst.mean
    entry = {
        "strength": strength,
        "worst_attack": label,
        "worst_leakage": worst.mean,
        "worst_ci_high": worst.high,
        "utility": utility,
        "utility_loss": 100.0 * (vanilla - utility),
        "meets": bound <= budget,
    }
    result.trace.append(entry)
    log.info(
        "tune %s strength=%g worst_eps_p=%.2f (upper bound %.2f) eps_u=%.2f",
        name,
        strength,
        worst.mean,
        bound,
        entry["utility_loss"],
    )
    return bool(entry["meets"])


def _bisect(trial: Callable[[float], bool], strong: float, weak: float, steps: int) -> None:
    """Try the strongest strength, then the weakest; when only the strongest meets the budget, bisect between them
    (geometrically) for ``steps - 2`` more trials."""
    if trial(strong) and not trial(weak):
        failing, meeting = weak, strong
        for _ in range(max(steps - 2, 0)):
            mid = math.sqrt(failing * meeting)
            if trial(mid):
                meeting = mid
            else:
                failing = mid
