"""``--dataset`` and ``--set`` for the reproduction scripts: their experiments on another dataset, or with
other settings, without writing a driver.

``--dataset NAME`` runs every config the script runs on the registered dataset ``NAME`` (``vflbench list
datasets``; a CSV file is ``--dataset csv --set data.options.path=FILE --set data.options.label=COLUMN``):
``data.name`` becomes ``NAME``, the config's dataset-specific ``data.options`` and ``data.columns`` are
dropped and ``data.split`` is ``auto``. ``--set KEY=VALUE`` (repeatable) then overrides every config as
``vflbench run --set`` does, e.g. ``--set data.standardise=true`` or ``--set model.bottom=mlp2``. The rest
of each config (parties, models, attack, defenses, epochs, subsample sizes) is kept, so a model built for
the original data's shape may need ``--set model...`` too; the first config is checked before anything
runs and a mismatch is one line. A script's own per-run settings (a study's epochs, a sweep's weight) are
applied after these.

A swapped run is recorded apart from the reproduction's own: scripts that cache by config hash get a new
hash (and their tables label the row); scripts that cache by name write into ``OUT/swap@<hash of the
overrides>/`` (:func:`tag`), or ``SWEEPS/<setting>@<hash>`` for sweeps, so a swap never overwrites the
reference numbers. The paper's numbers in a swapped table are still the paper's (for its dataset).
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Sequence
from pathlib import Path

from vflbench.errors import VFLBenchError
from vflbench.experiment.config import ExperimentConfig, build_config, check_components, load_config


def add_arguments(parser: argparse.ArgumentParser, *, dataset_flag: str = "--dataset") -> None:
    """Add ``--dataset`` (or ``dataset_flag``) and ``--set`` to ``parser`` (read back with :func:`overrides`)."""
    parser.add_argument(
        dataset_flag,
        dest="swap_dataset",
        metavar="NAME",
        default=None,
        help="run every config on this registered dataset instead (data.name=NAME; the config's "
        "data.options and data.columns are dropped and data.split is auto: give NAME's own "
        "with --set data.options.KEY=V)",
    )
    parser.add_argument(
        "--set",
        dest="swap_set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override every config, as `vflbench run --set` (repeatable; after --dataset)",
    )


def overrides(args: argparse.Namespace) -> list[str]:
    """The ``--set``-style overrides that ``--dataset`` and ``--set`` stand for (empty: the reproduction as it is)."""
    swap = []
    if getattr(args, "swap_dataset", None):
        swap += [f"data.name={args.swap_dataset}", "data.options={}", "data.columns=null", "data.split=auto"]
    return swap + list(getattr(args, "swap_set", None) or [])


def setting_and_overrides(args: argparse.Namespace, settings: Sequence[str], default: str) -> tuple[str, list[str]]:
    """For a script whose ``--dataset`` named one of its own ``settings`` before ``--setting`` existed: such a
    ``--dataset`` still selects that setting; any other names a registered dataset swapped into the setting's
    configs (:func:`overrides`). Returns the setting and the overrides."""
    chosen = getattr(args, "setting", None)
    if args.swap_dataset in settings:
        if chosen is not None and chosen != args.swap_dataset:
            raise SystemExit(f"error: --dataset {args.swap_dataset} names a setting, and --setting {chosen} another")
        return args.swap_dataset, list(args.swap_set or [])
    return chosen or default, overrides(args)


def tag(swap: Sequence[str]) -> str:
    """A suffix for names under which a swapped run is cached: ``""`` without a swap, else ``@`` and a short
    hash of the overrides."""
    return "@" + hashlib.sha256("\n".join(swap).encode()).hexdigest()[:8] if swap else ""


def label(swap: Sequence[str]) -> str:
    """How a table names the swap (``""`` without one)."""
    return f" [{' '.join(swap)}]" if swap else ""


def check(path: Path, swap: Sequence[str]) -> ExperimentConfig:
    """``path`` with ``swap`` applied, or exit with the one-line error that says what is wrong."""
    try:
        return load_config(path, list(swap))
    except VFLBenchError as exc:
        raise SystemExit(f"error: {path.name} with {' '.join(swap)}: {exc}") from None


def apply(cfg: ExperimentConfig, swap: Sequence[str]) -> ExperimentConfig:
    """``cfg`` with ``swap`` applied (for scripts that build their configs in code)."""
    if not swap:
        return cfg
    try:
        swapped = build_config(cfg.model_dump(mode="json"), list(swap))
        check_components(swapped)
        return swapped
    except VFLBenchError as exc:
        raise SystemExit(f"error: {' '.join(swap)}: {exc}") from None
