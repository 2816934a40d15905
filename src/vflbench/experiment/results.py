"""Typed results and their atomic writing: what result.json, metrics.jsonl and a sweep's summary hold."""

from __future__ import annotations

import io
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vflbench.experiment.config import RESULTS_VERSION

if TYPE_CHECKING:  # types only: `vflbench init` imports this module, which must not import torch
    from torch import Tensor

    from vflbench.data import VerticalData
    from vflbench.experiment.config import ExperimentConfig
    from vflbench.protocol import Federation, History


@dataclass
class TrainedRun:
    """A trained federation with its data and history (what attacks run on).

    ``data``: the experimenter's ground truth the scorer reads (in a party's own process, the whole dataset kept
    apart from the party's objects); ``federation``: the parties this process holds."""

    config: ExperimentConfig
    data: VerticalData
    federation: Federation
    history: History
    train_seconds: float
    held_out: Tensor | None = None  #: training rows no party trained on (the auxiliary pool)


@dataclass
class UtilityResult:
    """Main-task performance of a trained model on the test split."""

    metric: str
    value: float
    per_epoch: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    diverged: bool = False  # the training loss became non-finite and training stopped early


@dataclass
class AttackResult:
    """One attack's outcome: its metric, value, the prior it is compared to, and eps_p.

    ``direction``: ``"higher"`` when a higher ``value`` means more leakage (AUC, accuracy),
    ``"lower"`` when a lower one does (MSE). ``leakage``: eps_p in points on one scale where
    higher always means more leakage (:func:`vflbench.metrics.scores.leakage_points`).
    ``values``/``priors``/``leakages``: each repeat's (``evaluation.repeats`` runs of the attack on the
    trained model; ``value``, ``prior`` and ``leakage`` are their means); ``leakage_ci``: the confidence
    interval of the leakage over them (``None`` without one; ``ci_basis`` says what it is over).
    ``undefended_leakage``/``undefended_leakages``: the same attack's leakage (mean, per repeat) on the
    same config without defenses (its own when the run has none; ``None`` when unknown);
    ``leaks_without_defense``: whether the interval of that leakage lies above 0 points, i.e. whether a
    defense can be credited for stopping it (``None``: no interval, unknown).
    ``details["selection"]``: how the reported epoch of a trained attack was picked (``last``,
    ``validation`` or ``test_oracle``).

    With ``evaluation.attacker_search`` (:mod:`vflbench.experiment.search`), an attack with a search grid also
    reports the attacker its own validation rows selected: ``attacker_setting`` (the chosen values of the grid's
    parameters), ``value_worst``/``prior_worst``/``leakage_worst`` (means over the repeats of that attacker, its
    prior run with the same setting), ``leakages_worst`` (per repeat) and ``leakage_worst_ci``; and the same
    attacker's leakage without defenses (``undefended_leakage_worst``/``undefended_leakages_worst``).
    ``details["search"]`` records every setting tried with its validation score. All are ``None`` without a
    search, and for attacks that can only be run as configured ("default attacker only").
    """

    name: str
    target: str
    metric: str
    direction: str
    value: float
    prior: float
    prior_name: str
    leakage: float
    per_epoch: list[float] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    undefended_leakage: float | None = None
    leaks_without_defense: bool | None = None
    values: list[float] = field(default_factory=list)
    priors: list[float] = field(default_factory=list)
    leakages: list[float] = field(default_factory=list)
    leakage_ci: list[float] | None = None
    ci_basis: str = "none"
    undefended_leakages: list[float] | None = None
    undefended_ci: list[float] | None = None
    attacker_setting: dict[str, Any] | None = None
    value_worst: float | None = None
    prior_worst: float | None = None
    leakage_worst: float | None = None
    leakages_worst: list[float] | None = None
    leakage_worst_ci: list[float] | None = None
    undefended_leakage_worst: float | None = None
    undefended_leakages_worst: list[float] | None = None


