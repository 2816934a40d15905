"""Coordinated epoch checkpoints of a run whose parties are separate processes (``--resume``).

After each epoch every party process writes its own state -- models, optimizer, LR schedule, its generator and the
process's global torch generator, and what the party itself needs to continue (the active party: the batch
order's generator, the history and the counters) -- to ``OUT/checkpoints/<party>/epoch-<k>.pt``, atomically. The
active party asks each passive party to commit (``passive.checkpoint``, answered with the epoch it wrote), writes its
own file, and then ``OUT/checkpoints/manifest.json``: the last epoch every party committed. ``--resume`` has every
party load its file of that epoch (the active party tells each passive party which one, ``passive.resume``).

Each party writes and reads only its own files (plain tensors and dicts, read back with ``weights_only=True``);
nothing a peer sent is ever loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from vflbench.errors import ConfigError
from vflbench.experiment.config import ExperimentConfig
from vflbench.experiment.results import save_torch_atomic, write_json

MANIFEST = "manifest.json"


def checkpoint_path(out_dir: Path, party: str, epoch: int) -> Path:
    """Where ``party`` keeps its state after ``epoch`` (0-based) in run directory ``out_dir``."""
    return out_dir / "checkpoints" / party / f"epoch-{epoch}.pt"


def manifest_path(out_dir: Path) -> Path:
    """The active party's record of the last epoch every party committed."""
    return out_dir / "checkpoints" / MANIFEST


def _unresumable_defenses(cfg: ExperimentConfig) -> list[str]:
    from vflbench.defenses import defense_class

    return [s.name for s in cfg.defenses if not defense_class(s.name).resumable]


def resumable(cfg: ExperimentConfig) -> bool:
    """Whether the checkpoints hold everything ``cfg``'s run needs to continue: no attacks, and only defenses whose
    halves keep a state dict (:attr:`~vflbench.protocol.hooks.Defense.resumable`: VMask and its variants)."""
    return not cfg.attacks and not _unresumable_defenses(cfg)


def check_resumable(cfg: ExperimentConfig) -> None:
    """Refuse what the checkpoints do not cover yet: the state of attacks and of defenses without a state dict."""
    if cfg.attacks:
        raise ConfigError(
            "--resume does not cover configs with attacks: the attacks' per-epoch collections (what "
            "they recorded, their snapshots) are not in the epoch checkpoints. Run it from the start "
            "without --resume"
        )
    if _unresumable_defenses(cfg):
        raise ConfigError(
            f"--resume covers VMask (and its variants) among the defenses; "
            f"{', '.join(_unresumable_defenses(cfg))} keeps state that the epoch checkpoints do not "
            "hold. Run it from the start without --resume"
        )


def committed_epoch(out_dir: Path) -> int:
    """The last epoch (0-based) every party committed, from the manifest; a :class:`ConfigError` when there is none."""
    path = manifest_path(out_dir)
    if not path.is_file():
        raise ConfigError(
            f"nothing to resume: no committed checkpoint in {path.parent} (a run writes one after each "
            "epoch every party finished); run without --resume to start from the beginning"
        )
    return int(json.loads(path.read_text())["epoch"])


def write_manifest(out_dir: Path, epoch: int, committed: dict[str, int]) -> None:
    """Record ``epoch`` as committed by every party (``committed``: what each party reported)."""
    write_json(manifest_path(out_dir), {"epoch": epoch, "parties": committed})


def party_state(party: Any) -> dict[str, Any]:
    """``party``'s own training state (its defense halves, models, optimizer, LR schedule, generator; the process's
    torch generator)."""
    return {
        "defenses": [d.state_dict() for d in party.defenses],
        "models": {role: m.state_dict() for role, m in party.models().items()},
        "optimizer": party.optimizer.state_dict() if party.optimizer is not None else None,
        "scheduler": party.scheduler.state_dict() if party.scheduler is not None else None,
        "generator": party.generator.get_state(),
        "torch_rng": torch.get_rng_state(),
    }


def load_party_state(party: Any, state: dict[str, Any]) -> None:
    """Put :func:`party_state`'s ``state`` back into ``party`` (and the process's torch generator): its defense
    halves first, which may change its models' structure (VMask's masked layers)."""
    if len(state["defenses"]) != len(party.defenses):
        raise ConfigError(
            f"checkpoint of {party.name} holds {len(state['defenses'])} defense halves, this run has "
            f"{len(party.defenses)}: it is another run's checkpoint"
        )
    for d, saved in zip(party.defenses, state["defenses"], strict=True):
        d.load_state_dict(saved)
    models = party.models()
    if set(models) != set(state["models"]):
        raise ConfigError(
            f"checkpoint of {party.name} holds models {sorted(state['models'])}, this run has "
            f"{sorted(models)}: it is another run's checkpoint"
        )
    for role, model in models.items():
        model.load_state_dict(state["models"][role])
    if party.optimizer is not None:
        party.optimizer.load_state_dict(state["optimizer"])
    if party.scheduler is not None:
        party.scheduler.load_state_dict(state["scheduler"])
    party.generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])


def save_checkpoint(out_dir: Path, party: str, epoch: int, state: dict[str, Any]) -> None:
    """Write ``state`` to :func:`checkpoint_path` atomically (readers see no file or the whole one)."""
    save_torch_atomic(checkpoint_path(out_dir, party, epoch), {"epoch": epoch, **state})


def load_checkpoint(out_dir: Path, party: str, epoch: int) -> dict[str, Any]:
    """This party's own state after ``epoch`` (read with ``weights_only=True``: tensors and plain values only), on the
    CPU whatever device wrote it (generator states must be CPU tensors; models and optimizers copy their state onto
    their own device when they load it)."""
    path = checkpoint_path(out_dir, party, epoch)
    if not path.is_file():
        raise ConfigError(
            f"{party} has no checkpoint of epoch {epoch} ({path} is missing); every party needs its "
            f"own OUT/checkpoints/{party}/ of the run to resume"
        )
    state = torch.load(path, weights_only=True, map_location="cpu")
    if state.get("epoch") != epoch:
        raise ConfigError(f"{path} holds epoch {state.get('epoch')}, not {epoch}")
    return dict(state)
