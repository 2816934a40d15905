"""Sweeps: expand a grid of strengths, defenses and seeds; train each point once (cached by
config hash, resumable); collect the tidy results table and the privacy-utility scores.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import logging
import math
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vflbench.errors import VFLBenchError
from vflbench.experiment.config import (
    ComponentSpec,
    ConfigError,
    ExperimentConfig,
    apply_override,
    build_config,
    check_components,
)
from vflbench.experiment.results import write_atomic
from vflbench.metrics.scores import (
    NO_PROTECTION_SCORE,
    ScoreTable,
    attack_leakage,
    comprehensive_dcs,
    dcs,
    leaks,
    optimal_pu_score,
    pu_scorable,
    pu_score,
    type_dcs,
)

log = logging.getLogger(__name__)
RUNS = "runs"
NO_DEFENSE = "none"
ATTACK_TYPES = {"labels": "label_inference", "features": "feature_reconstruction"}
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WORKER_EXIT_SECONDS = 5.0


class SweepConfig(BaseModel):
    """The ``sweep`` section of a config."""

    model_config = ConfigDict(extra="forbid")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="override path -> values")
    seeds: list[int] | None = Field(None, description="seeds (default: the config's seed)")
    defenses: list[list[ComponentSpec]] | None = Field(None, description="alternative defense lists")
    baseline: bool = Field(True, description="add a no-defense run per seed (needed for utility loss)")
    workers: int = Field(1, ge=1)
    executor: Literal["local", "ray"] = "local"


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep: its config and the coordinates that produced it."""

    config: ExperimentConfig
    coords: dict[str, Any]

    @property
    def hash(self) -> str:  # noqa: D102
        return self.config.hash()


