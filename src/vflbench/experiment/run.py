"""Running one experiment: train, evaluate, baselines, attacks; write the run directory."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import sklearn
import torch

from vflbench._version import __version__
from vflbench.attacks.base import LabelAttack
from vflbench.attacks.registry import ATTACKS
from vflbench.data import VerticalData
from vflbench.devices import device_name, resolve_device
from vflbench.errors import ConfigError, DataError
from vflbench.experiment.assemble import is_detector, utility_of
from vflbench.experiment.config import ExperimentConfig, build_config, check_components
from vflbench.experiment.pipeline import Pipeline, RunDirectory
from vflbench.experiment.plan import AttackPlan, aux_ids, validate_attacks, wants_aux
from vflbench.experiment.results import (
    RunResult,
    TrainedRun,
    UtilityResult,
    save_torch_atomic,
    write_bytes_atomic,
)
from vflbench.experiment.scenario import build_federation, load_vertical_data, plan_defenses
from vflbench.experiment.search import check_search
from vflbench.protocol import Progress
from vflbench.protocol.messages import passive_names
from vflbench.rng import generator

log = logging.getLogger(__name__)
CLAIM_POLL_SECONDS = 0.2  #: how often a worker waiting for another worker's undefended run looks again


def check_before_training(cfg: ExperimentConfig, vd: VerticalData, plan: AttackPlan) -> None:
    """What the config asks of the data, checked before the run directory is made or training starts:
    the utility metric, and the labelled and auxiliary rows each attack's threat model grants."""
    if cfg.train.metric == "auc" and vd.num_classes != 2:
        raise ConfigError(
            f"train.metric 'auc' needs a binary task, but {cfg.data.name} has {vd.num_classes} "
            "classes; use train.metric: accuracy"
        )
    counts = torch.bincount(vd.y_train.long(), minlength=vd.num_classes)
    present = counts.nonzero().flatten().tolist()
    if len(present) < 2:
        which = f"only class {present[0]}" if present else "no class"
        raise DataError(
            f"the {len(vd.y_train)} training rows of {cfg.data.name} hold {which}; a classifier needs "
            "at least two classes (check the label column, or a data.train_size too small to hold two)"
        )
    if cfg.evaluation.attacker_search:
        check_search(plan)
    trained = torch.ones(len(vd.y_train), dtype=torch.bool)
    if plan.pool is not None:
        trained[plan.pool] = False
    counts = torch.bincount(vd.y_train.cpu()[trained].long(), minlength=vd.num_classes)
    smallest = int(counts.min())
    for planned in plan.attacks:
        attack = planned.attack
        if isinstance(attack, LabelAttack) and attack.known_per_class > smallest:
            raise ConfigError(
                f"attack {attack.name!r}: known_per_class {attack.known_per_class} is more than the "
                f"smallest class of the {int(trained.sum())} rows the parties train on has ({smallest} "
                f"rows, class {int(counts.argmin())}); use known_per_class <= {smallest}"
            )
        if wants_aux(attack):
            try:
                aux_ids(attack, vd.y_train, cfg.seed, plan.pool)
            except DataError as exc:
                raise ConfigError(f"attack {attack.name!r}: {exc}") from None


def train_run(
    cfg: ExperimentConfig,
    vd: VerticalData,
    *,
    with_defenses: bool = True,
    alone: bool = False,
    progress: Progress | None = None,
    attacks: AttackPlan | None = None,
    on_epoch_end: Callable[[int, dict[str, Any]], None] | None = None,
    held_out: torch.Tensor | None = None,
) -> TrainedRun:
    """Build and train one federation of ``cfg`` on ``vd`` (with the attackers installed).

    ``held_out``: training rows no party trains on; by default the attacks' auxiliary rows that
    their threat models keep disjoint from the training set (:meth:`AttackPlan.held_out`).
    """
    names = passive_names(0 if alone else len(vd.passive))
    plan = plan_defenses(cfg, names) if with_defenses else None
    if held_out is None and attacks is not None:
        held_out = attacks.held_out()
    fed = build_federation(
        cfg,
        vd,
        defenses=plan,
        alone=alone,
        keep=attacks.keep if attacks else None,
        extra_dims=attacks.extra_dims() if attacks else None,
        held_out=held_out,
    )
    if attacks is not None:
        attacks.prepare(fed)
    tic = time.perf_counter()
    history = fed.fit(
        epochs=cfg.train.epochs,
        batch_size=cfg.train.batch_size,
        generator=generator(cfg.seed, "active", "batches"),
        y_test=vd.y_test,
        eval_every=cfg.train.eval_every,
        progress=progress,
        on_epoch_end=on_epoch_end,
    )
    return TrainedRun(cfg, vd, fed, history, time.perf_counter() - tic, held_out)


