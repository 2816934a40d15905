"""Locating and verifying dataset files under the datasets root."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vflbench.errors import DataError

ENV_VAR = "VFLBENCH_DATA"


def resolve_root(root: str | Path | None) -> Path | None:
    """The datasets root: the explicit argument, else ``$VFLBENCH_DATA``, else ``None``."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else None


def _digest(path: Path, algorithm: str) -> str:
    """Hex digest of a file with a :mod:`hashlib` algorithm, read in chunks."""
    digest = hashlib.new(algorithm)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def md5sum(path: Path) -> str:
    """MD5 hex digest of a file, read in chunks."""
    return _digest(path, "md5")


def sha256sum(path: Path) -> str:
    """SHA-256 hex digest of a file, read in chunks."""
    return _digest(path, "sha256")


@dataclass(frozen=True)
class FileCheck:
    """Outcome of :func:`check_files`: ``base`` is ``root/folder`` (``None`` without a root); ``unchecked``: the
    present files that have no published checksum (so only their presence was checked)."""

    status: Literal["ok", "missing", "corrupt"]
    message: str
    base: Path | None
    unchecked: tuple[str, ...] = ()


def check_files(
    dataset: str,
    root: Path | None,
    folder: str,
    files: Sequence[str],
    *,
    md5: Mapping[str, str] | None = None,
    sha256: Mapping[str, str] | None = None,
    source: str = "",
) -> FileCheck:
    """Check that ``files`` exist in ``root/folder`` and match their checksums; never raises.

    The message of a failed check names the files that are missing (each once) or corrupt, where to
    put them, and how to set the datasets root; a passed check's message says what was verified and
    names the files that have no published checksum.
    """
    where = f"{root}/{folder}/" if root is not None else f"<root>/{folder}/"
    published = f" (published at {source})" if source else ""
    how = f"Set the datasets root with --data-root, data.root, or ${ENV_VAR}."
    if root is None:
        return FileCheck(
            "missing", f"no datasets root is set; {dataset} needs {', '.join(files)} in {where}{published}. {how}", None
        )
    base = root / folder
    missing = [f for f in files if not (base / f).is_file()]
    if missing:
        there = [f for f in files if f not in missing]
        present = f" (present: {', '.join(there)})" if there else ""
        return FileCheck("missing", f"missing {', '.join(missing)} in {where}{present}{published}. {how}", base)
    checked = 0
    for algorithm, sums in (("md5", md5), ("sha256", sha256)):
        for name, want in (sums or {}).items():
            got = _digest(base / name, algorithm)
            if got != want.lower():
                return FileCheck(
                    "corrupt",
                    f"{base / name} is corrupt or a different version: {algorithm} {got}, "
                    f"expected {want}. {dataset} needs the files {', '.join(files)} in {where}{published}. {how}",
                    base,
                )
            checked += 1
    summed = set(md5 or {}) | set(sha256 or {})
    unchecked = tuple(f for f in files if f not in summed)
    verified = [f"{checked} checksum(s) match"] if checked else []
    if unchecked:
        verified.append(f"no published checksum for {', '.join(unchecked)}, so only their presence was checked")
    return FileCheck("ok", f"{len(files)} file(s) present in {base}/; " + "; ".join(verified), base, unchecked)


def require_files(
    dataset: str,
    root: Path | None,
    folder: str,
    files: Sequence[str],
    *,
    md5: Mapping[str, str] | None = None,
    sha256: Mapping[str, str] | None = None,
    source: str = "",
) -> Path:
    """Return ``root/folder`` after checking that ``files`` exist there (and their checksums).

    A missing root, folder or file, or an MD5/SHA-256 mismatch, raises a :class:`DataError`
    that names the expected files and where to put them.
    """
    check = check_files(dataset, root, folder, files, md5=md5, sha256=sha256, source=source)
    if check.status != "ok" or check.base is None:
        raise DataError(check.message)
    return check.base
