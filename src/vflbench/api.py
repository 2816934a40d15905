"""The public Python API: build a config, run an experiment or a sweep, load results.

Everything here is re-exported by ``vflbench`` itself::

    import vflbench as vb

    cfg = vb.make_config({"data": {"name": "breast_cancer", "parties": 2},
                     "train": {"epochs": 5, "metric": "auc"},
                     "defenses": [{"name": "marvell", "strength": 0.5}],
                     "attacks": [{"name": "norm_scoring"}],
                     "baselines": ["vanilla"]})
    result = vb.run(cfg, out="runs/api")
    print(result.utility.value, result.utility_loss, result.attack("norm_scoring").leakage)

The functions take the same configs as the command line (a mapping, a YAML file, or an
:class:`~vflbench.experiment.config.ExperimentConfig`) and return the typed results ``result.json`` records.
Errors in a config raise :class:`~vflbench.errors.ConfigError` (or another
:class:`~vflbench.errors.VFLBenchError`) with the message the command line prints.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from vflbench.errors import ConfigError
from vflbench.experiment.config import ExperimentConfig, build_config, load_config
from vflbench.experiment.results import RunResult, read_result
from vflbench.experiment.run import run_experiment
from vflbench.experiment.sweep import run_sweep

ConfigLike = ExperimentConfig | Mapping[str, Any] | str | Path


def make_config(source: ConfigLike, *, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """A validated experiment config from a mapping, a YAML file's path, or a config.

    ``overrides`` are ``KEY=VALUE`` strings as for ``--set`` (e.g. ``"train.epochs=3"``).
    """
    if isinstance(source, ExperimentConfig):
        return build_config(source.model_dump(mode="json"), list(overrides)) if overrides else source
    if isinstance(source, Mapping):
        return build_config(dict(source), list(overrides))
    if isinstance(source, (str, Path)):
        return load_config(source, list(overrides))
    raise ConfigError(f"a config is a mapping, a YAML file's path or an ExperimentConfig, not {type(source).__name__}")


def run(source: ConfigLike, *, out: str | Path | None = None, data_root: str | Path | None = None) -> RunResult:
    """Train, evaluate and attack one experiment; with ``out``, also write ``out/<hash>/``."""
    return run_experiment(make_config(source), out_dir=out, data_root=data_root)


def sweep(
    source: ConfigLike,
    *,
    out: str | Path,
    resume: bool = False,
    workers: int | None = None,
    data_root: str | Path | None = None,
) -> pd.DataFrame:
    """Run every point of the config's ``sweep`` section into ``out``; the tidy summary table.

    ``resume=True`` skips points whose results are already in ``out``.
    """
    cfg = make_config(source)
    if cfg.sweep is None:
        raise ConfigError("this config has no 'sweep' section; use vflbench.run for a single experiment")
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}")
    return run_sweep(cfg, out, resume=resume, data_root=None if data_root is None else str(data_root), workers=workers)


def load_result(path: str | Path) -> RunResult:
    """The :class:`RunResult` of a run directory (or of its ``result.json``)."""
    p = Path(path)
    file = p / "result.json" if p.is_dir() else p
    if not file.is_file():
        raise ConfigError(f"{file} does not exist; give a run directory (out/<hash>) or its result.json")
    try:
        return read_result(file)
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"{file} is not a vflbench result.json ({exc})") from None


def load_sweep(path: str | Path) -> pd.DataFrame:
    """The summary table (``summary.csv``) of a sweep directory."""
    file = Path(path) / "summary.csv"
    if not file.is_file():
        raise ConfigError(f"{file} does not exist; give the --out directory of a finished or interrupted sweep")
    return pd.read_csv(file)


__all__ = ["ConfigLike", "make_config", "load_result", "load_sweep", "run", "sweep"]
