"""The ``vflbench`` command line."""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import logging
import os
import re
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from vflbench import catalog
from vflbench._version import __version__
from vflbench.errors import VFLBenchError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Train, attack, defend and evaluate vertical federated learning.",
)
datasets_app = typer.Typer(no_args_is_help=True, help="Dataset utilities.")
app.add_typer(datasets_app, name="datasets")
net_app = typer.Typer(no_args_is_help=True, help="Parties across processes and machines (the `net` extra).")
app.add_typer(net_app, name="net")
party_app = typer.Typer(no_args_is_help=True, help="Run one party of an experiment in this process (the `net` extra).")
app.add_typer(party_app, name="party")
out = Console()
err = Console(stderr=True)

#: The link-shaping options that `party run` and `launch` share.
ShapeOption = Annotated[
    str | None,
    typer.Option(
        "--shape", help="shape every link this party sends on: lan (836 Mbit/s, 0.1 ms) or wan (100 Mbit/s, 50 ms)"
    ),
]
BandwidthOption = Annotated[
    float | None, typer.Option("--bandwidth-mbit", help="shape the links to this bandwidth (Mbit/s)")
]
LatencyOption = Annotated[float | None, typer.Option("--latency-ms", help="and this one-way delay (ms)")]


def _print_version(value: bool) -> None:
    if value:
        out.print(f"vflbench {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Train, attack, defend and evaluate vertical federated learning."""


KINDS = ("datasets", "models", "attacks", "defenses")


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the garbage collector while a command imports torch and the components: the imports create about a
    million objects and no garbage, and the collector's passes over them cost a fifth of the import time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class RichProgress:
    """Progress bar on a terminal; one log line per epoch otherwise."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar: Progress | None = None
        self.epochs = 0

    def start(self, epochs: int, steps_per_epoch: int) -> None:  # noqa: D102
        self.epochs = epochs
        if self.console.is_terminal:
            self.bar = Progress(
                TextColumn("training"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=self.console,
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("", total=epochs * steps_per_epoch)

    def advance(self) -> None:  # noqa: D102
        if self.bar is not None:
            self.bar.advance(self.task)

    def epoch_done(self, record: dict[str, Any]) -> None:  # noqa: D102
        metrics = " ".join(f"{k}={v:.4f}" for k, v in record.items() if k.startswith("test_"))
        line = f"epoch {record['epoch'] + 1}/{self.epochs} loss={record['loss']:.4f} {metrics}"
        if self.bar is not None:
            self.bar.update(self.task, description=line)
            if record["epoch"] + 1 == self.epochs:
                self.bar.stop()
        else:
            logging.getLogger("vflbench").info(line)


BASELINE_LABELS = {"vanilla": "VFL without defenses", "alone": "active party alone"}


def check_out_dir(path: Path, option: str = "--out", *, exists: bool = False) -> None:
    """Fail with one line before any work if this command cannot write into the directory ``path``
    (a file in its place, an unwritable or read-only parent); ``exists``: it must already exist."""
    if path.exists() and not path.is_dir():
        raise VFLBenchError(f"{option} {path} is a file; give a directory")
    if exists and not path.is_dir():
        raise VFLBenchError(f"{option} {path} does not exist")
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise VFLBenchError(f"{option} {path}: {existing} is a file, not a directory")
    try:  # os.access is not enough: it ignores read-only mounts for some users and ACLs for others
        os.rmdir(tempfile.mkdtemp(prefix=".vflbench-", dir=existing))
    except OSError as exc:
        raise VFLBenchError(f"{option} {path}: cannot write in {existing} ({exc.strerror})") from None


def _value(value: float, diverged: bool = False) -> str:
    return f"{value:.4f}" + (" (diverged)" if diverged else "")


def _result_table(result: Any) -> Table:
    table = Table(title=f"run {result.config_hash} (seed {result.seed})")
    for col in ("what", "metric", "value", "prior", "leakage (points)", "without defense"):
        table.add_column(col, justify="left" if col in ("what", "metric") else "right")
    u = result.utility
    label = "VFL" + (f" + {', '.join(d['name'] for d in result.defense)}" if result.defense else " (vanilla)")
    table.add_row(label, u.metric, _value(u.value, u.diverged), "", "", "")
    for name, base in result.baselines.items():
        if name == "vanilla" and not result.defense:
            continue  # without defenses the run itself is the vanilla baseline (the row above)
        label = BASELINE_LABELS.get(name, name)
        if "skipped" in base:
            table.add_row(label, "-", "skipped", "", "", "")
        else:
            table.add_row(label, base["metric"], _value(base["value"], base.get("diverged", False)), "", "", "")
    for a in result.attacks:
        metric = f"{a.metric} ({a.direction} leaks more)"
        if a.details.get("selection") == "test_oracle":
            metric += " [test-oracle epoch]"
        if a.details.get("out_of_range"):
            metric += f" [OUT OF RANGE: {100 * a.details['out_of_range_share']:.0f}% of the values]"
        leakage = f"{a.leakage:.2f}" + (f" [{a.leakage_ci[0]:.2f}, {a.leakage_ci[1]:.2f}]" if a.leakage_ci else "")
        if a.undefended_leakage is None:
            undefended = "unknown"
        else:
            verdict = {True: "leaks", False: "no measurable leak: nothing to defend", None: "unknown: no interval"}[
                a.leaks_without_defense
            ]
            undefended = f"{a.undefended_leakage:.2f} ({verdict})"
        table.add_row(
            f"attack {a.name}", metric, f"{a.value:.4f}", f"{a.prior:.4f} ({a.prior_name})", leakage, undefended
        )
        _searched_row(table, a)
    if result.attacks:
        repeats = max(len(a.leakages) for a in result.attacks)
        table.caption = f"leakage: mean over {repeats} repeat(s) of each attack on this trained model" + (
            " with its 95% interval [low, high] over the attack's randomness"
            if repeats > 1
            else "; set evaluation.repeats >= 2 for intervals, and sweep seeds for the training's randomness"
        )
        if any(a.details.get("search") for a in result.attacks):
            table.caption += (
                "; searched: the attacker's setting its own validation rows selected "
                "(evaluation.attacker_search), never the test rows"
            )
    return table


def _searched_row(table: Table, a: Any) -> None:
    """The row of the attacker the attacker search selected for attack ``a`` (its setting, value, prior and
    leakage), or "default attacker only" for an attack whose settings cannot be searched."""
    search = a.details.get("search") or {}
    if a.leakage_worst is not None:
        setting = ", ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in (a.attacker_setting or {}).items()
        )
        ci = a.leakage_worst_ci
        leakage = f"{a.leakage_worst:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
        undefended = "unknown" if a.undefended_leakage_worst is None else f"{a.undefended_leakage_worst:.2f}"
        table.add_row(
            f"  searched: {setting}" + (" (the default)" if search.get("chosen_is_default") else ""),
            "",
            f"{a.value_worst:.4f}",
            f"{a.prior_worst:.4f}",
            leakage,
            undefended,
        )
    elif search.get("status") == "default attacker only":
        table.add_row("  searched", "", "default attacker only", "", "", "")


def _share(flagged: Any, decisions: Any) -> str:
    """``flagged / decisions (rate%)``, or why there is no rate."""
    if decisions is None:
        return "unknown"
    if not decisions:
        return "no decision (too few scores)"
    return f"{flagged} / {decisions} ({100.0 * flagged / decisions:.1f}%)"


def detector_table(result: Any) -> Table | None:
    """The run's detectors: the share of their decisions that flagged this run, and the same detector's share on
    honest training of the same scenario (its false-alarm rate); ``None`` when the run has no detector."""
    rows = [d for d in result.defense if "honest_reference" in d]
    if not rows:
        return None
    table = Table(title="detectors: decisions that flagged the training")
    for col in ("detector", "this run", "honest training (false alarms)", "first flag (step)", "halted"):
        table.add_column(col, justify="left" if col == "detector" else "right")
    for d in rows:
        own, ref = d.get("details", {}), d["honest_reference"]
        honest = _share(ref.get("flagged"), ref.get("decisions")) + (" (this run)" if ref.get("same_run") else "")
        first = [p["first_flag_step"] for p in own.get("parties", {}).values() if p.get("first_flag_step") is not None]
        halted = any(p.get("halted") for p in own.get("parties", {}).values())
        table.add_row(
            d["name"],
            _share(own.get("flagged"), own.get("decisions")),
            honest,
            str(min(first)) if first else "-",
            "yes" if halted else "no",
        )
    table.caption = (
        "a detector that flags honest training about as often as the attack detects nothing; rates over "
        "seeds with intervals: vflbench sweep"
    )
    return table


def with_device(set_: list[str] | None, device: str | None) -> list[str]:
    """The ``--set`` overrides with ``--device`` appended as ``train.device=...`` (its shorthand)."""
    return [*(set_ or []), *([f"train.device={device}"] if device is not None else [])]


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="experiment YAML")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override, e.g. train.epochs=5")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="directory for run directories")] = Path("runs"),
    data_root: Annotated[Path | None, typer.Option("--data-root", help="datasets root")] = None,
    device: Annotated[str | None, typer.Option("--device", help="auto, cpu, cuda or cuda:N (train.device)")] = None,
) -> None:
    """Train and evaluate one experiment; write OUT/<config hash>/result.json."""
    set_ = with_device(set_, device)
    with collector_paused():
        from vflbench.experiment.config import load_config
        from vflbench.experiment.run import run_experiment

        cfg = load_config(config, set_ or [])
    if cfg.sweep is not None:
        raise VFLBenchError(
            f"{config} has a sweep: section, and `vflbench run` runs one experiment; run the sweep "
            f"with: vflbench sweep {config} --out DIR (or remove the sweep: section to run the base "
            "config alone)"
        )
    check_out_dir(out_dir)
    result = run_experiment(cfg, out_dir=out_dir, data_root=data_root, progress=RichProgress(err))
    out.print(_result_table(result))
    detectors = detector_table(result)
    if detectors is not None:
        out.print(detectors)
    out.print(f"results in {out_dir / result.config_hash}")


class SweepProgress:
    """Points done of the total with an ETA: a progress bar on a terminal, a log line per point otherwise."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar: Progress | None = None
        self.task = TaskID(0)
        self.total = 0
        self.done = 0
        self.started = 0.0

    def start(self, to_run: int, total: int) -> None:  # noqa: D102
        self.total, self.done, self.started = to_run, 0, time.monotonic()
        if self.console.is_terminal and to_run:
            self.bar = Progress(
                TextColumn("sweep"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("", total=to_run)

    def point_done(self, point: Any) -> None:  # noqa: D102
        self.done += 1
        if self.bar is not None:
            self.bar.advance(self.task)
            if self.done == self.total:
                self.stop()
            return
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        logging.getLogger("vflbench").info(
            "sweep: point %d/%d done (%s), %.0f s elapsed, ETA %.0f s", self.done, self.total, point.hash, elapsed, eta
        )

    def stop(self) -> None:  # noqa: D102
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


@app.command()
def sweep(
    config: Annotated[Path, typer.Argument(help="experiment YAML with a `sweep` section")],
    out_dir: Annotated[Path, typer.Option("--out", help="sweep directory")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override, e.g. sweep.workers=2")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="skip runs whose result.json exists")] = False,
    workers: Annotated[int | None, typer.Option("--workers", help="parallel local processes")] = None,
    data_root: Annotated[Path | None, typer.Option("--data-root", help="datasets root")] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="with --resume: continue even though the sweep's definition changed since it started"
        ),
    ] = False,
    device: Annotated[str | None, typer.Option("--device", help="auto, cpu, cuda or cuda:N (train.device)")] = None,
) -> None:
    """Run every point of a sweep into OUT/runs/<config hash>/ and write summary.csv and scores.csv; every point is
    trained again unless --resume skips those whose result.json exists (only for the sweep OUT/sweep.yaml records:
    a changed definition is refused unless --force), and defended points share their undefended run."""
    from vflbench.experiment.config import check_components, read_config
    from vflbench.experiment.workers import start_sweep_workers

    set_ = with_device(set_, device)
    cfg = read_config(config, set_ or [])
    if workers is not None and workers < 1:
        raise VFLBenchError(f"--workers must be at least 1, got {workers}")
    if force and not resume:
        raise VFLBenchError("--force applies to --resume only (a sweep without --resume runs every point anyway)")
    check_out_dir(out_dir)
    # the workers' fork server first: its imports (torch, vflbench) run beside this process's below, not after them
    start_sweep_workers(cfg.sweep, workers)
    with collector_paused():
        from vflbench.experiment.sweep import run_sweep

        check_components(cfg)
    progress = SweepProgress(err)
    try:
        table = run_sweep(
            cfg,
            out_dir,
            resume=resume,
            workers=workers,
            data_root=str(data_root) if data_root else None,
            on_start=progress.start,
            on_done=progress.point_done,
            force=force,
        )
    except (Interrupted, KeyboardInterrupt):
        progress.stop()
        again = shlex.join(
            [
                "vflbench",
                "sweep",
                str(config),
                "--out",
                str(out_dir),
                "--resume",
                *(a for s in set_ or [] for a in ("--set", s)),
                *(["--workers", str(workers)] if workers else []),
                *(["--force"] if force else []),
            ]
        )
        err.print(
            f"sweep interrupted; finished points are summarised in {out_dir / 'summary.csv'}. Resume with: {again}",
            highlight=False,
            soft_wrap=True,
        )
        raise
    finally:
        progress.stop()
    out.print(
        f"{table['config_hash'].nunique() if not table.empty else 0} runs; "
        f"summary in {out_dir / 'summary.csv'}, scores in {out_dir / 'scores.csv'}"
    )


@app.command()
def report(directory: Annotated[Path, typer.Argument(help="a sweep or tune directory")]) -> None:
    """Write report.md and report.html with tables and plots for a sweep directory."""
    from vflbench.report import build_report

    check_out_dir(directory, "the directory", exists=True)
    out.print(f"wrote {build_report(directory)} and {directory / 'report.html'}")


@app.command()
def tune(
    config: Annotated[Path, typer.Argument(help="experiment YAML with one defense and its attacks")],
    budget: Annotated[float, typer.Option("--budget", help="privacy budget on the worst attack's ε_p (points)")],
    low: Annotated[float, typer.Option("--low", help="smallest strength to try")],
    high: Annotated[float, typer.Option("--high", help="largest strength to try")],
    out_dir: Annotated[Path, typer.Option("--out", help="tune directory")],
    steps: Annotated[int, typer.Option("--steps", help="number of strengths to try")] = 6,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override")] = None,
    data_root: Annotated[Path | None, typer.Option("--data-root", help="datasets root")] = None,
) -> None:
    """Find the strength of a defense with the best utility whose worst-case leakage meets a budget."""
    from vflbench.experiment.config import load_config
    from vflbench.experiment.tune import tune as run_tune

    cfg = load_config(config, set_ or [])
    check_out_dir(out_dir)
    result = run_tune(
        cfg, out_dir, budget=budget, low=low, high=high, steps=steps, data_root=str(data_root) if data_root else None
    )
    table = Table(
        "strength", "worst attack", "worst ε_p", "ε_u", "meets", title=f"tune {result.defense} (ε_p ≤ {budget})"
    )
    for t in result.trace:
        table.add_row(
            f"{t['strength']:g}",
            t.get("worst_attack", ""),
            f"{t['worst_leakage']:.2f}",
            f"{t['utility_loss']:.2f}",
            "yes" if t["meets"] else "no",
        )
    out.print(table)
    seeds = f"means over seeds {result.seeds}"
    out.print(
        f"chosen strength: {result.chosen['strength']:g} ({seeds})"
        if result.chosen
        else f"no strength met the budget ({seeds})"
    )


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="where to write the example configs")] = Path("configs"),
    force: Annotated[bool, typer.Option("--force", help="overwrite example files that already exist")] = False,
) -> None:
    """Write the quick-start example configs (embedded data, no files needed) into DIRECTORY."""
    from importlib.resources import files

    from vflbench.experiment.results import write_atomic

    examples = sorted(
        (p for p in (files("vflbench") / "examples").iterdir() if p.name.endswith(".yaml")), key=lambda p: p.name
    )
    if directory.exists() and not directory.is_dir():
        raise VFLBenchError(f"{directory} is a file; give a directory to write the example configs into")
    clash = [p.name for p in examples if (directory / p.name).exists()]
    if clash and not force:
        raise VFLBenchError(f"{directory} already has {', '.join(clash)}; use --force to overwrite them")
    directory.mkdir(parents=True, exist_ok=True)
    for p in examples:
        write_atomic(directory / p.name, p.read_text())
        out.print(f"wrote {directory / p.name}")
    out.print(f"next: vflbench run {directory / 'demo.yaml'} --out runs")