def environment(threads: int, device: torch.device | None = None) -> dict[str, Any]:
    """Versions, git commit, thread count and the device the run computed on, for ``env.json``."""
    try:
        sha = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        sha = None
    return {
        "vflbench": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scikit_learn": sklearn.__version__,
        "platform": platform.platform(),
        "git_sha": sha,
        "threads": threads,
        "interop_threads": torch.get_num_interop_threads(),
        "device": device_name(device if device is not None else torch.device("cpu")),
        "cuda": torch.version.cuda,
    }


def cpu_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """``model``'s state dict with its tensors copied to the CPU: a checkpoint written on a GPU loads anywhere."""
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in model.state_dict().items()}


def save_checkpoints(run: TrainedRun, directory: Path, tag: str = "final") -> None:
    """Save every party's models (state dicts, on the CPU) under ``directory/checkpoints``."""
    for party in run.federation.parties():
        for role, model in party.models().items():
            save_torch_atomic(directory / "checkpoints" / f"{party.name}.{role}.{tag}.pt", cpu_state_dict(model))


def save_embeddings(run: TrainedRun, directory: Path, n: int) -> None:
    """Save the attacker's (first passive party's) embeddings of the first ``n`` test rows."""
    if not run.federation.passives:
        return
    party = run.federation.passives[0]
    ids = torch.arange(min(n, len(run.data.y_test)))
    with torch.no_grad():
        emb = party.forward(ids, epoch=-1, step=-1, split="test", train=False)
    buffer = io.BytesIO()
    np.savez(buffer, embedding=emb.cpu().numpy(), y=run.data.y_test[ids].cpu().numpy(), party=party.name)
    write_bytes_atomic(directory / "embeddings.npz", buffer.getvalue())


def run_experiment(
    cfg: ExperimentConfig,
    *,
    out_dir: str | Path | None = None,
    data_root: str | Path | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """Run ``cfg`` end to end on ``train.device``; if ``out_dir`` is given write ``out_dir/<hash>/``.

    ``train.threads`` sets torch's intra-op threads for the run, also with a GPU (the CPU still draws every
    random number, deals VMask's triples and runs Paillier)."""
    cfg = cfg.resolved()
    resolve_device(cfg.train.device)  # before anything else: a device this machine lacks is a one-line error
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.train.threads)
    try:
        return _run(cfg, out_dir=Path(out_dir) if out_dir else None, data_root=data_root, progress=progress)
    finally:
        torch.set_num_threads(previous_threads)


