"""The catalog (the registries' metadata, read without torch) matches the live registries, and the commands that
only read it (--help, --version, list, describe, init, datasets verify) import neither torch nor scipy."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest

from vflbench import catalog
from vflbench._version import __version__
from vflbench.attacks import ATTACKS
from vflbench.data import DATASETS, verify_datasets
from vflbench.defenses import DEFENSES
from vflbench.models import MODELS, TOP_MODELS

STALE = "vflbench/catalog.json is stale: regenerate it with `python -m vflbench.catalog` and commit it"


def test_the_checked_in_catalog_is_the_live_registries():
    checked_in = json.loads((files("vflbench") / catalog.FILE).read_text(encoding="utf-8"))
    assert checked_in == json.loads(json.dumps(catalog.build())), STALE


def test_the_catalog_holds_every_component_with_its_parameters_and_threat_model():
    live = {"datasets": DATASETS, "models": MODELS, "top models": TOP_MODELS, "attacks": ATTACKS, "defenses": DEFENSES}
    for kind, registry in live.items():
        assert [e["name"] for e in catalog.entries(kind)] == registry.names()
    [vmask] = [e for e in catalog.entries("defenses") if e["name"] == "vmask"]
    budget = next(p for p in vmask["parameters"] if p["name"] == "budget")
    assert budget == {
        "name": "budget",
        "default": "0.25",
        "annotation": "float",
        "allowed": "a finite number",
        "meaning": DEFENSES.get("vmask").constraints["budget"].meaning,
    }
    sigma = next(p for p in vmask["parameters"] if p["name"] == "sigma")
    assert sigma["allowed"] == "a finite number >= 0" and sigma["meaning"].startswith("standard deviation")
    assert vmask["attributes"]["paper"] == DEFENSES.get("vmask").factory.paper
    assert vmask["attributes"]["threat"].startswith("honest-but-curious")
    [mnist] = [e for e in catalog.entries("datasets") if e["name"] == "mnist"]
    assert mnist["info"]["files"] == list(DATASETS.get("mnist").info["files"])


def test_a_drifted_entry_is_seen():
    """What the comparison above relies on: a changed default or summary changes the built entry."""
    entry = DATASETS.get("digits")
    [built] = catalog.describe_entries([entry])
    [renamed] = catalog.describe_entries([type(entry)(entry.name, entry.factory, entry.summary + "!", entry.info)])
    assert built == next(e for e in catalog.entries("datasets") if e["name"] == "digits")
    assert renamed != built


def test_verify_from_the_catalog_equals_verify_from_the_registry(tmp_path: Path):
    assert verify_datasets(tmp_path, infos=catalog.infos("datasets")) == verify_datasets(tmp_path)


COMMANDS = [
    ["--help"],
    ["--version"],
    ["list", "models"],
    ["list", "defenses"],
    ["describe", "vmask"],
    ["describe", "mnist"],
    ["datasets", "verify"],
    ["datasets", "verify", "digits"],
    ["init", "{tmp}"],
    ["datasets", "--help"],
]
#: What takes seconds to import and none of these commands needs (torch alone is 1-4 s of CPU).
HEAVY = ("torch", "scipy", "sklearn", "pandas")
PROBE = f"""
import runpy, sys
HEAVY = {HEAVY!r}
sys.argv = ["vflbench", *sys.argv[1:]]
try:
    runpy.run_module("vflbench.cli", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print("exit", code, "heavy:", *sorted(m for m in HEAVY if m in sys.modules), file=sys.stderr)
"""


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_commands_that_read_metadata_import_neither_torch_nor_scipy(tmp_path, args):
    args = [a.format(tmp=tmp_path / "configs") for a in args]
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60)
    assert proc.stderr.splitlines()[-1] == "exit 0 heavy:", proc.stderr
    if args == ["--version"]:
        assert proc.stdout.strip() == f"vflbench {__version__}"


def test_the_probe_sees_torch_where_a_command_imports_it(tmp_path):
    """The probe above can fail: `vflbench run` imports torch."""
    config = tmp_path / "bad.yaml"
    config.write_text("data: {name: digits}\ntrain: {epochs: 0}\n")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "run", str(config), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "torch" in proc.stderr.splitlines()[-1].split(), proc.stderr