@app.command("list")
def list_(kind: Annotated[str, typer.Argument(help="datasets | models | attacks | defenses")]) -> None:
    """List the registered names of one kind of component."""
    if kind not in KINDS:
        raise VFLBenchError(f"unknown kind {kind!r}; valid kinds are: {', '.join(KINDS)}.")
    kinds = [kind, "top models"] if kind == "models" else [kind]
    for k in kinds:
        table = Table(title=k)
        table.add_column("name")
        table.add_column("summary")
        for entry in catalog.entries(k):
            table.add_row(entry["name"], entry["summary"])
        out.print(table)


#: Parameters the framework supplies (the data's shape, the root of the files), not the user.
SUPPLIED = {"root", "input_shape", "out_dim", "meta", "in_dim", "num_classes"}


def _describe_attacks_against(defense: dict[str, Any]) -> None:
    """The registered attacks on what ``defense`` protects, and the adaptive attacks and settings
    that exist for it (named by the defense; a name not registered in this build is still shown)."""
    protects = defense.get("protects", ())
    attacks = catalog.entries("attacks")
    against = [e["name"] for e in attacks if e["attributes"].get("target") in protects]
    registered = {e["name"] for e in attacks}
    adaptive = [
        a if a in registered else f"{a} (not registered in this build)" for a in defense.get("adaptive_attacks", ())
    ]
    adaptive += [
        f"the defense with {param}: {json.dumps(value)}" for param, value in defense.get("adaptive_settings", ())
    ]
    out.print(f"  attacks on what it protects: {', '.join(against) or '(none registered)'}")
    out.print(f"  adaptive attacks: {', '.join(adaptive) or '(none known)'}")


