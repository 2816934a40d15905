"""Sweeps: expand a grid of strengths, defenses and seeds; train each point into ``runs/<config hash>/``
(every point again, unless ``resume`` skips those whose ``result.json`` exists; the undefended run that
defended points share is trained once); collect the tidy results table and the privacy-utility scores.
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
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vflbench.errors import VFLBenchError
from vflbench.experiment import detection
from vflbench.experiment.config import (
    ComponentSpec,
    ConfigError,
    ExperimentConfig,
    apply_override,
    build_config,
    check_components,
    load_yaml,
)
from vflbench.experiment.lock import exclusive
from vflbench.experiment.results import AttackResult, RunResult, read_result, write_atomic
from vflbench.experiment.workers import WORKER_PRELOAD, fork_server, start_sweep_workers
from vflbench.metrics.scores import (
    NO_PROTECTION_SCORE,
    ScoreTable,
    comprehensive_dcs,
    dcs,
    leaks,
    optimal_pu_score,
    pu_scorable,
    pu_score,
    type_dcs,
)
from vflbench.metrics.stats import difference_interval, mean_interval

log = logging.getLogger(__name__)
RUNS = "runs"
SWEEP_LOCK = ".sweep.lock"
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
    attacker_search: bool = Field(
        False, description="run the attacker search on every point (sets evaluation.attacker_search on each)"
    )


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
        raise ConfigError(
            f"invalid sweep section ({valid} are valid keys): "
            + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        ) from None


def expand(cfg: ExperimentConfig) -> list[SweepPoint]:
    """All points of the sweep, deduplicated by config hash, in a stable order."""
    settings = sweep_settings(cfg)
    base = cfg.model_dump(mode="json", exclude={"sweep"})
    if settings.attacker_search:
        base["evaluation"]["attacker_search"] = True
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
    from vflbench.defenses import DEFENSES, defense_class

    parts = key.split(".")
    if len(parts) != 3 or parts[2] != "strength" or not parts[1].isdigit():
        return False
    name = raw["defenses"][int(parts[1])]["name"]
    return name in DEFENSES and defense_class(name).strength_param is None


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


def run_sweep(
    cfg: ExperimentConfig,
    out_dir: str | Path,
    *,
    resume: bool = False,
    data_root: str | None = None,
    workers: int | None = None,
    runner: Callable[[dict[str, Any], str, str | None], str] = _run_point,
    on_done: Callable[[SweepPoint], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    force: bool = False,
) -> pd.DataFrame:
    """Run every point (skipping finished ones with ``resume``); write summary.csv and scores.csv.

    With one worker the points run in this process; with ``n`` (local executor) they run in ``n`` worker
    processes forked from a fork server (:func:`start_workers`) while this process hands them out and reports
    them. ``on_start(to_run, total)`` is called once before the first point runs and ``on_done(point)``
    as soon as each point finishes, from this thread. If the sweep is interrupted (Ctrl-C, a signal turned
    into an exception) or a point fails, the queued points are cancelled, the workers are ended, the
    summary of the points finished so far is written, and the exception propagates.

    One sweep at a time writes into ``out_dir`` (a lock file, ``.sweep.lock``, names its pid; another
    sweep there is refused). ``resume`` continues only the sweep that ``out_dir/sweep.yaml`` records:
    a changed definition is refused, naming what changed, unless ``force``.
    """
    out = Path(out_dir)
    settings = sweep_settings(cfg)
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}")
    if resume and not force:
        check_same_definition(cfg, out)
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
    with exclusive(
        out / SWEEP_LOCK,
        busy=f"another sweep (pid {{pid}}) is writing into {out}; wait for it to end, or give this one another --out",
    ):
        write_atomic(out / "sweep.yaml", cfg.to_yaml())
        log.info("sweep: %d points, %d to run, %d already done", len(points), len(todo), len(points) - len(todo))
        if on_start is not None:
            on_start(len(todo), len(points))
        runs_dir = str(out / RUNS)
        try:
            _run_points(todo, runs_dir, data_root, settings.executor, context, n_workers, runner, on_done)
        except BaseException:
            _collect_finished(out, points)
            raise
        return collect(out, points)


def _run_points(
    todo: Sequence[SweepPoint],
    runs_dir: str,
    data_root: str | None,
    executor: str,
    context: multiprocessing.context.BaseContext | None,
    n_workers: int,
    runner: Callable[[dict[str, Any], str, str | None], str],
    on_done: Callable[[SweepPoint], None] | None,
) -> None:
    """Run the points ``todo`` where the sweep says: as Ray tasks, in this process (no worker ``context``), or
    on a pool of ``n_workers`` local workers; ``on_done`` as each one finishes."""
    if executor == "ray":
        _run_ray(todo, runs_dir, data_root, on_done)
    elif context is None:
        for point in todo:
            runner(point.config.model_dump(mode="json"), runs_dir, data_root)
            if on_done is not None:
                on_done(point)
    else:
        _run_pool(todo, runs_dir, data_root, n_workers, runner, on_done, context)


#: What a sweep's section says about how to run its points, not which points it has.
HOW_NOT_WHAT = ("workers", "executor")


def _changes(before: Any, after: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Where ``before`` and ``after`` differ: ``(dotted.path, old, new)`` at the deepest section (dicts by key,
    lists of the same length by index) that holds the difference; ``_ABSENT`` for a key one side lacks."""
    if before == after:
        return []
    if isinstance(before, dict) and isinstance(after, dict):
        return [
            c
            for key in sorted(before.keys() | after.keys(), key=str)
            for c in _changes(before.get(key, _ABSENT), after.get(key, _ABSENT), f"{path}.{key}" if path else key)
        ]
    if (
        isinstance(before, list)
        and isinstance(after, list)
        and len(before) == len(after)
        and all(isinstance(v, (dict, list)) for v in before + after)
    ):
        return [c for i, (x, y) in enumerate(zip(before, after, strict=True)) for c in _changes(x, y, f"{path}.{i}")]
    return [(path or "config", before, after)]