@dataclass
class Timing:
    """Wall-clock seconds."""

    train_seconds: float
    epoch_seconds: list[float]
    attack_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class RunResult:
    """Everything ``result.json`` records for one run.

    ``grants``: the evaluation-only queries between parties that the run's plan granted for scoring its attacks
    (:class:`~vflbench.protocol.grants.Grant` records, with who refused one); left out of ``result.json`` when
    there are none."""

    config_hash: str
    seed: int
    data: dict[str, Any]
    utility: UtilityResult
    defense: list[dict[str, Any]]
    attacks: list[AttackResult]
    timing: Timing
    comm: dict[str, int]
    baselines: dict[str, Any] = field(default_factory=dict)
    grants: list[dict[str, Any]] = field(default_factory=list)
    device: str = "cpu"
    """The device the run computed on (``train.device`` resolved: ``cpu``, ``cuda:0``...); runs written before
    devices existed ran on the CPU."""
    schema_version: int = RESULTS_VERSION
    """The rules the run's results were computed under (:data:`~vflbench.experiment.config.RESULTS_VERSION`);
    1 for results written before the field existed."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = asdict(self)
        if not out["grants"]:
            del out["grants"]
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunResult:
        """The result a ``result.json`` records (as written by :meth:`to_dict`)."""
        # here, not with the module: the scores import scipy (0.7 s), and `vflbench init` imports this module
        from vflbench.metrics.scores import attack_leakage, direction_of

        attacks = []
        for a in raw["attacks"]:
            a = dict(a)
            if "direction" not in a:  # written before every attack carried its direction: rescore
                a["leakage"] = attack_leakage(a)
                a["direction"] = direction_of(a["metric"])
            attacks.append(AttackResult(**a))
        return cls(
            **{
                **raw,
                "utility": UtilityResult(**raw["utility"]),
                "attacks": attacks,
                "timing": Timing(**raw["timing"]),
                "schema_version": raw.get("schema_version", 1),
            }
        )

    @property
    def utility_loss(self) -> float | None:
        """eps_u in points: 100 x (vanilla utility - this run's), higher is a larger loss; ``None``
        without a ``vanilla`` baseline (``baselines: [vanilla]`` in the config)."""
        vanilla = self.baselines.get("vanilla")
        if not vanilla or "value" not in vanilla:
            return None
        return 100.0 * (float(vanilla["value"]) - self.utility.value)

    def attack(self, name: str) -> AttackResult:
        """The result of attack ``name`` (the first, when it was configured more than once)."""
        for a in self.attacks:
            if a.name == name:
                return a
        raise KeyError(f"no attack {name!r} in this run; it has: {', '.join(a.name for a in self.attacks) or 'none'}")


def read_result(path: Path) -> RunResult:
    """The typed result of a ``result.json`` file (the one reader of result files: sweeps, reports, the tuner and
    :func:`vflbench.load_result` all go through it)."""
    return RunResult.from_dict(json.loads(path.read_text()))


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one.

    The file gets the mode a plain ``open`` would give it (0666 less the user's umask), not the
    0600 of the temporary file it is written through.
    """
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory, renamed over ``path`` once
    it is whole and on disk. Whatever stops the write (a full disk: ``OSError``; an interruption) removes the
    temporary file and leaves ``path`` as it was, then propagates."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            if hasattr(os, "fchmod"):
                os.fchmod(fd, 0o666 & ~_umask())
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # os.write's error names no file
        raise


def save_torch_atomic(path: Path, obj: Any) -> None:
    """``torch.save(obj)`` to ``path`` atomically (:func:`write_bytes_atomic`): serialised in memory first, so a
    failed write is an ``OSError`` naming the file, not a serialiser's error, and leaves no partial file."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_bytes_atomic(path, buffer.getvalue())


def _umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json(path: Path, payload: Any) -> None:
    """Atomically write ``payload`` as indented JSON."""
    write_atomic(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")