@app.command()
def describe(name: Annotated[str, typer.Argument(help="a dataset, model, attack or defense name")]) -> None:
    """Show what a component is: paper, threat model, what it reads, parameters with their defaults, allowed
    values and meanings."""
    found = False
    for kind in catalog.KINDS:
        for entry in catalog.entries(kind):
            if entry["name"] != name:
                continue
            found = True
            out.print(f"[bold]{name}[/bold] ({kind.rstrip('s')}): {entry['summary']}")
            attributes = entry["attributes"]
            facts = {
                **entry["info"],
                **{k: v for k, v in attributes.items() if v and not k.startswith("adaptive") and k != "search_space"},
            }
            for key, value in facts.items():
                if value in (None, (), [], "", {}):
                    continue
                if isinstance(value, dict):
                    value = ", ".join(f"{k} {v}" for k, v in value.items())
                elif isinstance(value, list):
                    value = ", ".join(map(str, value))
                out.print(f"  {key}: {value}")
            if kind == "attacks":
                grid = attributes.get("search_space") or {}
                shown = "; ".join(f"{k} " + ", ".join(values) for k, values in grid.items())
                out.print(f"  attacker search grid: {shown or 'none (default attacker only)'}")
            if kind == "defenses":
                _describe_attacks_against(attributes)
            params = [p for p in entry["parameters"] if p["name"] not in SUPPLIED]
            if params:
                table = Table("parameter", "default", "allowed values", "meaning", title="parameters")
                for p in params:
                    table.add_row(
                        p["name"], "required" if p["default"] is None else p["default"], p["allowed"], p["meaning"]
                    )
                out.print(table)
    if not found:
        raise VFLBenchError(f"unknown component {name!r}; valid names are: {', '.join(catalog.names())}.")