def undefended_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` without its defenses: the run whose attacks tell whether a defense has anything to stop."""
    return build_config({**cfg.model_dump(mode="json", exclude={"sweep"}), "defenses": []}).resolved()


def undefended_result(cfg: ExperimentConfig, *, out_dir: Path | None, data_root: str | Path | None) -> dict[str, Any]:
    """The result of ``cfg`` run without defenses (a run of its own, read from ``out_dir/<hash>/result.json``
    when that exists, so that a sweep's points and tune's trials share one undefended run per config)."""
    plain = undefended_config(cfg)
    if out_dir is None:
        return _run(plain, out_dir=None, data_root=data_root, progress=None).to_dict()
    path = out_dir / plain.hash() / "result.json"
    with claim_undefended(plain, out_dir) as mine:
        if not mine or path.is_file():
            log.info("undefended attacks: reusing run %s", plain.hash())
            return dict(json.loads(path.read_text()))
        log.info(
            "undefended attacks: running %s without defenses (run %s) to check that the attacks leak "
            "without protection",
            cfg.hash(),
            plain.hash(),
        )
        return _run(plain, out_dir=out_dir, data_root=data_root, progress=None).to_dict()


def honest_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` without its attacks (with its defenses, data, pool and seed): honest training of the same scenario, on
    which a detector's flags are false alarms. Attacks that only observe do not change training, and the rows held
    out are the pool's whatever the attacks (issue 24), so this is the training the run's attackers hijacked."""
    return build_config({**cfg.model_dump(mode="json", exclude={"sweep"}), "attacks": []}).resolved()


def needs_honest_reference(cfg: ExperimentConfig) -> bool:
    """Whether the run's detectors need an honest reference run: it has a detector and a malicious attack (without
    one the run is honest training itself)."""
    return any(is_detector(d.name) for d in cfg.defenses) and any(
        getattr(ATTACKS.get(a.name).factory, "phase", None) == "malicious" for a in cfg.attacks
    )


def honest_result(cfg: ExperimentConfig, *, out_dir: Path | None, data_root: str | Path | None) -> dict[str, Any]:
    """The result of :func:`honest_config` of ``cfg`` (a run of its own, read from ``out_dir/<hash>/result.json``
    when that exists, so that a sweep's points with the same detectors and scenario share one honest run)."""
    honest = honest_config(cfg)
    if out_dir is None:
        return _run(honest, out_dir=None, data_root=data_root, progress=None).to_dict()
    path = out_dir / honest.hash() / "result.json"
    with claim_reference(honest, out_dir) as mine:
        if not mine or path.is_file():
            log.info("detectors' honest reference: reusing run %s", honest.hash())
            return dict(json.loads(path.read_text()))
        log.info(
            "detectors' honest reference: running %s without its attacks (run %s) to measure the detectors' "
            "false alarms on honest training",
            cfg.hash(),
            honest.hash(),
        )
        return _run(honest, out_dir=out_dir, data_root=data_root, progress=None).to_dict()


def claim_reference(cfg: ExperimentConfig, out_dir: Path) -> contextlib.AbstractContextManager[bool]:
    """Claim the reference run of ``cfg`` (a detector's honest reference) in ``out_dir`` for this process
    (``True``), or wait until the process that claimed it has written its result (``False``), as
    :func:`claim_undefended` does for the undefended run."""
    return _claim(out_dir / f".{cfg.hash()}.reference", out_dir / cfg.hash() / "result.json")


def claim_undefended(cfg: ExperimentConfig, out_dir: Path) -> contextlib.AbstractContextManager[bool]:
    """Claim the run of ``cfg`` (a config without defenses) in ``out_dir`` for this process (``True``), or
    wait until the process that claimed it has written its result (``False``). Both a sweep's undefended
    point and its defended points (for their undefended reference, the same run) claim it, so that two
    workers never train it twice."""
    return _claim(out_dir / f".{cfg.hash()}.undefended", out_dir / cfg.hash() / "result.json")


@contextlib.contextmanager
def _claim(lock: Path, result: Path) -> Iterator[bool]:
    """Claim the run whose result is ``result`` for this process (``True``), or wait until the process
    that holds ``lock`` has written it (``False``): two sweep workers whose points share an undefended run
    train it once. A lock whose process is gone (killed) is taken over."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if result.is_file():
                yield False
                return
            if not _holder_alive(lock):
                lock.unlink(missing_ok=True)
                continue
            time.sleep(CLAIM_POLL_SECONDS)
            continue
        with os.fdopen(fd, "w") as handle:
            handle.write(str(os.getpid()))
        try:
            yield True
        finally:
            lock.unlink(missing_ok=True)
        return


def _holder_alive(lock: Path) -> bool:
    """Whether the process named in ``lock`` still runs (a lock being written counts as alive)."""
    try:
        pid = int(lock.read_text() or "0")
    except (OSError, ValueError):
        return True
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run(
    cfg: ExperimentConfig, *, out_dir: Path | None, data_root: str | Path | None, progress: Progress | None
) -> RunResult:
    check_components(cfg)
    vd = load_vertical_data(cfg, data_root)
    attack_plan = validate_attacks(cfg, vd)
    check_before_training(cfg, vd, attack_plan)
    honest = honest_result(cfg, out_dir=out_dir, data_root=data_root) if needs_honest_reference(cfg) else None

    def undefended() -> dict[str, Any] | None:
        """The undefended run's result, asked for once this run has trained: a sweep's defended point trains while
        another worker trains its reference, instead of waiting for it first."""
        return undefended_result(cfg, out_dir=out_dir, data_root=data_root) if cfg.defenses and cfg.attacks else None

    run_dir = out_dir / cfg.hash() if out_dir else None
    fresh = run_dir is not None and not run_dir.exists()
    try:
        return _train_and_record(cfg, vd, attack_plan, undefended, run_dir=run_dir, progress=progress, honest=honest)
    except OSError as exc:  # a full disk, a quota, a directory removed under us
        raise unfinished_run_error(exc, run_dir, fresh=fresh) from None


def unfinished_run_error(exc: OSError, run_dir: Path | None, *, fresh: bool) -> OSError:
    """The error to raise when writing the run directory ``run_dir`` failed with ``exc``: a run directory this
    run made (``fresh``) is removed, since a run directory without ``result.json`` is never a result (and a
    sweep's ``--resume`` runs it again); one that existed before is left as it was and said so."""
    what = f"{exc.strerror or exc}" + (f" while writing {exc.filename}" if exc.filename else "")
    if run_dir is None:
        return OSError(exc.errno, what)
    if fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
        kept = f"the unfinished run directory {run_dir} was removed"
    else:
        kept = (
            f"{run_dir} existed before this run and was left in place; it has no new result.json, and files "
            "this run rewrote before the failure may be newer than its result.json"
        )
    hint = "; free some space and run again" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    log.debug("writing the run directory failed", exc_info=exc)
    return OSError(exc.errno, f"{what}; {kept}{hint}")


def _train_and_record(
    cfg: ExperimentConfig,
    vd: VerticalData,
    attack_plan: AttackPlan,
    undefended_result: Callable[[], dict[str, Any] | None],
    *,
    run_dir: Path | None,
    progress: Progress | None,
    honest: dict[str, Any] | None = None,
) -> RunResult:
    """Train ``cfg``, run its baselines and attacks, and write its run directory ``run_dir`` (if any);
    ``undefended_result()`` gives the undefended run's result (``None`` without defenses or attacks), asked for
    once the training is done; ``honest``: the result of its detectors' honest reference run
    (:func:`honest_config`), ``None`` when the run is one."""
    directory = RunDirectory(run_dir, cfg, lambda: environment(cfg.train.threads, vd.device))
    pipeline = Pipeline(cfg, vd, attack_plan, directory)
    run = train_run(cfg, vd, progress=progress, attacks=attack_plan, on_epoch_end=lambda _, r: directory.record(r))
    directory.open()
    if run_dir is not None and cfg.train.checkpoint != "none":
        save_checkpoints(run, run_dir)
    if run_dir is not None and cfg.train.save_embeddings:
        save_embeddings(run, run_dir, cfg.train.save_embeddings)
    undefended = undefended_result()
    held_out = attack_plan.held_out()  # the baselines train on the same rows as the run

    def baseline(alone: bool) -> UtilityResult:
        return utility_of(cfg, train_run(cfg, vd, with_defenses=False, alone=alone, held_out=held_out).history)

    baselines = pipeline.baselines(run, undefended=undefended, train=baseline)
    attack_results, attack_seconds = pipeline.score(run)
    result = pipeline.result(
        run,
        attacks=attack_results,
        attack_seconds=attack_seconds,
        comm=run.federation.traffic().as_dict(),
        baselines=baselines,
        undefended=undefended,
        honest=honest,
    )
    directory.write("result.json", result.to_dict())
    return result
