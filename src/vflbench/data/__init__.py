"""Datasets: registry, loaders, vertical partitioning, and threat-model samplers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vflbench.data import embedded, images, tabular, text  # noqa: F401  (register loaders)
from vflbench.data.base import Dataset, PartySlice, VerticalData
from vflbench.data.files import resolve_root
from vflbench.data.partition import partition, subsample
from vflbench.data.registry import DATASETS
from vflbench.data.sampling import aux_indices, known_label_indices
from vflbench.data.verify import DatasetStatus, verify_datasets
from vflbench.errors import DataError

__all__ = ["DATASETS", "Dataset", "DatasetStatus", "PartySlice", "VerticalData", "aux_indices",
           "known_label_indices", "load_dataset", "partition", "subsample", "verify_datasets"]


def load_dataset(name: str, *, root: str | Path | None = None, **options: Any) -> Dataset:
    """Load the registered dataset ``name``; ``options`` are its own keyword arguments."""
    DATASETS.check(name, options, reserved=("root",), noun="option", error=DataError)
    return DATASETS.get(name).factory(root=resolve_root(root), **options)