@datasets_app.command("verify")
def datasets_verify(
    data_root: Annotated[Path | None, typer.Option("--data-root", help="datasets root")] = None,
    names: Annotated[list[str] | None, typer.Argument(help="datasets to check (default: all)")] = None,
) -> None:
    """Check that dataset files are present and match their published checksums. Exit status 1 when a file is
    corrupt, or when a dataset named on the command line is missing."""
    from vflbench.data.files import resolve_root
    from vflbench.data.verify import verify_datasets

    statuses = verify_datasets(resolve_root(data_root), names or None, infos=catalog.infos("datasets"))
    table = Table("dataset", "status", "details")
    for s in statuses:
        style = {"ok": "green", "unverified": "yellow", "embedded": "cyan", "missing": "yellow", "corrupt": "red"}.get(
            s.status, ""
        )
        table.add_row(s.name, f"[{style}]{s.status}[/{style}]", s.message)
    out.print(table)
    failed = [f"{s.name} is {s.status}" for s in statuses if s.status == "corrupt" or (names and s.status == "missing")]
    if failed:
        err.print(f"[bold red]error:[/bold red] {', '.join(failed)} (details above)", highlight=False)
        raise typer.Exit(1)


@net_app.command("provision")
def net_provision(
    directory: Annotated[Path, typer.Argument(help="new directory for the CA and the parties' certificates")],
    parties: Annotated[str, typer.Option("--parties", help="party names, e.g. active,passive_1,dealer")],
    project: Annotated[str, typer.Option("--project", help="project name written into the certificates")] = "vflbench",
    days: Annotated[int, typer.Option("--days", help="validity of the certificates in days")] = 365,
) -> None:
    """Write a per-project CA and one certificate and key per party, for mutual TLS between parties."""
    try:
        from vflbench.net.provision import provision
    except ImportError as exc:
        raise VFLBenchError(
            f"`vflbench net` needs the net extra ({exc.name} is missing): pip install 'vflbench[net]'"
        ) from None
    names = [p.strip() for p in parties.split(",") if p.strip()]
    provision(directory, names, project=project, days=days)
    out.print(
        f"wrote the CA of project {project!r} to {directory / 'ca.pem'} (its key, ca-key.pem, stays with you) "
        f"and one directory per party: {', '.join(str(directory / n) for n in names)}; give each party only "
        "its own directory",
        soft_wrap=True,
    )


