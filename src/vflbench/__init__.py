"""vflbench: train, attack, defend and evaluate vertical federated learning.

The public Python API (:mod:`vflbench.api`) is available from the package itself and imported on
first use, so that ``import vflbench`` stays cheap for the command line and sweep workers::

    import vflbench as vb

    result = vb.run({"data": {"name": "digits", "parties": 2}, "attacks": [{"name": "sdar"}]})
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vflbench._version import __version__

#: Each public name and the module that defines it.
_API = {
    "make_config": "vflbench.api",
    "run": "vflbench.api",
    "sweep": "vflbench.api",
    "load_result": "vflbench.api",
    "load_sweep": "vflbench.api",
    "ExperimentConfig": "vflbench.experiment.config",
    "RunResult": "vflbench.experiment.results",
    "AttackResult": "vflbench.experiment.results",
    "UtilityResult": "vflbench.experiment.results",
    "VFLBenchError": "vflbench.errors",
    "ConfigError": "vflbench.errors",
}

if TYPE_CHECKING:
    from vflbench.api import load_result, load_sweep, make_config, run, sweep
    from vflbench.errors import ConfigError, VFLBenchError
    from vflbench.experiment.config import ExperimentConfig
    from vflbench.experiment.results import AttackResult, RunResult, UtilityResult


def __getattr__(name: str) -> Any:
    """The public API's names, imported when first used (PEP 562)."""
    if name not in _API:
        raise AttributeError(f"module 'vflbench' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


__all__ = [
    "AttackResult",
    "ConfigError",
    "ExperimentConfig",
    "RunResult",
    "UtilityResult",
    "VFLBenchError",
    "__version__",
    "load_result",
    "load_sweep",
    "make_config",
    "run",
    "sweep",
]