def _definition(cfg: ExperimentConfig) -> dict[str, Any]:
    raw = cfg.model_dump(mode="json")
    for key in HOW_NOT_WHAT:
        (raw.get("sweep") or {}).pop(key, None)
    return raw


def check_same_definition(cfg: ExperimentConfig, out: Path) -> None:
    """Refuse to resume the sweep recorded in ``out/sweep.yaml`` with a different definition ``cfg`` (its
    points, defenses, grid or seeds; ``sweep.workers`` and ``sweep.executor`` may change), naming what
    changed. Resuming with another definition would run a new sweep beside the old one and overwrite the
    old one's summary."""
    stored = out / "sweep.yaml"
    if not stored.is_file():
        return
    how = (
        f"to continue the sweep in {out}, resume it with its own definition (the config it was started "
        f"with, as recorded in {stored}); to run this one, give a new --out, or add --force to continue in "
        f"{out} with the new definition (finished points whose config is unchanged are reused; summary.csv "
        "then describes the new sweep only)"
    )
    try:
        before = _definition(build_config(load_yaml(stored.read_text(), str(stored)) or {}))
    except (VFLBenchError, OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--resume: cannot read the definition of the sweep in {out} ({exc}); {how}") from None
    changed = _changes(before, _definition(cfg))
    if changed:

        def show(value: Any) -> str:
            text = "(absent)" if value is _ABSENT else json.dumps(value)
            return text if len(text) <= 60 else text[:57] + "..."

        shown = "; ".join(f"{path}: {show(old)} -> {show(new)}" for path, old, new in changed[:4])
        more = f"; and {len(changed) - 4} more" if len(changed) > 4 else ""
        raise ConfigError(f"--resume: the sweep in {out} was started with another definition ({shown}{more}); {how}")


_ABSENT = object()


def _collect_finished(out: Path, points: Sequence[SweepPoint]) -> None:
    """Write the summary of the finished points after an interruption, without hiding its cause."""
    try:
        table = collect(out, points)
    except OSError as exc:  # the same full disk that stopped a point: one line, the point's error follows
        log.error("could not write the summary of the finished points: %s", exc.strerror or exc)
        return
    except Exception:  # the interruption (or the failed point) is what the caller must see
        log.exception("could not write the summary of the finished points")
        return
    done = table["config_hash"].nunique() if not table.empty else 0
    log.warning(
        "sweep stopped: %d of %d points finished; their summary is in %s", done, len(points), out / "summary.csv"
    )


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


def start_workers(cfg: ExperimentConfig, workers: int | None = None) -> multiprocessing.context.BaseContext | None:
    """Start the fork server of the sweep's workers now, if ``cfg`` runs on local workers (``workers``, else
    ``sweep.workers``, above 1); the context to take them from, else ``None``
    (:func:`~vflbench.experiment.workers.start_sweep_workers`, which `vflbench sweep` calls before it imports
    this module and torch). Calling it again is harmless."""
    settings = sweep_settings(cfg)
    return start_sweep_workers({"workers": settings.workers, "executor": settings.executor}, workers)


def _worker_context() -> multiprocessing.context.BaseContext:
    """Where the sweep's workers come from: a fork server where the platform has one (Linux, macOS),
    started now (if it is not running yet), else spawned processes.

    A spawned worker imports torch and vflbench itself (2-5 s here) before its first point. The
    fork server starts importing ``WORKER_PRELOAD`` at once, while this process checks the sweep's
    points (which imports the same here), and then forks each worker ready to run
    (:mod:`vflbench.experiment.workers`)."""
    return fork_server(WORKER_PRELOAD)


def _longest_first(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """The points in decreasing order of their expected run time, so that a long point does not
    start last and leave the other workers idle at the end. The estimate is the number of training
    epochs (the one cost knob every config has). Of points of equal epochs, those without defenses
    come first: a defended point with attacks reads its undefended run's result when it has trained,
    and that run, started first, is then done (the worker rarely waits for it); otherwise the sweep's
    order is kept."""
    return sorted(points, key=lambda p: (-p.config.train.epochs, bool(p.config.defenses)))


def _run_pool(
    todo: Sequence[SweepPoint],
    runs_dir: str,
    data_root: str | None,
    n_workers: int,
    runner: Callable[[dict[str, Any], str, str | None], str],
    on_done: Callable[[SweepPoint], None] | None,
    context: multiprocessing.context.BaseContext | None = None,
) -> None:
    """Run ``todo`` on ``n_workers`` worker processes (from ``context``, by default :func:`_worker_context`),
    longest points first, while this process only hands them out and reports them.

    Every point is queued at once, in order; each worker takes the next as soon as it finishes one (the pool's
    queue), so no worker waits for this process. The workers live for the whole sweep. ``on_done`` is called
    from this thread as soon as each point finishes. On any exception (an interruption included, or a failed
    point) the queued points are cancelled and the workers ended before re-raising.
    """
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(max_workers=n_workers, mp_context=context or _worker_context(), initializer=_worker_init)
    try:
        # the first submissions start the workers: each waits for the fork server's imports (here, not in a worker)
        pending = {
            pool.submit(runner, p.config.model_dump(mode="json"), runs_dir, data_root): p for p in _longest_first(todo)
        }
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


def _run_ray(
    points: Sequence[SweepPoint],
    runs_dir: str,
    data_root: str | None,
    on_done: Callable[[SweepPoint], None] | None = None,
) -> None:
    """Run the points as Ray tasks (one CPU each) on the Ray cluster this process is connected to (``RAY_ADDRESS``),
    or on a new local instance; an interruption or a failed point cancels the tasks still queued.

    Nothing is shared through a filesystem: each task runs its point in a temporary directory of whichever node Ray
    chose (:func:`_run_point_shipped`) and returns the files it wrote, which this process (the driver) writes into
    ``runs_dir`` atomically, ``result.json`` last. A defended point with attacks reports its attacks' leakage
    without the defenses, so its undefended reference runs first (a task of its own when it is not a point of the
    sweep) and its ``result.json`` travels with the point. What a worker node needs: the same vflbench and the
    datasets under ``data_root`` (or its own ``VFLBENCH_DATA``); see docs/deployment-cluster.md."""
    try:
        import ray
    except ImportError:
        raise ConfigError("sweep.executor 'ray' needs Ray: pip install 'vflbench[cluster]'") from None
    from vflbench.experiment.run import undefended_config

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(_run_point_shipped)
    runs = Path(runs_dir)
    first, waiting = _split_by_reference(points, runs)
    hashes = {p.hash for p in points}
    extra = {ref: undefended_config(later[0].config) for ref, later in waiting.items() if ref not in hashes}
    pending: dict[Any, tuple[str, SweepPoint | None]] = {}

    def submit(cfg: ExperimentConfig, point: SweepPoint | None) -> None:
        ref = _reference_hash(cfg)
        given = {f"{ref}/result.json": (runs / ref / "result.json").read_bytes()} if ref is not None else {}
        pending[remote.remote(cfg.model_dump(mode="json"), data_root, given)] = (cfg.hash(), point)

    for point in first:
        submit(point.config, point)
    for cfg in extra.values():
        submit(cfg, None)
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            done, finished = pending.pop(ready[0])
            _write_run_files(runs, ray.get(ready[0]))
            if finished is not None and on_done is not None:
                on_done(finished)
            for later in waiting.pop(done, []):  # its undefended reference is on the driver's disk now
                submit(later.config, later)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise


def _reference_hash(cfg: ExperimentConfig) -> str | None:
    """The hash of the undefended run whose result a defended point with attacks reads, else ``None``."""
    from vflbench.experiment.run import undefended_config

    return undefended_config(cfg).hash() if cfg.defenses and cfg.attacks else None


def _split_by_reference(
    points: Sequence[SweepPoint], runs: Path
) -> tuple[list[SweepPoint], dict[str, list[SweepPoint]]]:
    """The points that can start now (no undefended reference, or its result is in ``runs`` already), and the
    others by the hash of the reference they wait for, each in the sweep's order."""
    waiting: dict[str, list[SweepPoint]] = {}
    first: list[SweepPoint] = []
    for point in points:
        ref = _reference_hash(point.config)
        if ref is None or (runs / ref / "result.json").is_file():
            first.append(point)
        else:
            waiting.setdefault(ref, []).append(point)
    return first, waiting


def _run_point_shipped(config: dict[str, Any], data_root: str | None, given: dict[str, bytes]) -> dict[str, bytes]:
    """A Ray task: run one point in a temporary runs directory on this node, after placing the files ``given`` there
    (an undefended reference's ``result.json``, by path relative to the runs directory), and return every file the
    run wrote (not the given ones, nor lock or temporary files), by the same relative paths."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="vflbench-point-") as tmp:
        runs = Path(tmp) / RUNS
        for rel, data in given.items():
            path = runs / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        _run_point(config, str(runs), data_root)
        return {
            rel: path.read_bytes()
            for path in sorted(runs.rglob("*"))
            if path.is_file()
            and not path.name.startswith(".")
            and (rel := path.relative_to(runs).as_posix()) not in given
        }


def _write_run_files(runs: Path, files: dict[str, bytes]) -> None:
    """Write the files a Ray task returned under ``runs``, each atomically, every ``result.json`` last (a run counts
    as done once it is there)."""
    import tempfile

    umask = os.umask(0o022)
    os.umask(umask)
    for rel in sorted(files, key=lambda r: (r.endswith("/result.json"), r)):
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise VFLBenchError(f"a sweep task returned a file outside its runs directory: {rel!r}")
        path = runs / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o666 & ~umask)
            with os.fdopen(fd, "wb") as handle:
                handle.write(files[rel])
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _defense_label(defenses: list[dict[str, Any]], coords: dict[str, Any] | None = None) -> str:
    """The defenses' names joined by ``+`` and, in brackets, the sweep grid's values of their parameters other than
    the strength knob (e.g. ``vmask_alls [sigma=0.1]``): points that differ in them are different defenses, never
    averaged together (the strength knob has its own column)."""
    from vflbench.defenses import DEFENSES, defense_class

    label = "+".join(d["name"] for d in defenses) or NO_DEFENSE
    extra = []
    for key, value in (coords or {}).items():
        parts = key.split(".")
        if parts[0] != "defenses" or len(parts) < 3 or not parts[1].isdigit() or int(parts[1]) >= len(defenses):
            continue
        name = defenses[int(parts[1])]["name"]
        knob = defense_class(name).strength_param if name in DEFENSES else None
        if parts[2] not in ("strength", knob):
            extra.append(
                f"{'.'.join(parts[2:])}={json.dumps(value)}"
                if len(defenses) == 1
                else f"{name}.{'.'.join(parts[2:])}={json.dumps(value)}"
            )
    return label + (f" [{', '.join(extra)}]" if extra else "")


def _strength(defenses: list[dict[str, Any]]) -> float | None:
    """The main knob of the first defense that has one (``strength`` or its aliased name)."""
    from vflbench.defenses import defense_class

    for d in defenses:
        params = d.get("params", {})
        knob = defense_class(d["name"]).strength_param
        for key in ("strength", knob):
            if key is not None and isinstance(params.get(key), (int, float)) and not isinstance(params[key], bool):
                return float(params[key])
    return None


def _summary_metrics(defenses: Sequence[dict[str, Any]], metrics: Path) -> dict[str, float]:
    """The run's defenses' :attr:`~vflbench.protocol.Defense.summary_metrics` (each defense says which of its
    per-epoch values summarise the run, e.g. VMask's ``mask_ratio``), from the last epoch's record of
    ``metrics.jsonl``, by metric name (the first defense that reports one wins)."""
    from vflbench.defenses import DEFENSES, defense_class

    wanted = [
        (d["name"], key) for d in defenses if d["name"] in DEFENSES for key in defense_class(d["name"]).summary_metrics
    ]
    if not wanted or not metrics.is_file():
        return {}
    lines = metrics.read_text().splitlines()
    last = json.loads(lines[-1]) if lines else {}
    out: dict[str, float] = {}
    for name, key in wanted:
        if f"{name}.{key}" in last and key not in out:
            out[key] = float(last[f"{name}.{key}"])
    return out


def _setting(point: SweepPoint) -> str:
    """The point's grid coordinates other than the seed and the defenses' (``""`` when there are none): points
    that differ in them are different experiments, never averaged together."""
    rest = {k: v for k, v in point.coords.items() if k != "seed" and not k.startswith("defenses.")}
    return json.dumps(rest, sort_keys=True) if rest else ""


#: Columns of summary.csv computed over every (dataset, algorithm, setting, defense, strength, attack) group.
GROUP = ["dataset", "algorithm", "setting", "defense", "strength", "attack"]


def collect(out_dir: Path, points: Sequence[SweepPoint]) -> pd.DataFrame:
    """Build the tidy table from the finished runs and write summary.csv, scores.csv and coverage.csv.

    One row per run and attack. Beside each run's own numbers (its leakage is the mean over its repeats) every
    row carries its group's statistics over seeds × repeats (:mod:`vflbench.metrics.stats`): ``leakage_mean``
    with ``leakage_ci_low``/``leakage_ci_high``; ``delta_leakage`` = ε_p − ε_p(undefended), paired by seed,
    with ``delta_ci_low``/``delta_ci_high``; ``change`` (``lower``, ``higher``, or ``no measurable change`` when
    that interval reaches 0); and ``leaks_without_defense`` (the interval of the undefended leakage lies above 0).

    With the attacker search (``evaluation.attacker_search``) every row also says what the search did
    (``search``: ``searched`` or ``default attacker only``), the setting it chose on that run
    (``attacker_setting``, JSON) and that attacker's leakage (``leakage_worst``, ``undefended_leakage_worst``), and
    carries the same group statistics of the searched attacker (:data:`WORST_COLUMNS`: ``leakage_worst_mean``,
    ``leakage_worst_ci_low``/``leakage_worst_ci_high``, ``delta_worst`` with its interval, ``change_worst``,
    ``leaks_worst_without_defense``).
    """
    rows = []
    repeats: list[tuple[list[float], list[float] | None]] = []
    worst_repeats: list[tuple[list[float], list[float] | None]] = []
    stacks: list[tuple[list[dict[str, Any]], set[str]]] = []
    for point in points:
        path = out_dir / RUNS / point.hash / "result.json"
        if not path.is_file():
            continue
        result = read_result(path)
        base = _run_columns(out_dir, point, result)
        stacks.append((result.defense, {a.name for a in result.attacks}))
        if not result.attacks:
            rows.append({**base, "attack": None})
            repeats.append(([], None))
            worst_repeats.append(([], None))
        for a in result.attacks:
            row, own_repeats, worst_pair = _attack_row(base, a, bool(result.defense))
            rows.append(row)
            repeats.append(own_repeats)
            worst_repeats.append(worst_pair)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    _group_statistics(table, repeats)
    _group_statistics(table, worst_repeats, WORST_COLUMNS)
    detection.group_statistics(table)
    _utility_and_pu(table)
    coverage = adaptive_coverage(stacks)
    write_atomic(out_dir / "summary.csv", table.to_csv(index=False))
    write_atomic(out_dir / "scores.csv", scores_table(table).to_csv(index=False))
    write_atomic(out_dir / "coverage.csv", coverage.to_csv(index=False))
    return table


def _run_columns(out_dir: Path, point: SweepPoint, result: RunResult) -> dict[str, Any]:
    """The columns of :func:`collect` that every row of a finished run shares: its coordinates, utility, time, the
    defenses' summary metrics (from its ``metrics.jsonl``) and detection columns."""
    cfg = point.config
    base = {
        "dataset": cfg.data.name,
        "algorithm": cfg.train.algorithm,
        "setting": _setting(point),
        "defense": _defense_label(result.defense, point.coords),
        "strength": _strength(result.defense),
        "seed": cfg.seed,
        "config_hash": point.hash,
        "confidence": cfg.evaluation.confidence,
        "utility_metric": result.utility.metric,
        "utility": result.utility.value,
        "train_seconds": result.timing.train_seconds,
    }
    base.update(_summary_metrics(result.defense, out_dir / RUNS / point.hash / "metrics.jsonl"))
    base.update(detection.run_columns(result.defense))
    return base


def _attack_row(
    base: dict[str, Any], a: AttackResult, defended: bool
) -> tuple[dict[str, Any], tuple[list[float], list[float] | None], tuple[list[float], list[float] | None]]:
    """The row of :func:`collect` for attack result ``a`` of a run (``base``: the run's columns; ``defended``: the
    run has defenses), and its leakage's repeats beside the undefended run's, of the default attacker and of the
    searched one (the undefended repeats ``None`` when unknown)."""
    leakage = a.leakage  # rescored by from_dict for results written before leakage had one scale
    own = [float(v) for v in a.leakages or [leakage]]
    undefended_repeats = a.undefended_leakages
    if undefended_repeats is None and a.undefended_leakage is not None:
        undefended_repeats = [a.undefended_leakage]
    if undefended_repeats is None and not defended:
        undefended_repeats = own
    undefended = (sum(undefended_repeats) / len(undefended_repeats)) if undefended_repeats else math.nan
    worst = [float(v) for v in a.leakages_worst or []]
    undefended_worst = [float(v) for v in a.undefended_leakages_worst or []]
    if not undefended_worst and worst and not defended:
        undefended_worst = worst
    search = a.details.get("search") or {}
    row = {
        **base,
        "attack": a.name,
        "attack_target": a.target,
        "attack_metric": a.metric,
        "attack_direction": a.direction,
        "selection": a.details.get("selection", "unknown"),
        "attack_value": a.value,
        "prior": a.prior,
        "prior_name": a.prior_name,
        "leakage": leakage,
        "repeats": len(own),
        "undefended_leakage": undefended,
        "search": search.get("status", ""),
        "attacker_setting": json.dumps(a.attacker_setting, sort_keys=True) if a.attacker_setting is not None else "",
        "leakage_worst": sum(worst) / len(worst) if worst else math.nan,
        "undefended_leakage_worst": sum(undefended_worst) / len(undefended_worst) if undefended_worst else math.nan,
    }
    pair = (own, None if undefended_repeats is None else [float(v) for v in undefended_repeats])
    return row, pair, (worst, undefended_worst or None)


def _utility_and_pu(table: pd.DataFrame) -> None:
    """Add ``utility_loss`` (against the undefended run of the same dataset, algorithm, setting and seed, in
    percentage points) and the privacy-utility score with its note (``pu_score``, ``pu_note``) to ``table``."""
    vanilla = (
        table[table["defense"] == NO_DEFENSE].groupby(["dataset", "algorithm", "setting", "seed"])["utility"].first()
    )
    keys = list(zip(table["dataset"], table["algorithm"], table["setting"], table["seed"], strict=True))
    table["utility_loss"] = [
        100.0 * (vanilla[k] - u) if k in vanilla.index else math.nan
        for k, u in zip(keys, table["utility"], strict=True)
    ]
    scored = [_row_pu(r) for r in table.to_dict("records")]
    table["pu_score"] = pd.array([score for score, _ in scored], dtype="Int64")
    table["pu_note"] = [note for _, note in scored]


#: The group statistics of :func:`collect` (the default attacker's), by the name of each column.
STAT_COLUMNS = {
    k: k
    for k in (
        "leakage_mean",
        "leakage_ci_low",
        "leakage_ci_high",
        "delta_leakage",
        "delta_ci_low",
        "delta_ci_high",
        "undefended_ci_low",
        "undefended_ci_high",
        "ci_basis",
        "delta_basis",
        "n_seeds",
        "change",
        "leaks_without_defense",
    )
}
#: The same statistics of the attacker the search selected (``evaluation.attacker_search``), by the default's name.
WORST_COLUMNS = {
    "leakage_mean": "leakage_worst_mean",
    "leakage_ci_low": "leakage_worst_ci_low",
    "leakage_ci_high": "leakage_worst_ci_high",
    "delta_leakage": "delta_worst",
    "delta_ci_low": "delta_worst_ci_low",
    "delta_ci_high": "delta_worst_ci_high",
    "undefended_ci_low": "undefended_worst_ci_low",
    "undefended_ci_high": "undefended_worst_ci_high",
    "ci_basis": "worst_ci_basis",
    "delta_basis": "worst_delta_basis",
    "n_seeds": "worst_n_seeds",
    "change": "change_worst",
    "leaks_without_defense": "leaks_worst_without_defense",
}


def _group_statistics(
    table: pd.DataFrame, repeats: list[tuple[list[float], list[float] | None]], names: dict[str, str] = STAT_COLUMNS
) -> None:
    """Add each row's group statistics (see :func:`collect`) to ``table``, in place, under ``names`` (the default
    attacker's :data:`STAT_COLUMNS`, or the searched attacker's :data:`WORST_COLUMNS`). ``repeats``: each row's
    leakage per repeat and its undefended leakage per repeat (``None`` when unknown); a group without any leakage
    (no search) gets empty cells."""
    empty: dict[str, Any] = {
        "ci_basis": "",
        "delta_basis": "",
        "n_seeds": 0,
        "change": "",
        "leaks_without_defense": None,
    }
    columns: dict[str, list[Any]] = {k: [empty.get(k, math.nan)] * len(table) for k in STAT_COLUMNS}
    attacked = table["attack"].notna()
    for _, group in table[attacked].groupby(GROUP, dropna=False):
        rows = list(group.index)
        confidence = float(group["confidence"].iloc[0])
        own: dict[int, list[float]] = {}
        undefended: dict[int, list[float]] = {}
        for i in rows:
            seed = int(table.at[i, "seed"])
            if repeats[i][0]:
                own.setdefault(seed, []).extend(repeats[i][0])
            if repeats[i][1] is not None:
                undefended.setdefault(seed, []).extend(repeats[i][1] or [])
        if not own:
            continue
        li = mean_interval(own, confidence)
        ui = mean_interval(undefended, confidence) if undefended else None
        baseline = group["defense"].iloc[0] == NO_DEFENSE  # its own undefended run: no difference to report
        di = difference_interval(own, undefended, confidence) if undefended and not baseline else None
        change = (
            "" if di is None else ("lower" if di.below(0.0) else "higher" if di.above(0.0) else "no measurable change")
        )
        values = {
            "leakage_mean": li.mean,
            "leakage_ci_low": li.low,
            "leakage_ci_high": li.high,
            "delta_leakage": math.nan if di is None else di.mean,
            "delta_ci_low": math.nan if di is None else di.low,
            "delta_ci_high": math.nan if di is None else di.high,
            "undefended_ci_low": math.nan if ui is None else ui.low,
            "undefended_ci_high": math.nan if ui is None else ui.high,
            "ci_basis": li.basis,
            "delta_basis": "" if di is None else di.basis,
            "n_seeds": li.seeds,
            "change": change,
            "leaks_without_defense": leaks(ui),
        }
        for i in rows:
            for key, value in values.items():
                columns[key][i] = value
    for key, column in columns.items():
        table[names[key]] = column


def _true(value: Any) -> bool:
    """Whether a table cell holds True (not False, None or NaN)."""
    return bool(pd.notna(value) and value)


def _interval_text(low: float, high: float, confidence: float) -> str:
    return (
        f"{round(100 * confidence)}% CI [{low:.2f}, {high:.2f}]"
        if not (math.isnan(low) or math.isnan(high))
        else "no interval (one seed and one repeat, or a deterministic attack on one seed)"
    )


def _undefended_note(row: dict[str, Any]) -> str:
    return (
        f"{row['attack']} does not leak measurably without a defense (undefended leakage "
        f"{row['undefended_leakage']:.2f} points, "
        f"{_interval_text(row['undefended_ci_low'], row['undefended_ci_high'], row['confidence'])}), so no "
        "defense can be credited for stopping it"
    )


def _row_pu(row: dict[str, Any]) -> tuple[int | None, str]:
    """Kang eq. 21 for one summary row, or ``None`` and why it is not given there."""
    if pd.isna(row.get("attack")):
        return None, ""
    reason = pu_scorable(row["attack_target"], row["attack_metric"])
    if reason is not None:
        return None, f"PU score {reason}"
    if not _true(row["leaks_without_defense"]):
        return None, "not scored: " + _undefended_note(row)
    if row["defense"] == NO_DEFENSE:
        return NO_PROTECTION_SCORE, "no defense: scored 0 by Kang's convention for 'No Protect' (Tables 10-14)"
    if math.isnan(row["utility_loss"]):
        return None, "not scored: no run without defense for this seed (sweep.baseline: false), so no utility loss"
    if row["change"] != "lower":
        return None, (
            "no measurable protection: ε_p − ε_p(undefended) = "
            f"{row['delta_leakage']:.2f} points, "
            f"{_interval_text(row['delta_ci_low'], row['delta_ci_high'], row['confidence'])}"
        )
    return pu_score(row["leakage"], row["utility_loss"]), ""


#: The verdicts of scores.csv, in the order its rows are ranked.
VERDICTS = ("protects", "no protection (baseline)", "no measurable protection", "not scored")


def scores_table(table: pd.DataFrame, score_table: ScoreTable = ScoreTable()) -> pd.DataFrame:
    """One row per (dataset, algorithm, setting, defense): Kang's optimal PU score (eq. 22) over the strengths
    at which the defense measurably lowers the worst label attack that leaks without a defense.

    At each strength the worst attack is the scored attack with the highest mean leakage over seeds × repeats;
    the strength *protects* when the interval of that attack's ε_p − ε_p(undefended) (paired by seed) lies
    below 0. ``s_pu`` is the best PU score over protecting strengths (means over seeds), with the leakage of
    each attack, C-DCS and the worst attack's leakage, difference and intervals at that strength. A defense
    with no protecting strength gets ``significant = false``, no ``s_pu`` and the verdict "no measurable
    protection", and is ranked below No Protect (whose ``s_pu`` is 0 by Kang's convention). Attacks left out
    (feature attacks; attacks that do not leak measurably without a defense) are named in ``note``.

    With the attacker search (``evaluation.attacker_search``) the attacker each attack's search selected counts as
    an attack of its own, ``"<attack> [searched]"`` (:func:`with_searched`), so the worst attack at a strength is
    the stronger of the default and the searched attacker, and the verdict is judged against it.
    """
    attacked = table.dropna(subset=["attack"]) if "attack" in table else table.iloc[0:0]
    attacked = with_searched(_with_statistics(attacked.reset_index(drop=True)))
    rows = []
    for (dataset, algorithm, setting, defense), group in attacked.groupby(
        ["dataset", "algorithm", "setting", "defense"], dropna=False
    ):
        per = _per_strength_and_attack(group)
        notes, scored = _scored_attacks(per)
        row: dict[str, Any] = {
            "dataset": dataset,
            "algorithm": algorithm,
            "setting": setting,
            "defense": defense,
            "verdict": "not scored",
            "significant": None,
            "best_strength": None,
            "utility_loss": None,
            "s_pu": None,
            "c_dcs": None,
        }
        usable = per[per["attack"].isin(scored)]
        if usable.empty:
            notes.append("s_pu and c_dcs not defined: no label attack that leaks measurably without a defense")
            if per["strength"].nunique(dropna=False) == 1:
                row.update({f"eps_p.{k}": round(v, 2) for k, v in zip(per["attack"], per["leakage"], strict=True)})
        elif usable["utility_loss"].isna().any():
            notes.append("s_pu and c_dcs not defined: no run without defense (sweep.baseline: false)")
        else:
            row.update(_optimal(usable, per, defense, score_table, notes))
        row["note"] = "; ".join(notes)
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    return _ranked(out, table)


def _per_strength_and_attack(group: pd.DataFrame) -> pd.DataFrame:
    """One row per (strength, attack) of a defense's rows in :func:`scores_table`: the group statistics of the
    leakage (the first of the group's rows), the mean utility and utility loss, the attack's target and metric."""
    return (
        group.groupby(["strength", "attack"], dropna=False)
        .agg(
            leakage=("leakage_mean", "first"),
            utility_loss=("utility_loss", "mean"),
            utility=("utility", "mean"),
            target=("attack_target", "first"),
            metric=("attack_metric", "first"),
            low=("leakage_ci_low", "first"),
            high=("leakage_ci_high", "first"),
            delta=("delta_leakage", "first"),
            delta_low=("delta_ci_low", "first"),
            delta_high=("delta_ci_high", "first"),
            change=("change", "first"),
            leaks=("leaks_without_defense", "first"),
            confidence=("confidence", "first"),
        )
        .reset_index()
    )


def _scored_attacks(per: pd.DataFrame) -> tuple[list[str], list[Any]]:
    """The notes naming each attack of ``per`` that :func:`scores_table` leaves out of ``s_pu`` and ``c_dcs`` (and
    why: a feature attack, or no measurable leakage without a defense), and the attacks it scores."""
    notes, scored = [], []
    for attack, rows_of in per.groupby("attack"):
        first = rows_of.iloc[0]
        reason = pu_scorable(first["target"], first["metric"])
        if reason is not None:
            notes.append(f"{attack}: left out of s_pu and c_dcs, {reason}")
        elif not _true(first["leaks"]):
            notes.append(
                f"{attack}: left out of s_pu and c_dcs, it does not leak measurably without a "
                "defense (the interval of its undefended leakage reaches 0, or there is none)"
            )
        else:
            scored.append(attack)
    return notes, scored


def _ranked(out: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The rows of :func:`scores_table` with the detectors' column (where the sweep has detectors), ranked by verdict,
    then by ``s_pu``, then by utility loss."""
    detectors = detection.scores_column(table)
    if detectors:
        out["detectors"] = [
            detectors.get(key, "")
            for key in zip(out["dataset"], out["algorithm"], out["setting"], out["defense"], strict=True)
        ]
    order = out["verdict"].map(VERDICTS.index)
    return (
        out.assign(
            _order=order, _score=-out["s_pu"].astype(float).fillna(-1.0), _loss=out["utility_loss"].astype(float)
        )
        .sort_values(["_order", "_score", "_loss"], kind="stable")
        .drop(columns=["_order", "_score", "_loss"])
        .reset_index(drop=True)
    )


#: How scores.csv names the attacker an attack's search selected.
SEARCHED = " [searched]"


def with_searched(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` and, for every row whose searched attacker has group statistics (:data:`WORST_COLUMNS`), a row of
    that attacker as an attack of its own (``"<attack> [searched]"``, with the searched attacker's leakages in the
    default's columns)."""
    if "leakage_worst_mean" not in table:
        return table
    searched = table[table["leakage_worst_mean"].notna()].copy()
    if searched.empty:
        return table
    for default, worst in WORST_COLUMNS.items():
        searched[default] = searched[worst]
    searched["leakage"] = searched["leakage_worst"]
    searched["undefended_leakage"] = searched["undefended_leakage_worst"]
    searched["attack"] = searched["attack"] + SEARCHED
    return pd.concat([table, searched], ignore_index=True)


def _worst_entry(worst: pd.Series) -> dict[str, Any]:
    """scores.csv's columns on the worst attack at a strength: its leakage and ε_p − ε_p(undefended), with intervals."""
    return {
        "worst_attack": worst["attack"],
        "worst_leakage": round(float(worst["leakage"]), 2),
        "worst_ci_low": round(float(worst["low"]), 2),
        "worst_ci_high": round(float(worst["high"]), 2),
        "delta_leakage": round(float(worst["delta"]), 2),
        "delta_ci_low": round(float(worst["delta_low"]), 2),
        "delta_ci_high": round(float(worst["delta_high"]), 2),
    }


def _with_statistics(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with the group statistics of :func:`collect`; a table without them (a summary written before
    intervals, or one built by hand) gets them from its rows, each row one repeat of its seed."""
    if "leakage_mean" in table:
        return table
    table = table.copy()
    for column, default in (("setting", ""), ("confidence", 0.95)):
        if column not in table:
            table[column] = default
    undefended = table["undefended_leakage"] if "undefended_leakage" in table else pd.Series(math.nan, table.index)
    _group_statistics(
        table,
        [([float(v)], None if pd.isna(u) else [float(u)]) for v, u in zip(table["leakage"], undefended, strict=True)],
    )
    return table


def _at(frame: pd.DataFrame, strength: float | None) -> pd.DataFrame:
    return frame[(frame["strength"] == strength) | (frame["strength"].isna() & (strength is None))]


def _optimal(
    usable: pd.DataFrame, per: pd.DataFrame, defense: str, score_table: ScoreTable, notes: list[str]
) -> dict[str, Any]:
    """The scores.csv entries of one defense with label attacks to score (see :func:`scores_table`)."""
    points, protecting = [], []
    for strength, at in usable.groupby("strength", dropna=False):
        value = None if pd.isna(strength) else float(strength)
        worst = at.loc[at["leakage"].idxmax()]
        points.append((value, float(at["utility_loss"].iloc[0]), dict(zip(at["attack"], at["leakage"], strict=True))))
        if worst["change"] == "lower":
            protecting.append(points[-1])
    baseline = defense == NO_DEFENSE
    if not baseline and not protecting:
        # what it did at its strongest (the lowest worst-attack leakage), shown with the interval that says why
        # that is not measurable protection; no strength is credited
        strength = min(points, key=lambda p: max(p[2].values()))[0]
        at = _at(usable, strength)
        worst = at.loc[at["leakage"].idxmax()]
        where = "it has no strength knob" if strength is None else f"at strength {strength:g}"
        notes.append(
            "no measurable protection: at no strength is the worst attack's leakage measurably below its "
            f"undefended leakage ({where}, {worst['attack']}: ε_p − ε_p(undefended) = "
            f"{worst['delta']:.2f} points, "
            f"{_interval_text(worst['delta_low'], worst['delta_high'], worst['confidence'])})"
        )
        return {
            "verdict": "no measurable protection",
            "significant": False,
            **_worst_entry(worst),
            **{
                f"eps_p.{k}": round(v, 2)
                for k, v in zip(_at(per, strength)["attack"], _at(per, strength)["leakage"], strict=True)
            },
        }
    best = optimal_pu_score(points if baseline else protecting, score_table, no_protection=baseline)
    if baseline:
        notes.append("s_pu 0 by Kang's convention for 'No Protect' (Tables 10-14)")
    at = _at(usable, best.strength)
    worst = at.loc[at["leakage"].idxmax()]
    vanilla_utility = at["utility"].iloc[0] + at["utility_loss"].iloc[0] / 100.0
    by_type: dict[str, list[float]] = {}
    for _, r in at.iterrows():
        by_type.setdefault(ATTACK_TYPES.get(r["target"], str(r["target"])), []).append(
            dcs(r["utility"], r["leakage"] / 100.0, main_ideal=vanilla_utility, attack_ideal=0.0)
        )
    entry: dict[str, Any] = {
        "verdict": "no protection (baseline)" if baseline else "protects",
        "significant": None if baseline else True,
        "best_strength": best.strength,
        "utility_loss": round(best.utility_loss, 2),
        "s_pu": best.score,
        "c_dcs": round(comprehensive_dcs({k: type_dcs(v) for k, v in by_type.items()}), 4),
        **_worst_entry(worst),
    }
    if baseline:
        entry = {k: v for k, v in entry.items() if not k.startswith("delta")}
    at_all = _at(per, best.strength)
    entry.update({f"eps_p.{k}": round(v, 2) for k, v in zip(at_all["attack"], at_all["leakage"], strict=True)})
    return entry


def _coverage_row(defense: str, adaptive: str, kind: str, evaluated: bool) -> dict[str, Any]:
    note = (
        ""
        if evaluated
        else (
            f"{defense} was not evaluated against its adaptive {kind} {adaptive}; "
            "its scores hold only against the attacks that were run"
        )
    )
    if note:
        log.warning("note: %s", note)
    return {"defense": defense, "adaptive": adaptive, "kind": kind, "evaluated": evaluated, "note": note}


def adaptive_coverage(stacks: Sequence[tuple[list[dict[str, Any]], set[str]]]) -> pd.DataFrame:
    """For each defense of the sweep, the adaptive attacks (and adaptive settings) that exist for it
    (``Defense.adaptive_attacks``, ``Defense.adaptive_settings``) and whether some run evaluated the
    defense against them; each one not evaluated is logged as a note. ``stacks``: each run's defense
    entries and the names of the attacks it ran."""
    from vflbench.attacks import ATTACKS
    from vflbench.defenses import defense_class

    rows = []
    names = sorted({d["name"] for defenses, _ in stacks for d in defenses})
    for name in names:
        cls = defense_class(name)
        runs = [(defenses, attacks) for defenses, attacks in stacks if any(d["name"] == name for d in defenses)]
        for attack in cls.adaptive_attacks:
            evaluated = any(attack in attacks for _, attacks in runs)
            registered = "" if attack in ATTACKS else " (not registered in this build)"
            rows.append(_coverage_row(name, attack + registered, "attack", evaluated))
        for param, value in getattr(cls, "adaptive_settings", ()):
            evaluated = any(
                d.get("params", {}).get(param) == value for defenses, _ in runs for d in defenses if d["name"] == name
            )
            rows.append(_coverage_row(name, f"{param}: {json.dumps(value)}", "setting", evaluated))
    return pd.DataFrame(rows, columns=["defense", "adaptive", "kind", "evaluated", "note"])