@party_app.command("run")
def party_run(
    config: Annotated[Path, typer.Argument(help="experiment YAML (the same file for every party)")],
    party: Annotated[str, typer.Option("--party", help="this process's party: active, passive_<k> or dealer")],
    address: Annotated[
        list[str],
        typer.Option(
            "--address",
            help="NAME=HOST:PORT of a listening party (the active party's own listening address on its side)",
        ),
    ],
    certs: Annotated[Path | None, typer.Option("--certs", help="this party's directory from `net provision`")] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="no TLS (loopback addresses only)")] = False,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override, e.g. train.epochs=5")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="where to write <party>.json and checkpoints")] = None,
    data_root: Annotated[Path | None, typer.Option("--data-root", help="datasets root")] = None,
    start_timeout: Annotated[float, typer.Option("--start-timeout", help="seconds to wait for the peers")] = 60.0,
    receive_timeout: Annotated[
        float, typer.Option("--receive-timeout", help="seconds a wait may go without progress")
    ] = 120.0,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue from the last epoch every party committed")
    ] = False,
    stop_after: Annotated[
        int | None,
        typer.Option("--stop-after", help="(active party) stop once this many epochs are committed, to resume later"),
    ] = None,
    shape: ShapeOption = None,
    bandwidth_mbit: BandwidthOption = None,
    latency_ms: LatencyOption = None,
    refuse_grants: Annotated[
        bool,
        typer.Option(
            "--refuse-grants",
            help="(passive party) refuse the evaluation-only "
            "queries of this party's bottom model that the "
            "run's plan grants the scorer",
        ),
    ] = False,
    device: Annotated[str | None, typer.Option("--device", help="auto, cpu, cuda or cuda:N (train.device)")] = None,
) -> None:
    """Run one party of an experiment (or VMask's dealer: --party dealer), talking to the others over mutual-TLS
    gRPC (VLR and VHNN, with defenses and attacks; each attack runs in its party's process; see docs/deployment.md)."""
    with collector_paused():
        try:
            from vflbench.experiment.party import check_party_config, party_names, party_policy, run_party
            from vflbench.net import Credentials, NetChannel, NetError, NetOptions
            from vflbench.net.linkmodel import shape_profile
        except ImportError as exc:
            raise VFLBenchError(
                f"`vflbench party` needs the net extra ({exc.name} is missing): pip install 'vflbench[net]'"
            ) from None
        from vflbench.experiment.config import load_config

        cfg = load_config(config, with_device(set_, device)).resolved()
    check_party_config(cfg)
    addresses = {}
    for item in address:
        name, sep, where = item.partition("=")
        if not sep or not where:
            raise VFLBenchError(f"--address takes NAME=HOST:PORT, got {item!r}")
        addresses[name.strip()] = where.strip()
    channel = NetChannel(
        name=party,
        run=cfg.hash(),
        parties=party_names(cfg),
        addresses=addresses,
        credentials=Credentials.load(certs) if certs is not None else None,
        insecure=insecure,
        policy=party_policy(cfg),
        options=NetOptions(
            start_timeout=start_timeout,
            receive_timeout=receive_timeout,
            shape=shape_profile(shape, bandwidth_mbit=bandwidth_mbit, latency_ms=latency_ms),
        ),
    )
    try:
        summary = run_party(
            cfg,
            party=party,
            channel=channel,
            out_dir=out_dir,
            data_root=data_root,
            resume=resume,
            stop_after=stop_after,
            refuse_grants=refuse_grants,
        )
    except NetError as exc:
        err.print(f"[bold red]error:[/bold red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(3) from None
    if "utility" in summary:
        out.print(f"{party}: test {summary['utility']['metric']} {summary['utility']['value']:.4f}")
    out.print(
        f"{party}: done; frames per link: "
        + ", ".join(
            f"{k} {v['frames_sent']} sent / {v['frames_received']} received" for k, v in summary["net"]["wire"].items()
        )
    )


@app.command()
def launch(
    config: Annotated[Path, typer.Argument(help="experiment YAML")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override, e.g. train.epochs=5")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="directory for run directories")] = Path("runs"),
    certs: Annotated[
        Path | None,
        typer.Option(
            "--certs", help="a `net provision` directory with one subdirectory per party (default: a temporary CA)"
        ),
    ] = None,
    insecure: Annotated[bool, typer.Option("--insecure-localhost", help="no TLS between the local processes")] = False,
    data_root: Annotated[Path | None, typer.Option("--data-root", help="datasets root")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="seconds for the whole run")] = None,
    receive_timeout: Annotated[
        float, typer.Option("--receive-timeout", help="seconds a party may wait without progress")
    ] = 120.0,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="continue from the last epoch every party committed (OUT/<hash>/checkpoints)"),
    ] = False,
    stop_after: Annotated[
        int | None,
        typer.Option("--stop-after", help="stop once this many epochs are committed, to continue later with --resume"),
    ] = None,
    shape: ShapeOption = None,
    bandwidth_mbit: BandwidthOption = None,
    latency_ms: LatencyOption = None,
    device: Annotated[str | None, typer.Option("--device", help="auto, cpu, cuda or cuda:N (train.device)")] = None,
) -> None:
    """Run every party (and VMask's dealer) as its own local process over loopback mutual-TLS gRPC; the active party
    writes OUT/<config hash>/result.json, as `vflbench run` does, and net.json (time per epoch, traffic, projection
    onto a LAN and a WAN)."""
    from vflbench.experiment.launch import launch as launch_run
    from vflbench.experiment.launch import party_context

    party_context()  # the party processes' fork server imports torch, vflbench and gRPC beside this process's imports
    with collector_paused():
        try:
            import vflbench.experiment.party  # noqa: F401  (the net extra)
        except ImportError as exc:
            raise VFLBenchError(
                f"`vflbench launch` needs the net extra ({exc.name} is missing): pip install 'vflbench[net]'"
            ) from None
        from vflbench.experiment.config import load_config
        from vflbench.experiment.results import RunResult

        cfg = load_config(config, with_device(set_, device))
    if certs is not None and insecure:
        raise VFLBenchError("give --certs or --insecure-localhost, not both")
    from vflbench.net.linkmodel import shape_profile

    done = launch_run(
        cfg,
        out_dir=out_dir,
        certs=certs,
        insecure=insecure,
        data_root=data_root,
        timeout=timeout,
        receive_timeout=receive_timeout,
        resume=resume,
        stop_after=stop_after,
        shape=shape_profile(shape, bandwidth_mbit=bandwidth_mbit, latency_ms=latency_ms),
    )
    if done.stopped_after is not None:
        out.print(f"stopped after {done.stopped_after} committed epochs in {done.run_dir}; continue with --resume")
        return
    out.print(_result_table(RunResult.from_dict(done.result)))
    out.print(_net_table(done.net))
    out.print(f"results in {done.run_dir} (party logs in {done.run_dir / 'logs'})")


