"""Fork servers for vflbench's worker processes: a sweep's workers and a launch's party processes.

A fork server is a fresh process that imports what its workers need once (a preload module: torch, vflbench,
scikit-learn; :mod:`~vflbench.experiment.sweep_worker`, :mod:`~vflbench.experiment.party_worker`) and then forks
each worker ready to run. It runs no torch operation, so no thread pool is copied into a worker (the reason
workers are not forked from the sweep's own process). This module imports nothing heavy, so that a command can
start the fork server first and import torch itself afterwards: the two imports then run side by side (on a
many-core machine, the workers' start-up no longer follows the command's own).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Any

#: What the sweep's fork server imports once (:mod:`vflbench.experiment.sweep_worker`).
WORKER_PRELOAD = ["vflbench.experiment.sweep_worker"]
#: What a launch's fork server imports once for all party processes (:mod:`vflbench.experiment.party_worker`).
PARTY_PRELOAD = ["vflbench.experiment.party_worker"]

Context = multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext


def fork_server(preload: list[str]) -> Context:
    """Where worker processes come from: the fork server where the platform has one (Linux, macOS), started now
    (if it is not running yet) and importing ``preload`` at once, else spawned processes (which import what they
    need themselves). One process has one fork server: the first call's ``preload`` is the one it imports."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload)
    with sigint_ignored_by_children():
        multiprocessing.forkserver.ensure_running()
    return context


def start_sweep_workers(sweep: Mapping[str, Any] | None, workers: int | None = None) -> Context | None:
    """Start the sweep's fork server now if the sweep runs on local worker processes (``workers``, else the
    section's ``workers``, above 1; its ``executor`` local); the context to take them from, else ``None``.
    ``sweep``: the config's ``sweep`` section as written (the sweep validates it, and its defaults are 1 worker
    and the local executor). Calling it again is harmless."""
    section = dict(sweep or {})
    count = workers or section.get("workers", 1)
    if section.get("executor", "local") != "local" or not isinstance(count, int) or count < 2:
        return None
    return fork_server(WORKER_PRELOAD)


@contextlib.contextmanager
def sigint_ignored_by_children() -> Iterator[None]:
    """Start processes in this block with SIGINT ignored from their first instruction (an ignored signal stays
    ignored across fork and exec, and Python then installs no handler of its own): the fork server, and every
    worker it forks, never turn a Ctrl-C on the terminal into a ``KeyboardInterrupt`` traceback, not even while
    the server still imports torch; this process handles the Ctrl-C. This process ignores SIGINT too while the
    block runs (starting the fork server takes about 6 ms: a Ctrl-C in them is lost, and a second one works).
    Only the main thread can change signal handlers; elsewhere the block does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
