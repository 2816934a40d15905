"""``vflbench launch``: every party of a config (and VMask's dealer) as its own local process over loopback gRPC.

Each party is a ``vflbench party run`` process (:mod:`vflbench.experiment.party`) with its own certificate from
a temporary per-launch CA (or the given ``certs`` directory), talking over mutual TLS on 127.0.0.1 (or without
TLS with ``insecure``). The active party writes the run directory (``OUT/<config hash>/result.json``,
atomically), so a launched run is read like a ``vflbench run`` one. Every process has deadlines (the start-up
barrier, a receive deadline without progress); a process that fails aborts its peers, and the launcher waits
``grace`` seconds for the others before it kills them, then names the party that failed first. A config with
defenses and attacks is launched beside the same config without its defenses (unless that run's result is in
``out_dir``), as ``vflbench run`` does, for the attacks' undefended leakage. The party processes are forked from
one fork server that imports torch, vflbench and gRPC once for all of them, and start together.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from vflbench.errors import ConfigError, VFLBenchError
from vflbench.experiment.config import ExperimentConfig
from vflbench.experiment.workers import PARTY_PRELOAD, Context, fork_server

if TYPE_CHECKING:
    from vflbench.net.linkmodel import LinkProfile


class LaunchError(VFLBenchError):
    """A party process of a launched run failed (the message names it and its error)."""


@dataclass
class Launched:
    """A finished launch: the run directory, its ``result.json`` and ``net.json``, and the wall time (s);
    ``stopped_after``: the epochs after which ``stop_after`` stopped it (then ``result`` and ``net`` are empty)."""

    run_dir: Path
    result: dict[str, Any]
    net: dict[str, Any]
    seconds: float
    stopped_after: int | None = None


def free_port() -> int:
    """A loopback port that is free now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


NO_LOG = (
    "it exited before it wrote its log, while starting (a script that calls launch must guard its entry point with "
    "`if __name__ == '__main__':`, since each party process imports the script's main module again; "
    "the error went to the launcher's standard error)"
)


def _log_text(log: Path) -> str:
    """A party's log, or what its absence means: the process failed before :func:`_party_main` opened it."""
    try:
        return log.read_text(errors="replace")
    except FileNotFoundError:
        return NO_LOG