def _net_table(net: dict[str, Any]) -> Table:
    table = Table(title="time per epoch (s, lower is better) and traffic")
    table.add_column("epoch")
    table.add_column("measured (loopback)")
    for name in net["projected"]:
        table.add_column(f"projected: {name}")
    table.add_column("frames")
    table.add_column("MB on the wire")
    for e, seconds in enumerate(net["epoch_seconds"]):
        frames, nbytes = net["wire_per_epoch"]["frames"], net["wire_per_epoch"]["bytes"]
        table.add_row(
            str(e),
            f"{seconds:.3f}",
            *(f"{p['epoch_seconds'][e]:.3f}" for p in net["projected"].values()),
            str(frames[e]) if e < len(frames) else "",
            f"{nbytes[e] / 1e6:.3f}" if e < len(nbytes) else "",
        )
    return table


class Interrupted(BaseException):
    """A termination signal (SIGINT, SIGTERM) received by the command line; exit status 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame: Any) -> None:
    # A second signal of the same kind ends the process at once (the default action).
    signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    raise Interrupted(signum)


def _out_of_memory(exc: BaseException) -> str:
    """A one-line message when ``exc`` is a failed memory allocation (Python's, or torch's allocator's), else ``""``."""
    text = str(exc)
    if not (isinstance(exc, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower()):
        return ""
    asked = re.search(r"tried to allocate (\d+) bytes", text)
    size = f" ({int(asked.group(1)) / 1e9:,.1f} GB asked for)" if asked else ""
    return (
        f"out of memory{size}; make the model smaller (model.embed_dim, the models' widths), the batches "
        "(train.batch_size) or the data (data.train_size)"
    )


def main() -> None:
    """Console-script entry point: user errors print one paragraph and exit with status 2;
    SIGINT and SIGTERM exit with 130 and 143 after the command has stopped cleanly."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=err, show_path=False, show_time=False)]
        if err.is_terminal
        else [logging.StreamHandler(sys.stderr)],
    )
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    # at exit, the collector's last passes over torch's objects take 0.5-1 s; frozen, they are skipped (the
    # objects are freed with the process all the same)
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    try:
        code = app(standalone_mode=False)
    except VFLBenchError as exc:
        err.print(f"[bold red]error:[/bold red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except OSError as exc:  # the environment refused (a full disk, a file removed under us): not a bug
        where = f" ({exc.filename})" if exc.filename else ""
        err.print(f"[bold red]error:[/bold red] {exc.strerror or exc}{where}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (MemoryError, RuntimeError) as exc:
        if not _out_of_memory(exc):
            raise
        err.print(f"[bold red]error:[/bold red] {_out_of_memory(exc)}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except Interrupted as exc:
        err.print(f"interrupted ({exc})", highlight=False)
        sys.exit(128 + exc.signum)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except (typer.Exit, SystemExit) as exc:
        code = getattr(exc, "exit_code", getattr(exc, "code", 0))
        sys.exit(code)
    except Exception as exc:
        # Usage errors from typer (and click, which older typer versions build on) know how to
        # show themselves; anything else is a bug and keeps its traceback.
        exit_code = getattr(exc, "exit_code", None)
        show = getattr(exc, "show", None)
        if callable(show) and isinstance(exit_code, int):
            show()
            sys.exit(exit_code)
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    # Without standalone mode typer returns a command's exit status (typer.Exit, or 130 for a
    # KeyboardInterrupt it caught) instead of exiting with it.
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