def sweep_settings(cfg: ExperimentConfig) -> SweepConfig:
    """The validated sweep section (an empty sweep when absent)."""
    try:
        return SweepConfig.model_validate(cfg.sweep or {})
    except ValidationError as exc:
        valid = ", ".join(SweepConfig.model_fields)
        raise ConfigError(f"invalid sweep section ({valid} are valid keys): "
                          + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None


def expand(cfg: ExperimentConfig) -> list[SweepPoint]:
    """All points of the sweep, deduplicated by config hash, in a stable order."""
    settings = sweep_settings(cfg)
    base = cfg.model_dump(mode="json", exclude={"sweep"})
    variants = settings.defenses if settings.defenses is not None else [cfg.defenses]
    variant_dicts = [[s.model_dump(mode="json") for s in v] for v in variants]
    if settings.baseline and [] not in variant_dicts:
        variant_dicts = [[], *variant_dicts]
    seeds = settings.seeds if settings.seeds is not None else [cfg.seed]
    keys = list(settings.grid)
    points: dict[str, SweepPoint] = {}
    for defenses in variant_dicts:
        for values in itertools.product(*(settings.grid[k] for k in keys)):
            for seed in seeds:
                raw = {**json.loads(json.dumps(base)), "defenses": json.loads(json.dumps(defenses)), "seed": seed}
                coords: dict[str, Any] = {"seed": seed}
                for key, value in zip(keys, values, strict=True):
                    if key.startswith("defenses.") and (not _path_exists(raw, key) or _knobless(raw, key)):
                        continue
                    apply_override(raw, key.split("."), value)
                    coords[key] = value
                point = SweepPoint(build_config(raw), coords)
                points.setdefault(point.hash, point)
    return list(points.values())


def _knobless(raw: dict[str, Any], key: str) -> bool:
    """Whether ``key`` is ``defenses.N.strength`` of a defense without a strength knob (e.g. max_norm)."""
    from vflbench.defenses import DEFENSES

    parts = key.split(".")
    if len(parts) != 3 or parts[2] != "strength" or not parts[1].isdigit():
        return False
    name = raw["defenses"][int(parts[1])]["name"]
    return name in DEFENSES and getattr(DEFENSES.get(name).factory, "strength_param", None) is None


def _path_exists(raw: dict[str, Any], key: str) -> bool:
    node: Any = raw
    for part in key.split(".")[:-1]:
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                return False
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return False
    return True


def _run_point(config: dict[str, Any], runs_dir: str, data_root: str | None) -> str:
    from vflbench.experiment.run import claim_undefended, run_experiment

    cfg = ExperimentConfig.model_validate(config)
    if cfg.attacks and not cfg.defenses:  # also the undefended reference of the defended points: claim it
        with claim_undefended(cfg, Path(runs_dir)) as mine:
            if mine and not (Path(runs_dir) / cfg.hash() / "result.json").is_file():
                run_experiment(cfg, out_dir=runs_dir, data_root=data_root)
    else:
        run_experiment(cfg, out_dir=runs_dir, data_root=data_root)
    return cfg.hash()


def is_done(out_dir: Path, point: SweepPoint) -> bool:
    """Whether a point's result is on disk (results are written last and atomically)."""
    return (out_dir / RUNS / point.hash / "result.json").is_file()


def _check_points(points: Sequence[SweepPoint]) -> None:
    """Check every point's components (:func:`~vflbench.experiment.config.check_components`) before anything
    runs, so that a bad grid value (an unknown parameter, a strength given twice) fails the sweep at
    once, not after hours."""
    for point in points:
        try:
            check_components(point.config)
        except (VFLBenchError, ValueError, TypeError) as exc:
            raise ConfigError(f"sweep point {point.hash} (seed {point.config.seed}) is invalid: {exc}") from None


def _check_data(points: Sequence[SweepPoint], data_root: str | None) -> None:
    """Check what needs the data for every point before any runs (the attacks against the scenario,
    the metric, the labelled and auxiliary rows): each distinct data section is loaded once, with the
    seed of its first point, and only one dataset is held at a time."""
    from vflbench.experiment.plan import validate_attacks
    from vflbench.experiment.run import check_before_training
    from vflbench.experiment.scenario import load_vertical_data

    def key(point: SweepPoint) -> str:
        return json.dumps([point.config.data.model_dump(mode="json"), point.config.train.algorithm], sort_keys=True)

    current, vd = None, None
    for point in sorted(points, key=key):
        try:
            if key(point) != current:
                current, vd = key(point), load_vertical_data(point.config, data_root)
            assert vd is not None
            check_before_training(point.config, vd, validate_attacks(point.config, vd))
        except VFLBenchError as exc:
            raise ConfigError(f"sweep point {point.hash} (seed {point.config.seed}) is invalid: {exc}") from None


def run_sweep(cfg: ExperimentConfig, out_dir: str | Path, *, resume: bool = False, data_root: str | None = None,
              workers: int | None = None, runner: Callable[[dict[str, Any], str, str | None], str] = _run_point,
              on_done: Callable[[SweepPoint], None] | None = None,
              on_start: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Run every point (skipping finished ones with ``resume``); write summary.csv and scores.csv.

    With one worker the points run in this process; with ``n`` (local executor) they run in ``n`` worker
    processes forked from a fork server (:func:`start_workers`) while this process hands them out and reports
    them. ``on_start(to_run, total)`` is called once before the first point runs and ``on_done(point)``
    as soon as each point finishes, from this thread. If the sweep is interrupted (Ctrl-C, a signal turned
    into an exception) or a point fails, the queued points are cancelled, the workers are ended, the
    summary of the points finished so far is written, and the exception propagates.
    """
    out = Path(out_dir)
    settings = sweep_settings(cfg)
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}")
    n_workers = workers or settings.workers
    # started before the checks below import torch here (if the command line has not started it already), so that
    # the fork server imports it meanwhile
    context = start_workers(cfg, workers)
    points = expand(cfg)
    _check_points(points)
    todo = [p for p in points if not (resume and is_done(out, p))]
    if settings.executor == "local":  # a cluster's workers may see datasets this machine does not
        _check_data(todo, data_root)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "sweep.yaml", cfg.to_yaml())
    log.info("sweep: %d points, %d to run, %d already done", len(points), len(todo), len(points) - len(todo))
    if on_start is not None:
        on_start(len(todo), len(points))
    runs_dir = str(out / RUNS)
    try:
        if settings.executor == "ray":
            _run_ray(todo, runs_dir, data_root, on_done)
        elif context is None:
            for point in todo:
                runner(point.config.model_dump(mode="json"), runs_dir, data_root)
                if on_done is not None:
                    on_done(point)
        else:
            _run_pool(todo, runs_dir, data_root, n_workers, runner, on_done, context)
    except BaseException:
        _collect_finished(out, points)
        raise
    return collect(out, points)


def _collect_finished(out: Path, points: Sequence[SweepPoint]) -> None:
    """Write the summary of the finished points after an interruption, without hiding its cause."""
    try:
        table = collect(out, points)
    except Exception:  # the interruption (or the failed point) is what the caller must see
        log.exception("could not write the summary of the finished points")
        return
    done = table["config_hash"].nunique() if not table.empty else 0
    log.warning("sweep stopped: %d of %d points finished; their summary is in %s", done, len(points),
                out / "summary.csv")


def _worker_init() -> None:
    """Set up a sweep worker: the parent handles Ctrl-C, and the worker exits when the parent dies.

    A worker blocked on its task queue never sees the parent die (it holds both ends of the queue's
    pipe), so without this a ``kill -9`` of the sweep leaves every worker alive. Everywhere a daemon
    thread waits on the sweep's sentinel (:func:`_watch_parent`); on Linux the kernel also kills the
    worker with its parent process (``PR_SET_PDEATHSIG``), which is the sweep for a spawned worker
    (a fork server's worker's parent is the fork server, which outlives the sweep until its last
    worker exits).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            log.debug("prctl(PR_SET_PDEATHSIG) is not available; the watchdog thread alone ends the worker")
    sweep = multiprocessing.parent_process()
    if sweep is None or not sweep.is_alive():  # the sweep died before this worker started
        os._exit(1)
    threading.Thread(target=_watch_parent, name="vflbench-parent-watchdog", daemon=True).start()


def _watch_parent() -> None:
    """Exit when the sweep's process dies. The worker holds the read end of a pipe whose write end only
    the sweep holds (multiprocessing's parent sentinel, for spawned and fork-server workers alike); the
    kernel closes it when the sweep dies, before the sweep is reaped, so this also ends the worker while
    the sweep is a zombie (its pid still exists)."""
    sweep = multiprocessing.parent_process()
    if sweep is not None:
        sweep.join()
    os._exit(1)


#: What the workers' fork server imports once, so that every worker it forks starts with it imported
#: (:mod:`vflbench.experiment.sweep_worker`: the experiment layer, the attacks and defenses, and what a first run
#: imports on its own).
WORKER_PRELOAD = ["vflbench.experiment.sweep_worker"]


def start_workers(cfg: ExperimentConfig, workers: int | None = None) -> multiprocessing.context.BaseContext | None:
    """Start the fork server of the sweep's workers now, if ``cfg`` runs on local workers (``workers``, else
    ``sweep.workers``, above 1); the context to take them from, else ``None``.

    Call it before anything imports torch in this process (`vflbench sweep` calls it before it checks the
    config's components): the fork server's imports then run beside this process's instead of after them,
    which on a many-core machine halves the time before the first point starts. Calling it again is harmless."""
    settings = sweep_settings(cfg)
    if settings.executor != "local" or (workers or settings.workers) < 2:
        return None
    return _worker_context()


def _worker_context() -> multiprocessing.context.BaseContext:
    """Where the sweep's workers come from: a fork server where the platform has one (Linux, macOS),
    started now (if it is not running yet), else spawned processes.

    A spawned worker imports torch and vflbench itself (2-5 s here) before its first point. The
    fork server starts importing ``WORKER_PRELOAD`` at once, while this process checks the sweep's
    points (which imports the same here), and then forks each worker ready to run. It is a fresh
    single-threaded process that runs no torch operation, so no thread pool is copied into a worker
    (the reason workers are not forked from this process, which has run some)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return get_context("spawn")
    context = get_context("forkserver")
    context.set_forkserver_preload(WORKER_PRELOAD)
    multiprocessing.forkserver.ensure_running()
    return context


def _longest_first(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """The points in decreasing order of their expected run time, so that a long point does not
    start last and leave the other workers idle at the end. The estimate is the number of training
    epochs (the one cost knob every config has). Of points of equal epochs, those without defenses
    come first: a defended point with attacks reads its undefended run's result when it has trained,
    and that run, started first, is then done (the worker rarely waits for it); otherwise the sweep's
    order is kept."""
    return sorted(points, key=lambda p: (-p.config.train.epochs, bool(p.config.defenses)))


def _run_pool(todo: Sequence[SweepPoint], runs_dir: str, data_root: str | None, n_workers: int,
              runner: Callable[[dict[str, Any], str, str | None], str],
              on_done: Callable[[SweepPoint], None] | None,
              context: multiprocessing.context.BaseContext | None = None) -> None:
    """Run ``todo`` on ``n_workers`` worker processes (from ``context``, by default :func:`_worker_context`),
    longest points first, while this process only hands them out and reports them.

    Every point is queued at once, in order; each worker takes the next as soon as it finishes one (the pool's
    queue), so no worker waits for this process. The workers live for the whole sweep. ``on_done`` is called
    from this thread as soon as each point finishes. On any exception (an interruption included, or a failed
    point) the queued points are cancelled and the workers ended before re-raising.
    """
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(max_workers=n_workers, mp_context=context or _worker_context(),
                               initializer=_worker_init)
    try:
        # the first submissions start the workers: each waits for the fork server's imports (here, not in a worker)
        pending = {pool.submit(runner, p.config.model_dump(mode="json"), runs_dir, data_root): p
                   for p in _longest_first(todo)}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                point = pending.pop(future)
                future.result()  # a failed point raises its error here
                if on_done is not None:
                    on_done(point)
        pool.shutdown(wait=True)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        workers = [p for p in multiprocessing.active_children() if p not in before]
        for process in workers:
            process.terminate()
        for process in workers:
            process.join(WORKER_EXIT_SECONDS)
            if process.is_alive():
                process.kill()
        raise


def _run_ray(points: Sequence[SweepPoint], runs_dir: str, data_root: str | None,
             on_done: Callable[[SweepPoint], None] | None = None) -> None:
    """Run the points as Ray tasks (one CPU each) on the Ray instance this process is connected to,
    or on a new local one; an interruption or a failed point cancels the tasks still queued."""
    try:
        import ray
    except ImportError:
        raise ConfigError("sweep.executor 'ray' needs Ray: pip install 'vflbench[cluster]'") from None
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(_run_point)
    pending = {remote.remote(p.config.model_dump(mode="json"), runs_dir, data_root): p for p in points}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            point = pending.pop(ready[0])
            ray.get(ready[0])
            if on_done is not None:
                on_done(point)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise


def _defense_label(defenses: list[dict[str, Any]]) -> str:
    return "+".join(d["name"] for d in defenses) or NO_DEFENSE


def _strength(defenses: list[dict[str, Any]]) -> float | None:
    """The main knob of the first defense that has one (``strength`` or its aliased name)."""
    from vflbench.defenses import DEFENSES

    for d in defenses:
        params = d.get("params", {})
        knob = getattr(DEFENSES.get(d["name"]).factory, "strength_param", None)
        for key in ("strength", knob):
            if key is not None and isinstance(params.get(key), (int, float)) and not isinstance(params[key], bool):
                return float(params[key])
    return None


def _final_mask_ratio(metrics: Path) -> float | None:
    """VMask's mask ratio over the whole training (its Fig. 8 definition), from the last epoch's
    record of ``metrics.jsonl``; ``None`` for runs without a masking defense."""
    if not metrics.is_file():
        return None
    lines = metrics.read_text().splitlines()
    last = json.loads(lines[-1]) if lines else {}
    return next((float(v) for k, v in last.items() if k.endswith(".mask_ratio")), None)


def collect(out_dir: Path, points: Sequence[SweepPoint]) -> pd.DataFrame:
    """Build the tidy table from the finished runs and write summary.csv, scores.csv and coverage.csv."""
    rows = []
    stacks: list[tuple[list[dict[str, Any]], set[str]]] = []
    for point in points:
        path = out_dir / RUNS / point.hash / "result.json"
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        cfg = point.config
        base = {"dataset": cfg.data.name, "algorithm": cfg.train.algorithm,
                "defense": _defense_label(result["defense"]),
                "strength": _strength(result["defense"]), "seed": cfg.seed, "config_hash": point.hash,
                "utility_metric": result["utility"]["metric"], "utility": result["utility"]["value"],
                "train_seconds": result["timing"]["train_seconds"]}
        ratio = _final_mask_ratio(out_dir / RUNS / point.hash / "metrics.jsonl")
        if ratio is not None:
            base["mask_ratio"] = ratio
        stacks.append((result["defense"], {a["name"] for a in result["attacks"]}))
        if not result["attacks"]:
            rows.append({**base, "attack": None})
        for a in result["attacks"]:
            leakage = attack_leakage(a)
            undefended = a.get("undefended_leakage", leakage if not result["defense"] else None)
            rows.append({**base, "attack": a["name"], "attack_target": a["target"], "attack_metric": a["metric"],
                         "attack_direction": a.get("direction"), "attack_value": a["value"], "prior": a["prior"],
                         "prior_name": a["prior_name"], "leakage": leakage,
                         "undefended_leakage": math.nan if undefended is None else undefended,
                         "leaks_without_defense": leaks(undefended)})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    vanilla = (table[table["defense"] == NO_DEFENSE].groupby(["dataset", "algorithm", "seed"])["utility"].first())
    keys = list(zip(table["dataset"], table["algorithm"], table["seed"], strict=True))
    table["utility_loss"] = [100.0 * (vanilla[k] - u) if k in vanilla.index else math.nan
                             for k, u in zip(keys, table["utility"], strict=True)]
    scored = [_row_pu(r) for r in table.to_dict("records")]
    table["pu_score"] = [score for score, _ in scored]
    table["pu_note"] = [note for _, note in scored]
    coverage = adaptive_coverage(stacks)
    write_atomic(out_dir / "summary.csv", table.to_csv(index=False))
    write_atomic(out_dir / "scores.csv", scores_table(table).to_csv(index=False))
    write_atomic(out_dir / "coverage.csv", coverage.to_csv(index=False))
    return table


def _undefended_note(attack: str, undefended: float) -> str:
    return (f"{attack} does not beat its prior without a defense (undefended leakage {undefended:.2f} points "
            "<= 0), so no defense can be credited for stopping it")


def _row_pu(row: dict[str, Any]) -> tuple[int | None, str]:
    """Kang eq. 21 for one summary row, or ``None`` and why it is not defined there."""
    if pd.isna(row.get("attack")):
        return None, ""
    reason = pu_scorable(row["attack_target"], row["attack_metric"])
    if reason is not None:
        return None, f"PU score {reason}"
    if leaks(row["undefended_leakage"]) is False:
        return None, "not scored: " + _undefended_note(row["attack"], row["undefended_leakage"])
    if row["defense"] == NO_DEFENSE:
        return NO_PROTECTION_SCORE, "no defense: scored 0 by Kang's convention for 'No Protect' (Tables 10-14)"
    if math.isnan(row["utility_loss"]):
        return None, "not scored: no run without defense for this seed (sweep.baseline: false), so no utility loss"
    return pu_score(row["leakage"], row["utility_loss"]), ""


def scores_table(table: pd.DataFrame, score_table: ScoreTable = ScoreTable()) -> pd.DataFrame:
    """One row per (dataset, algorithm, defense): Kang's optimal PU score over strengths (means
    over seeds) against the worst label attack that leaks without a defense, the leakage of each
    attack and the utility loss at that strength, C-DCS over the same attacks, and a ``note`` on
    every attack left out of the scores and why (feature attacks; attacks that do not beat their
    prior without a defense). With no attack left, ``s_pu`` and ``c_dcs`` are empty. A table of an
    older sweep without ``undefended_leakage`` scores every label attack (its verdict is unknown)."""
    attacked = table.dropna(subset=["attack"]) if "attack" in table else table.iloc[0:0]
    rows = []
    for (dataset, algorithm, defense), group in attacked.groupby(["dataset", "algorithm", "defense"], dropna=False):
        means = group.groupby(["strength", "attack"], dropna=False).agg(
            leakage=("leakage", "mean"), utility_loss=("utility_loss", "mean"), utility=("utility", "mean"),
            target=("attack_target", "first"), metric=("attack_metric", "first")).reset_index()
        notes, scored = [], []
        for attack, per in group.groupby("attack"):
            first = per.iloc[0]
            reason = pu_scorable(first["attack_target"], first["attack_metric"])
            undefended = per["undefended_leakage"].mean() if "undefended_leakage" in per else math.nan
            if reason is not None:
                notes.append(f"{attack}: left out of s_pu and c_dcs, {reason}")
            elif leaks(undefended) is False:
                notes.append(f"{attack}: left out of s_pu and c_dcs, " + _undefended_note(str(attack), undefended))
            else:
                scored.append(attack)
        row: dict[str, Any] = {"dataset": dataset, "algorithm": algorithm, "defense": defense,
                               "best_strength": None, "utility_loss": None, "s_pu": None, "c_dcs": None}
        usable = means[means["attack"].isin(scored)]
        if usable.empty:
            notes.append("s_pu and c_dcs not defined: no label attack that leaks without a defense")
            if means["strength"].nunique(dropna=False) == 1:
                row.update({f"eps_p.{k}": round(v, 2) for k, v in zip(means["attack"], means["leakage"], strict=True)})
        elif usable["utility_loss"].isna().any():
            notes.append("s_pu and c_dcs not defined: no run without defense (sweep.baseline: false)")
        else:
            points = [(None if pd.isna(strength) else float(strength), float(per["utility_loss"].iloc[0]),
                       dict(zip(per["attack"], per["leakage"], strict=True)))
                      for strength, per in usable.groupby("strength", dropna=False)]
            best = optimal_pu_score(points, score_table, no_protection=defense == NO_DEFENSE)
            if defense == NO_DEFENSE:
                notes.append("s_pu 0 by Kang's convention for 'No Protect' (Tables 10-14)")
            at = usable[(usable["strength"] == best.strength) | (usable["strength"].isna() & (best.strength is None))]
            vanilla_utility = at["utility"].iloc[0] + at["utility_loss"].iloc[0] / 100.0
            by_type: dict[str, list[float]] = {}
            for _, r in at.iterrows():
                by_type.setdefault(ATTACK_TYPES.get(r["target"], str(r["target"])), []).append(
                    dcs(r["utility"], r["leakage"] / 100.0, main_ideal=vanilla_utility, attack_ideal=0.0))
            row.update(best_strength=best.strength, utility_loss=round(best.utility_loss, 2), s_pu=best.score,
                       c_dcs=round(comprehensive_dcs({k: type_dcs(v) for k, v in by_type.items()}), 4))
            at_all = means[(means["strength"] == best.strength)
                           | (means["strength"].isna() & (best.strength is None))]
            row.update({f"eps_p.{k}": round(v, 2) for k, v in zip(at_all["attack"], at_all["leakage"], strict=True)})
        row["note"] = "; ".join(notes)
        rows.append(row)
    return pd.DataFrame(rows)


def _coverage_row(defense: str, adaptive: str, kind: str, evaluated: bool) -> dict[str, Any]:
    note = "" if evaluated else (f"{defense} was not evaluated against its adaptive {kind} {adaptive}; "
                                 "its scores hold only against the attacks that were run")
    if note:
        log.warning("note: %s", note)
    return {"defense": defense, "adaptive": adaptive, "kind": kind, "evaluated": evaluated, "note": note}


def adaptive_coverage(stacks: Sequence[tuple[list[dict[str, Any]], set[str]]]) -> pd.DataFrame:
    """For each defense of the sweep, the adaptive attacks (and adaptive settings) that exist for it
    (``Defense.adaptive_attacks``, ``Defense.adaptive_settings``) and whether some run evaluated the
    defense against them; each one not evaluated is logged as a note. ``stacks``: each run's defense
    entries and the names of the attacks it ran."""
    from vflbench.attacks import ATTACKS
    from vflbench.defenses import DEFENSES

    rows = []
    names = sorted({d["name"] for defenses, _ in stacks for d in defenses})
    for name in names:
        cls = DEFENSES.get(name).factory
        runs = [(defenses, attacks) for defenses, attacks in stacks if any(d["name"] == name for d in defenses)]
        for attack in getattr(cls, "adaptive_attacks", ()):
            evaluated = any(attack in attacks for _, attacks in runs)
            registered = "" if attack in ATTACKS else " (not registered in this build)"
            rows.append(_coverage_row(name, attack + registered, "attack", evaluated))
        for param, value in getattr(cls, "adaptive_settings", ()):
            evaluated = any(d.get("params", {}).get(param) == value
                            for defenses, _ in runs for d in defenses if d["name"] == name)
            rows.append(_coverage_row(name, f"{param}: {json.dumps(value)}", "setting", evaluated))
    return pd.DataFrame(rows, columns=["defense", "adaptive", "kind", "evaluated", "note"])
