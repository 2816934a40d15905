"""Locating and verifying dataset files under the datasets root."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from vflbench.errors import DataError

ENV_VAR = "VFLBENCH_DATA"


def resolve_root(root: str | Path | None) -> Path | None:
    """The datasets root: the explicit argument, else ``$VFLBENCH_DATA``, else ``None``."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else None


def md5sum(path: Path) -> str:
    """MD5 hex digest of a file, read in chunks."""
    digest = hashlib.md5()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def require_files(
    dataset: str,
    root: Path | None,
    folder: str,
    files: Sequence[str],
    *,
    md5: Mapping[str, str] | None = None,
    source: str = "",
) -> Path:
    """Return ``root/folder`` after checking that ``files`` exist there (and their MD5s).

    A missing root, folder or file, or a checksum mismatch, raises a :class:`DataError` that
    names the expected files and where to put them.
    """
    where = f"{root}/{folder}/" if root is not None else f"<root>/{folder}/"
    expected = ", ".join(files)
    hint = (f"{dataset} needs the files {expected} in {where}"
            + (f" (published at {source})" if source else "")
            + f". Set the datasets root with --data-root, data.root, or ${ENV_VAR}.")
    if root is None:
        raise DataError(f"no datasets root is set. {hint}")
    base = root / folder
    missing = [f for f in files if not (base / f).is_file()]
    if missing:
        raise DataError(f"missing {', '.join(missing)}. {hint}")
    for name, want in (md5 or {}).items():
        got = md5sum(base / name)
        if got != want:
            raise DataError(
                f"{base / name} is corrupt or a different version: md5 {got}, expected {want}. {hint}"
            )
    return base
