"""An exclusive lock on a directory for one process, in a file that names its holder (the pid).

Where the platform has ``flock`` (Linux, macOS) the kernel holds the lock and releases it when the
holder dies however it dies, so a lock left by a killed process is taken over at once and a reused
pid is never mistaken for the holder; elsewhere (or on a file system without ``flock``) the lock is
the file itself, taken over when the pid it names no longer runs.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from vflbench.errors import VFLBenchError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)


class LockHeld(VFLBenchError):
    """Another running process holds the lock; ``pid`` names it (``None`` when the file does not say)."""

    def __init__(self, message: str, path: Path, pid: int | None) -> None:
        super().__init__(message)
        self.path, self.pid = path, pid


def _read_pid(text: str) -> int | None:
    try:
        pid = int(text.strip() or "0")
    except ValueError:
        return None
    return pid if pid > 0 else None


def _alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs (an unknown pid counts as running: its lock is being written)."""
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def exclusive(path: Path, busy: str = "{path} is held by process {pid}") -> Iterator[None]:
    """Hold the lock file ``path`` (its directory must exist) for the block, with this process's pid in it;
    raise :class:`LockHeld` at once when another running process holds it, with the message ``busy`` (its
    ``{pid}`` and ``{path}`` filled in). A lock whose holder is gone is taken over (logged). The file is
    removed when the block ends."""
    fd = _acquire(path, busy)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)


def _acquire(path: Path, busy: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            previous = _read_pid(os.read(fd, 32).decode(errors="replace"))
            if not _lock_fd(fd, previous):
                raise LockHeld(
                    busy.format(pid=previous if previous is not None else "unknown", path=path), path, previous
                )
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder removed the file between our open and our lock: lock the new one
                os.close(fd)
                continue
            if previous is not None and previous != os.getpid():
                log.info("taking over %s from process %d, which no longer runs", path, previous)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise


def _lock_fd(fd: int, previous: int | None) -> bool:
    """Lock the open lock file ``fd``: ``False`` when another process holds it. ``previous``: the pid the file
    names, which decides where the kernel cannot lock (no ``flock``, or a file system refusing it)."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            log.debug("flock is not available here (%s); the pid in the lock file decides", exc)
    return previous is None or previous == os.getpid() or not _alive(previous)
