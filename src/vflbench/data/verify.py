"""Check that file-based datasets are in place under the datasets root, without loading them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vflbench.data.files import check_files, resolve_root
from vflbench.data.registry import DATASETS
from vflbench.errors import DataError

Status = Literal["ok", "unverified", "missing", "corrupt", "embedded"]


@dataclass(frozen=True)
class DatasetStatus:
    """Whether one registered dataset's files are present and intact.

    ``status`` is ``"ok"`` (files present, every file's published checksum matches),
    ``"unverified"`` (files present and the published checksums match, but some files have no
    published checksum: the message names them), ``"missing"`` (no root, folder or file; each
    missing file is named once), ``"corrupt"`` (a checksum differs) or ``"embedded"`` (needs no
    files).
    """

    name: str
    status: Status
    message: str


def verify_datasets(root: str | Path | None, names: list[str] | None = None) -> list[DatasetStatus]:
    """Check the files (and published checksums) of the datasets ``names`` under ``root``.

    ``root`` ``None`` falls back to ``$VFLBENCH_DATA``. ``names`` ``None`` checks every
    registered dataset except generic loaders (``csv``), whose file is an option. Files are
    checked for presence and checksums only, never parsed. An unknown name, or a generic
    loader named explicitly, raises a :class:`DataError`.
    """
    base = resolve_root(root)
    if names is None:
        entries = [e for e in DATASETS if not e.info.get("generic")]
    else:
        entries = []
        for name in names:
            entry = DATASETS.get(name)  # an unknown name raises an error listing the valid ones
            if entry.info.get("generic"):
                raise DataError(f"dataset {name!r} reads a file given as an option and has no "
                                f"fixed files to verify; load it to check the file.")
            entries.append(entry)
    statuses: list[DatasetStatus] = []
    for entry in entries:
        files = tuple(entry.info.get("files", ()))
        folder = entry.info.get("folder")
        if not files or folder is None:
            statuses.append(DatasetStatus(entry.name, "embedded",
                                          "shipped with the package; no files needed"))
            continue
        check = check_files(entry.name, base, folder, files, md5=entry.info.get("md5"),
                            sha256=entry.info.get("sha256"), source=entry.info.get("source", ""))
        status: Status = "unverified" if check.status == "ok" and check.unchecked else check.status
        statuses.append(DatasetStatus(entry.name, status, check.message))
    return statuses