def _error_line(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error:") or "Error:" in line or "Error(" in line:
            return line
    return lines[-1] if lines else "(no output)"


def launch(
    cfg: ExperimentConfig,
    *,
    out_dir: Path,
    certs: Path | None = None,
    insecure: bool = False,
    data_root: Path | None = None,
    start_timeout: float = 60.0,
    receive_timeout: float = 120.0,
    timeout: float | None = None,
    grace: float = 10.0,
    resume: bool = False,
    stop_after: int | None = None,
    shape: LinkProfile | None = None,
) -> Launched:
    """Run ``cfg`` with every party in its own process on this machine; returns when all have exited.

    ``certs``: a directory from ``vflbench net provision`` holding one subdirectory per party (a temporary CA is
    provisioned when ``None``); ``insecure``: no TLS (loopback only). ``timeout``: seconds for the whole run
    (``None``: no limit beyond the parties' own deadlines). Raises :class:`LaunchError` naming the failed party.
    ``resume``: every party continues from the last epoch all of them committed in ``out_dir/<hash>/checkpoints``
    (a :class:`ConfigError` when there is none); ``stop_after``: stop once that many epochs are committed (to be
    resumed; see :func:`~vflbench.experiment.party.run_party`). ``shape``: every process shapes the links it sends
    on to this bandwidth and one-way delay (:class:`~vflbench.net.transport.Shaper`), so the run takes the time it
    would on that network.

    The party processes are forked from one fork server (:func:`party_context`), which imports torch, vflbench
    and gRPC once for all of them, and start together. A config with defenses and attacks is launched beside the
    same config without its defenses (unless that run's result is in ``out_dir``), as ``vflbench run`` does, for
    the attacks' undefended leakage: its processes start with the others', and the active party reads its result
    when it scores its attacks (the launcher holds the run's claim meanwhile,
    :func:`~vflbench.experiment.run.claim_undefended`). A config with a detector and a malicious attack is launched
    beside its honest reference too (:func:`~vflbench.experiment.run.honest_config`), read the same way.
    """
    cfg = cfg.resolved()
    _check_launch(cfg, out_dir, resume=resume, stop_after=stop_after)
    context = party_context()  # the fork server imports while the certificates are made
    options = _Options(
        out_dir=out_dir,
        insecure=insecure,
        data_root=data_root,
        start_timeout=start_timeout,
        receive_timeout=receive_timeout,
        shape=shape,
    )
    with (
        tempfile.TemporaryDirectory(prefix="vflbench-launch-") as tmp,
        _claimed_runs(cfg, out_dir, resume=resume, stop_after=stop_after) as runs,
    ):
        certs = _certificates(certs, insecure, cfg, Path(tmp))
        failed, procs, logs, tic = _run_processes(runs, options, certs, tmp, context, timeout=timeout, grace=grace)
    seconds = time.monotonic() - tic
    if failed:
        raise _failure(failed, procs, logs)
    return _launched(out_dir / cfg.hash(), cfg, stop_after, seconds)


@contextlib.contextmanager
def _claimed_runs(
    cfg: ExperimentConfig, out_dir: Path, *, resume: bool, stop_after: int | None
) -> Iterator[list[_Run]]:
    """The runs to launch, holding the claims of the references among them: ``cfg``, its undefended reference (a
    config with defenses and attacks) and its detectors' honest reference (a detector against a malicious attack),
    each reference unless its result is in ``out_dir`` or another process that claimed it wrote it."""
    from vflbench.experiment.run import (
        claim_reference,
        claim_undefended,
        honest_config,
        needs_honest_reference,
        undefended_config,
    )

    undefended = undefended_config(cfg) if cfg.defenses and cfg.attacks else None
    honest = honest_config(cfg) if needs_honest_reference(cfg) else None
    with (
        _claimed(undefended, out_dir, claim_undefended) as launch_undefended,
        _claimed(honest, out_dir, claim_reference) as launch_honest,
    ):
        runs = [_Run(cfg, "", resume, stop_after)]
        if launch_undefended:
            assert undefended is not None
            runs.append(_Run(undefended, f" of the undefended reference run {undefended.hash()}", False, None))
        if launch_honest:
            assert honest is not None
            runs.append(_Run(honest, f" of the detectors' honest reference run {honest.hash()}", False, None))
        yield runs


def _run_processes(
    runs: list[_Run],
    options: _Options,
    certs: Path | None,
    tmp: str,
    context: Context,
    *,
    timeout: float | None,
    grace: float,
) -> tuple[list[str], dict[str, _PartyProcess], dict[str, Path], float]:
    """Start every party process of ``runs`` (forked from ``context``) and wait for all of them (:func:`_wait`),
    killing any still running on the way out; the parties that failed, the processes, their logs, and the
    monotonic time they were started at."""
    procs: dict[str, _PartyProcess] = {}
    logs: dict[str, Path] = {}
    tic = time.monotonic()
    try:
        for run in runs:
            for key, (argv, log) in _party_commands(run, options, certs, Path(tmp)).items():
                logs[key] = log
                procs[key] = _PartyProcess(context, argv, log)
        failed = _wait(procs, timeout=timeout, grace=grace, started=tic)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return failed, procs, logs, tic


def _launched(run_dir: Path, cfg: ExperimentConfig, stop_after: int | None, seconds: float) -> Launched:
    """What a launch that succeeded gives: the run's ``result.json`` and ``net.json`` from ``run_dir``, or nothing
    but ``stopped_after`` when ``stop_after`` stopped it before its last epoch."""
    if stop_after is not None and stop_after < cfg.train.epochs:
        return Launched(run_dir, {}, {}, seconds, stopped_after=stop_after)
    return Launched(
        run_dir,
        json.loads((run_dir / "result.json").read_text()),
        json.loads((run_dir / "net.json").read_text()),
        seconds,
    )


def _check_launch(cfg: ExperimentConfig, out_dir: Path, *, resume: bool, stop_after: int | None) -> None:
    """Refuse what :func:`launch` cannot run, before any process starts."""
    # imported here, not with this module: the command line starts the fork server (party_context) first
    from vflbench.experiment.party import check_party_config
    from vflbench.experiment.resume import check_resumable, committed_epoch

    check_party_config(cfg)
    if resume:
        check_resumable(cfg)
        committed_epoch(out_dir / cfg.hash())
    if stop_after is not None and stop_after < 1:
        raise ConfigError(f"stop_after takes a number of epochs of at least 1, got {stop_after}")


@dataclass(frozen=True)
class _Options:
    """What every party process of a launch is started with (see :func:`launch`)."""

    out_dir: Path
    insecure: bool
    data_root: Path | None
    start_timeout: float
    receive_timeout: float
    shape: LinkProfile | None


def _certificates(certs: Path | None, insecure: bool, cfg: ExperimentConfig, tmp: Path) -> Path | None:
    """The parties' certificates: ``certs``, or a temporary CA's provisioned in ``tmp`` (none when ``insecure``)."""
    if certs is not None or insecure:
        return certs
    from vflbench.experiment.party import party_names
    from vflbench.net.provision import provision

    provision(tmp / "certs", party_names(cfg), project=f"launch-{cfg.hash()}", days=2)
    return tmp / "certs"


def _party_commands(run: _Run, options: _Options, certs: Path | None, tmp: Path) -> dict[str, tuple[list[str], Path]]:
    """Each party process of ``run``: its ``vflbench party run`` arguments and its log file, by party (and run)."""
    from vflbench.experiment.party import party_names
    from vflbench.protocol.messages import ACTIVE, DEALER

    config_path = tmp / f"{run.cfg.hash()}.yaml"
    config_path.write_text(run.cfg.to_yaml())
    run_logs = options.out_dir / run.cfg.hash() / "logs"
    run_logs.mkdir(parents=True, exist_ok=True)
    names = party_names(run.cfg)
    addresses = {ACTIVE: f"127.0.0.1:{free_port()}"}
    if DEALER in names:
        addresses[DEALER] = f"127.0.0.1:{free_port()}"
    commands = {}
    for name in names:
        argv = [
            "party",
            "run",
            str(config_path),
            "--party",
            name,
            "--out",
            str(options.out_dir / run.cfg.hash()),
            "--start-timeout",
            str(options.start_timeout),
            "--receive-timeout",
            str(options.receive_timeout),
            *(a for k, v in addresses.items() for a in ("--address", f"{k}={v}")),
        ]
        argv += ["--insecure"] if options.insecure else ["--certs", str(Path(certs or "") / name)]
        if options.data_root is not None:
            argv += ["--data-root", str(options.data_root)]
        argv += ["--resume"] * run.resume
        argv += ["--stop-after", str(run.stop_after)] if run.stop_after else []
        if options.shape is not None:
            argv += _shape_options(options.shape)
        commands[name + run.label] = (argv, run_logs / f"{name}.log")
    return commands


def _failure(failed: list[str], procs: Mapping[str, _PartyProcess], logs: Mapping[str, Path]) -> LaunchError:
    """The error naming the party that failed first (the one whose own error it is, not one that noticed another's
    failure), then the others, with where their logs are."""
    text = {n: _log_text(logs[n]) for n in failed}
    failed = sorted(failed, key=lambda n: "(noticed by" in _error_line(text[n]))
    first, *others = failed
    detail = "; ".join(
        f"{n} (exit {procs[n].returncode}): "
        + ("no log either" if text[n] == NO_LOG == text[first] else _error_line(text[n]).rstrip("."))
        for n in others
    )
    return LaunchError(
        f"party {first} failed first (exit {procs[first].returncode}): "
        f"{_error_line(text[first]).rstrip('.')}"
        + (f"; then {detail}" if detail else "")
        + f". Logs: {logs[first].parent}"
    )


@dataclass(frozen=True)
class _Run:
    """One run of a launch: its config, the words that tell its parties apart in errors, resume and stop_after."""

    cfg: ExperimentConfig
    label: str
    resume: bool
    stop_after: int | None


@contextlib.contextmanager
def _claimed(
    reference: ExperimentConfig | None,
    out_dir: Path,
    claim: Callable[[ExperimentConfig, Path], contextlib.AbstractContextManager[bool]],
) -> Iterator[bool]:
    """Whether this launch must run ``reference`` (the undefended run of its config, or its detectors' honest run),
    holding its ``claim`` while it does: not when there is none, when its result is in ``out_dir``, or once another
    process that claimed it has written it (then this waits for that)."""
    if reference is None or (out_dir / reference.hash() / "result.json").is_file():
        yield False
        return
    with claim(reference, out_dir) as mine:
        yield mine and not (out_dir / reference.hash() / "result.json").is_file()


def party_context() -> Context:
    """Where the party processes come from: the fork server (:func:`~vflbench.experiment.workers.fork_server`),
    started now (if it is not running yet) and importing ``PARTY_PRELOAD`` at once. It runs no torch operation and
    opens no gRPC channel, so a party forked from it starts clean."""
    return fork_server(PARTY_PRELOAD)


def _party_main(argv: list[str], log: str) -> None:
    """A party process: ``vflbench party run ARGV`` with its output in ``log`` (its exit status is the command's)."""
    with open(log, "ab", buffering=0) as file:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
    sys.argv = ["vflbench", *argv]
    # the command line by name, as the party processes were started before (`python -m vflbench.cli party run`)
    importlib.import_module("vflbench.cli").main()


class _PartyProcess:
    """A party process forked from the launcher's fork server, with the part of :class:`subprocess.Popen`'s
    interface the launcher uses (``poll``, ``returncode``, ``kill``, ``wait``)."""

    def __init__(self, context: Context, argv: list[str], log: Path) -> None:
        self.process = context.Process(target=_party_main, args=(argv, str(log)), name=f"vflbench-{argv[4]}")
        self.process.start()

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()

    def wait(self) -> int | None:
        self.process.join()
        return self.process.exitcode


class _Process(Protocol):
    """What the launcher needs of a process: a :class:`subprocess.Popen` or a :class:`_PartyProcess`."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...

    def wait(self) -> int | None: ...


def _shape_options(shape: LinkProfile) -> list[str]:
    """The ``party run`` options that give a process ``shape``: a named profile by its name (so that ``net.json``
    records its source), any other link by its numbers."""
    from vflbench.net.linkmodel import LINK_PROFILES

    name = next((key for key, profile in LINK_PROFILES.items() if profile == shape), None)
    if name is not None:
        return ["--shape", name]
    return ["--bandwidth-mbit", repr(shape.bandwidth_mbit_s), "--latency-ms", repr(shape.latency_ms)]


def _wait(procs: Mapping[str, _Process], *, timeout: float | None, grace: float, started: float) -> list[str]:
    """Wait for every process; the parties that failed, in the order their failure was seen (a process still
    running ``grace`` seconds after the first failure, or at ``timeout``, is killed and counts as failed)."""
    failed: list[str] = []
    first_failure: float | None = None
    while True:
        running = [n for n, p in procs.items() if p.poll() is None]
        failed += [n for n, p in procs.items() if p.returncode not in (None, 0) and n not in failed]
        if failed and first_failure is None:
            first_failure = time.monotonic()
        if not running:
            return failed
        now = time.monotonic()
        if (first_failure is not None and now - first_failure > grace) or (
            timeout is not None and now - started > timeout
        ):
            for n in running:
                procs[n].kill()
                procs[n].wait()
            return failed + [n for n in running if n not in failed]
        time.sleep(0.05)
