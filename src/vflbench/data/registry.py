"""The dataset registry.

A dataset factory takes keyword-only arguments: ``root`` (the datasets root, a
:class:`pathlib.Path` or ``None``) and its own options, and returns a :class:`Dataset`.
Entries carry ``files`` (the files a user must place under the root; empty for embedded data).
"""

from __future__ import annotations

from collections.abc import Mapping

from vflbench.data.base import Dataset
from vflbench.registry import Param, Registry

DATASETS: Registry[Dataset] = Registry("dataset")
#: The constraint of the loaders that split their rows themselves.
SPLIT: Mapping[str, Param] = {"test_fraction": Param("share of the rows held out for testing", gt=0, lt=1)}
