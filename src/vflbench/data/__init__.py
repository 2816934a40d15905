"""Datasets: registry, loaders, vertical partitioning, and threat-model samplers.

The package's names are imported on first use (PEP 562), with every loader registered then, so that
:mod:`vflbench.data.files` and :mod:`vflbench.data.verify` can be imported without torch (the
command line's ``datasets verify``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each public name and the module that defines it.
_NAMES = {
    "DATASETS": "vflbench.data.registry",
    "Dataset": "vflbench.data.base",
    "PartySlice": "vflbench.data.base",
    "VerticalData": "vflbench.data.base",
    "DatasetStatus": "vflbench.data.verify",
    "verify_datasets": "vflbench.data.verify",
    "resolve_root": "vflbench.data.files",
    "partition": "vflbench.data.partition",
    "subsample": "vflbench.data.partition",
    "aux_indices": "vflbench.data.sampling",
    "known_label_indices": "vflbench.data.sampling",
    "load_dataset": "vflbench.data.loading",
}
#: The modules that register the loaders: imported before any public name is handed out.
_LOADERS = ("vflbench.data.embedded", "vflbench.data.images", "vflbench.data.tabular", "vflbench.data.text")

if TYPE_CHECKING:
    from vflbench.data.base import Dataset, PartySlice, VerticalData
    from vflbench.data.files import resolve_root
    from vflbench.data.loading import load_dataset
    from vflbench.data.partition import partition, subsample
    from vflbench.data.registry import DATASETS
    from vflbench.data.sampling import aux_indices, known_label_indices
    from vflbench.data.verify import DatasetStatus, verify_datasets


def __getattr__(name: str) -> Any:
    """The package's public names, imported (and every loader registered) when first used."""
    if name not in _NAMES:
        raise AttributeError(f"module 'vflbench.data' has no attribute {name!r}")
    for loader in _LOADERS:
        importlib.import_module(loader)
    value = getattr(importlib.import_module(_NAMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_NAMES])


__all__ = [
    "DATASETS",
    "Dataset",
    "DatasetStatus",
    "PartySlice",
    "VerticalData",
    "aux_indices",
    "known_label_indices",
    "load_dataset",
    "partition",
    "resolve_root",
    "subsample",
    "verify_datasets",
]
