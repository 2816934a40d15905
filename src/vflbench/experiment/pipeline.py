"""One run of a config, the same steps whether its parties share a process or not: prepare, train over a
transport, score, result.

:func:`~vflbench.experiment.run.run_experiment` (every party in one process, an in-memory transport) and the
active party's process of a launched run (:mod:`vflbench.experiment.party`, the gRPC transport) build their
federation differently and then go through the same :class:`Pipeline`: :meth:`Pipeline.train` runs the one loop
with the attacks' epoch snapshots and the run directory's ``metrics.jsonl``, :meth:`Pipeline.score` runs the
attacks of this process, and :meth:`Pipeline.result` assembles ``result.json``
(:mod:`vflbench.experiment.assemble`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vflbench.data import VerticalData
from vflbench.experiment.assemble import (
    assemble_result,
    baselines_of,
    defense_entries,
    mark_honest_reference,
    mark_undefended,
    utility_of,
)
from vflbench.experiment.config import ExperimentConfig
from vflbench.experiment.plan import AttackPlan
from vflbench.experiment.results import AttackResult, RunResult, TrainedRun, UtilityResult, write_atomic, write_json
from vflbench.experiment.scoring import run_attacks
from vflbench.experiment.search import search_attacks
from vflbench.protocol import Federation, History, Progress
from vflbench.rng import generator

EpochEnd = Callable[[int, dict[str, Any]], None]


@dataclass
class RunDirectory:
    """What a run writes as it goes (``path``: the run directory; ``None``: nothing): ``config.yaml`` and
    ``env.json`` once the federation is built (its errors leave nothing behind), ``metrics.jsonl`` after every epoch
    (``lines``: those written before, when a run is resumed), ``result.json`` at the end."""

    path: Path | None
    cfg: ExperimentConfig
    environment: Callable[[], dict[str, Any]]
    lines: list[str] = field(default_factory=list)

    def open(self) -> None:
        """Write ``config.yaml`` and ``env.json`` unless they are there."""
        if self.path is not None and not (self.path / "config.yaml").is_file():
            self.path.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path / "config.yaml", self.cfg.to_yaml())
            write_json(self.path / "env.json", self.environment())

    def record(self, record: dict[str, Any]) -> None:
        """Add one epoch's record to ``metrics.jsonl``."""
        if self.path is None:
            return
        self.open()
        self.lines.append(json.dumps(record))
        write_atomic(self.path / "metrics.jsonl", "\n".join(self.lines) + "\n")

    def write(self, name: str, payload: Any) -> None:
        """Write ``payload`` as ``name`` (JSON, atomically) in the run directory."""
        if self.path is not None:
            write_json(self.path / name, payload)


@dataclass
class Pipeline:
    """The steps of one run of ``cfg`` on ``data`` (the experimenter's ground truth), with the ``attacks`` that run
    in this process (``plan``: the config's whole plan, whose positions and grants every process shares)."""

    cfg: ExperimentConfig
    data: VerticalData
    plan: AttackPlan
    directory: RunDirectory
    attacks: AttackPlan | None = None

    def __post_init__(self) -> None:
        if self.attacks is None:
            self.attacks = self.plan

    def train(
        self,
        fed: Federation,
        *,
        progress: Progress | None = None,
        on_epoch_end: EpochEnd | None = None,
        start_epoch: int = 0,
        history: History | None = None,
        batches: torch.Generator | None = None,
    ) -> TrainedRun:
        """Train ``fed`` (its attacks installed by :meth:`AttackPlan.prepare`, each epoch recorded); ``start_epoch``,
        ``history`` and ``batches`` continue a resumed run."""

        def epoch_end(epoch: int, record: dict[str, Any]) -> None:
            self.directory.record(record)
            if on_epoch_end is not None:
                on_epoch_end(epoch, record)

        t = self.cfg.train
        tic = time.perf_counter()
        history = fed.fit(
            epochs=t.epochs,
            batch_size=t.batch_size,
            generator=batches if batches is not None else generator(self.cfg.seed, "active", "batches"),
            y_test=self.data.y_test,
            eval_every=t.eval_every,
            progress=progress,
            on_epoch_end=epoch_end,
            start_epoch=start_epoch,
            history=history,
        )
        return TrainedRun(self.cfg, self.data, fed, history, time.perf_counter() - tic, self.plan.held_out())

    def score(self, run: TrainedRun) -> tuple[list[AttackResult], dict[str, float]]:
        """This process's attacks on ``run``, each with its attacker search (``evaluation.attacker_search``)."""
        assert self.attacks is not None
        found, seconds = run_attacks(self.attacks, run)
        seconds.update(search_attacks(self.attacks, run, found))
        return found, seconds

    def baselines(
        self,
        run: TrainedRun,
        *,
        undefended: dict[str, Any] | None,
        train: Callable[[bool], UtilityResult],
        second_federation: bool = True,
    ) -> dict[str, Any]:
        """The configured baselines of ``run`` (:func:`~vflbench.experiment.assemble.baselines_of`; ``train(alone)``
        trains one on the run's rows)."""
        malicious = any(p.attack.phase == "malicious" for p in self.plan.attacks)
        return baselines_of(
            self.cfg,
            utility_of(self.cfg, run.history),
            undefended=undefended,
            malicious=malicious,
            train=train,
            active_has_features=run.data.active is not None,
            second_federation=second_federation,
        )

    def result(
        self,
        run: TrainedRun,
        *,
        attacks: list[AttackResult],
        attack_seconds: dict[str, float],
        comm: dict[str, Any],
        baselines: dict[str, Any],
        undefended: dict[str, Any] | None,
        honest: dict[str, Any] | None = None,
        grants: list[dict[str, Any]] | None = None,
        reported: Mapping[str, Mapping[str, dict[str, Any]]] | None = None,
        honest_reference: bool = True,
    ) -> RunResult:
        """``result.json`` of ``run``: its utility, ``baselines``, ``attacks`` marked with the undefended run's
        leakage (``undefended``), the defenses (with the details ``reported`` by the parties in other processes, by
        party and defense) with the detectors' honest reference (``honest``; not with ``honest_reference=False``),
        the traffic ``comm`` and the plan's ``grants``."""
        cfg = self.cfg
        mark_undefended(
            attacks,
            None if undefended is None else undefended["attacks"],
            seed=cfg.seed,
            confidence=cfg.evaluation.confidence,
        )
        defense = defense_entries(run, reported or {})
        if honest_reference:
            malicious = [p.attack.name for p in self.plan.attacks if p.attack.phase == "malicious"]
            mark_honest_reference(defense, honest, config_hash=cfg.hash(), malicious=malicious)
        return assemble_result(
            run,
            utility=utility_of(cfg, run.history),
            defense=defense,
            attacks=attacks,
            attack_seconds=attack_seconds,
            comm=comm,
            baselines=baselines,
            grants=[g.as_dict() for g in self.plan.grants()] if grants is None else grants,
            held_out=self.plan.held_out(),
        )
