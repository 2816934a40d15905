"""Check that file-based datasets are in place under the datasets root, without loading them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vflbench.data.files import check_files, resolve_root
from vflbench.errors import DataError, unknown_name
from vflbench.registry import closest

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


def verify_datasets(
    root: str | Path | None, names: list[str] | None = None, *, infos: Mapping[str, Mapping[str, Any]] | None = None
) -> list[DatasetStatus]:
    """Check the files (and published checksums) of the datasets ``names`` under ``root``.

    ``root`` ``None`` falls back to ``$VFLBENCH_DATA``. ``names`` ``None`` checks every
    registered dataset except generic loaders (``csv``), whose file is an option. Files are
    checked for presence and checksums only, never parsed. An unknown name, or a generic
    loader named explicitly, raises a :class:`DataError`. ``infos``: each dataset's registry
    ``info`` (its files, folder, checksums, source) by name; by default the live registry's, which
    imports every loader (and torch); the command line passes :mod:`vflbench.catalog`'s instead.
    """
    if infos is None:
        from vflbench.data import DATASETS

        infos = {e.name: e.info for e in DATASETS}
    base = resolve_root(root)
    if names is None:
        chosen = [name for name, info in infos.items() if not info.get("generic")]
    else:
        for name in names:
            if name not in infos:
                error = unknown_name("dataset", name, infos)
                raise type(error)(f"{error}{closest(name, infos)}")
            if infos[name].get("generic"):
                raise DataError(
                    f"dataset {name!r} reads a file given as an option and has no "
                    f"fixed files to verify; load it to check the file."
                )
        chosen = list(names)
    statuses: list[DatasetStatus] = []
    for name in chosen:
        info = infos[name]
        files = tuple(info.get("files", ()))
        folder = info.get("folder")
        if not files or folder is None:
            statuses.append(DatasetStatus(name, "embedded", "shipped with the package; no files needed"))
            continue
        check = check_files(
            name, base, folder, files, md5=info.get("md5"), sha256=info.get("sha256"), source=info.get("source", "")
        )
        status: Status = "unverified" if check.status == "ok" and check.unchecked else check.status
        statuses.append(DatasetStatus(name, status, check.message))
    return statuses
