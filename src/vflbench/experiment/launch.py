"""``vflbench launch``: every party of a config (and VMask's dealer) as its own local process over loopback gRPC.

Each party is a ``vflbench party run`` process (:mod:`vflbench.experiment.party`) with its own certificate from
a temporary per-launch CA (or the given ``certs`` directory), talking over mutual TLS on 127.0.0.1 (or without
TLS with ``insecure``). The active party writes the run directory (``OUT/<config hash>/result.json``,
atomically), so a launched run is read like a ``vflbench run`` one. Every process has deadlines (the start-up
barrier, a receive deadline without progress); a process that fails aborts its peers, and the launcher waits
``grace`` seconds for the others before it kills them, then names the party that failed first. A config with
defenses and attacks is first launched without its defenses (unless that run's result is in ``out_dir``), as
``vflbench run`` does, for the attacks' undefended leakage.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vflbench.errors import ConfigError, VFLBenchError
from vflbench.experiment.config import ExperimentConfig
from vflbench.experiment.party import check_party_config, party_names
from vflbench.experiment.resume import check_resumable, committed_epoch
from vflbench.experiment.run import undefended_config
from vflbench.net.linkmodel import LINK_PROFILES, LinkProfile
from vflbench.protocol.messages import ACTIVE, DEALER


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


def _error_line(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error:") or "Error:" in line or "Error(" in line:
            return line
    return lines[-1] if lines else "(no output)"


def launch(cfg: ExperimentConfig, *, out_dir: Path, certs: Path | None = None, insecure: bool = False,
           data_root: Path | None = None, start_timeout: float = 60.0, receive_timeout: float = 120.0,
           timeout: float | None = None, grace: float = 10.0, resume: bool = False,
           stop_after: int | None = None, shape: LinkProfile | None = None) -> Launched:
    """Run ``cfg`` with every party in its own process on this machine; returns when all have exited.

    ``certs``: a directory from ``vflbench net provision`` holding one subdirectory per party (a temporary CA is
    provisioned when ``None``); ``insecure``: no TLS (loopback only). ``timeout``: seconds for the whole run
    (``None``: no limit beyond the parties' own deadlines). Raises :class:`LaunchError` naming the failed party.
    ``resume``: every party continues from the last epoch all of them committed in ``out_dir/<hash>/checkpoints``
    (a :class:`ConfigError` when there is none); ``stop_after``: stop once that many epochs are committed (to be
    resumed; see :func:`~vflbench.experiment.party.run_party`). ``shape``: every process shapes the links it sends
    on to this bandwidth and one-way delay (:class:`~vflbench.net.transport.Shaper`), so the run takes the time it
    would on that network.
    """
    cfg = cfg.resolved()
    check_party_config(cfg)
    if resume:
        check_resumable(cfg)
        committed_epoch(out_dir / cfg.hash())  # refuse before any process starts
    if stop_after is not None and stop_after < 1:
        raise ConfigError(f"stop_after takes a number of epochs of at least 1, got {stop_after}")
    if cfg.defenses and cfg.attacks and not (out_dir / undefended_config(cfg).hash() / "result.json").is_file():
        # the attacks' leakage without the defenses, which result.json reports beside theirs (as `vflbench run`)
        launch(undefended_config(cfg), out_dir=out_dir, certs=certs, insecure=insecure, data_root=data_root,
               start_timeout=start_timeout, receive_timeout=receive_timeout, timeout=timeout, grace=grace,
               shape=shape)
    names = party_names(cfg)
    run_dir = out_dir / cfg.hash()
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    addresses = {ACTIVE: f"127.0.0.1:{free_port()}"}
    if DEALER in names:
        addresses[DEALER] = f"127.0.0.1:{free_port()}"
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH"))
                                                       if p)}
    with tempfile.TemporaryDirectory(prefix="vflbench-launch-") as tmp:
        config_path = Path(tmp) / "config.yaml"
        config_path.write_text(cfg.to_yaml())
        if certs is None and not insecure:
            from vflbench.net.provision import provision

            certs = Path(tmp) / "certs"
            provision(certs, names, project=f"launch-{cfg.hash()}", days=2)
        procs: dict[str, subprocess.Popen[bytes]] = {}
        files = {}
        tic = time.monotonic()
        try:
            for name in names:
                command = [sys.executable, "-m", "vflbench.cli", "party", "run", str(config_path), "--party", name,
                           "--out", str(run_dir), "--start-timeout", str(start_timeout),
                           "--receive-timeout", str(receive_timeout),
                           *(a for k, v in addresses.items() for a in ("--address", f"{k}={v}"))]
                command += ["--insecure"] if insecure else ["--certs", str(Path(certs or "") / name)]
                if data_root is not None:
                    command += ["--data-root", str(data_root)]
                command += ["--resume"] * resume + (["--stop-after", str(stop_after)] if stop_after else [])
                if shape is not None:
                    command += _shape_options(shape)
                files[name] = (logs / f"{name}.log").open("wb")
                procs[name] = subprocess.Popen(command, stdout=files[name], stderr=subprocess.STDOUT, env=env)
            failed = _wait(procs, timeout=timeout, grace=grace, started=tic)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for f in files.values():
                f.close()
    seconds = time.monotonic() - tic
    if failed:
        text = {n: (logs / f"{n}.log").read_text(errors="replace") for n in failed}
        # the party whose own error it is, not one that noticed another's failure
        failed.sort(key=lambda n: "(noticed by" in _error_line(text[n]))
        first, *others = failed
        detail = "; ".join(f"{n} (exit {procs[n].returncode}): {_error_line(text[n]).rstrip('.')}" for n in others)
        raise LaunchError(f"party {first} failed first (exit {procs[first].returncode}): "
                          f"{_error_line(text[first]).rstrip('.')}"
                          + (f"; then {detail}" if detail else "") + f". Logs: {logs}")
    if stop_after is not None and stop_after < cfg.train.epochs:
        return Launched(run_dir, {}, {}, seconds, stopped_after=stop_after)
    return Launched(run_dir, json.loads((run_dir / "result.json").read_text()),
                    json.loads((run_dir / "net.json").read_text()), seconds)


def _shape_options(shape: LinkProfile) -> list[str]:
    """The ``party run`` options that give a process ``shape``: a named profile by its name (so that ``net.json``
    records its source), any other link by its numbers."""
    name = next((key for key, profile in LINK_PROFILES.items() if profile == shape), None)
    if name is not None:
        return ["--shape", name]
    return ["--bandwidth-mbit", repr(shape.bandwidth_mbit_s), "--latency-ms", repr(shape.latency_ms)]


def _wait(procs: dict[str, subprocess.Popen[bytes]], *, timeout: float | None, grace: float,
          started: float) -> list[str]:
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
        if (first_failure is not None and now - first_failure > grace) or \
                (timeout is not None and now - started > timeout):
            for n in running:
                procs[n].kill()
                procs[n].wait()
            return failed + [n for n in running if n not in failed]
        time.sleep(0.05)
