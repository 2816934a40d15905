"""Loading a registered dataset by name, with its options checked first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vflbench.data import embedded, images, tabular, text  # noqa: F401  (register loaders)
from vflbench.data.base import Dataset
from vflbench.data.files import resolve_root
from vflbench.data.registry import DATASETS
from vflbench.errors import DataError


def load_dataset(name: str, *, root: str | Path | None = None, **options: Any) -> Dataset:
    """Load the registered dataset ``name``; ``options`` are its own keyword arguments."""
    DATASETS.check(name, options, reserved=("root",), noun="option", error=DataError)
    return DATASETS.get(name).factory(root=resolve_root(root), **options)
