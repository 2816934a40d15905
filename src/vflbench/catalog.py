"""The catalog: every registered component's metadata, readable without importing torch.

``vflbench list``, ``describe`` and ``datasets verify`` need only what the registries know about each
component (name, summary, paper, threat model, what it reads, parameters with defaults,
annotations, meanings and allowed values, a dataset's files and checksums), not the components themselves. Importing the
registries imports torch and every model, attack and defense (about 2 s of CPU), so that metadata is
kept in a generated, checked-in table, ``catalog.json`` beside this module, which :func:`load` reads
with the standard library alone.

:func:`build` makes the table from the live registries (it imports them); ``python -m
vflbench.catalog`` writes it, and ``tests/test_catalog.py`` fails when the checked-in table differs
from what :func:`build` returns, so it cannot drift from the code.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Mapping
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

#: Kinds of component, in the order ``describe`` searches them (``models`` are bottom models).
KINDS = ("datasets", "models", "top models", "attacks", "defenses")
#: Class attributes of attacks and defenses that describe them (the threat model and its parts).
ATTRIBUTES = (
    "paper",
    "threat",
    "target",
    "reads",
    "phase",
    "requirements",
    "side",
    "strength_param",
    "strength_direction",
    "protects",
    "adaptive_attacks",
    "adaptive_settings",
    "search_space",
)
FILE = "catalog.json"
FORMAT = 2


def _jsonable(value: Any) -> Any:
    """``value`` as JSON has it (tuples become lists), so that a built table equals a loaded one."""
    return json.loads(json.dumps(value))


def _parameters(entry: Any) -> list[dict[str, Any]]:
    """The named parameters of a registry entry's factory: name, default (its ``repr``; ``None`` when
    required), annotation (as written in the source; ``None`` when there is none), and, from the
    entry's constraints (:class:`~vflbench.registry.Param`), what it means and the values it takes."""
    from vflbench.registry import Param, allowed, annotations_of

    hints = annotations_of(entry.factory)
    params = []
    for p in inspect.signature(entry.factory).parameters.values():
        if p.name == "self" or p.kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
            continue
        annotation = p.annotation
        constraint = entry.constraints.get(p.name, Param())
        params.append(
            {
                "name": p.name,
                "default": None if p.default is inspect.Parameter.empty else repr(p.default),
                "annotation": None
                if annotation is inspect.Parameter.empty
                else annotation
                if isinstance(annotation, str)
                else inspect.formatannotation(annotation),
                "allowed": allowed(hints.get(p.name, Any), constraint),
                "meaning": constraint.meaning,
            }
        )
    return params


def describe_entries(entries: Iterable[Any]) -> list[dict[str, Any]]:
    """The metadata of registry entries (:class:`~vflbench.registry.Entry`), in registration order."""
    rows = []
    for entry in entries:
        attributes = {a: getattr(entry.factory, a) for a in ATTRIBUTES if getattr(entry.factory, a, None) is not None}
        if "search_space" in attributes:  # its values may be objects (a factor of the configured value): as shown
            attributes["search_space"] = {
                k: [f"{v:g}" if isinstance(v, float) else str(v) for v in values]
                for k, values in attributes["search_space"].items()
            }
        rows.append(
            {
                "name": entry.name,
                "summary": entry.summary,
                "info": _jsonable(entry.info),
                "attributes": _jsonable(attributes),
                "parameters": _parameters(entry),
            }
        )
    return rows


def build() -> dict[str, Any]:
    """The catalog of the live registries (imports torch and every component)."""
    from vflbench.attacks import ATTACKS
    from vflbench.data import DATASETS
    from vflbench.defenses import DEFENSES
    from vflbench.models import MODELS, TOP_MODELS

    registries: dict[str, Iterable[Any]] = {
        "datasets": DATASETS,
        "models": MODELS,
        "top models": TOP_MODELS,
        "attacks": ATTACKS,
        "defenses": DEFENSES,
    }
    return {"format": FORMAT, "kinds": {kind: describe_entries(registries[kind]) for kind in KINDS}}


@cache
def load() -> dict[str, list[dict[str, Any]]]:
    """Kind -> the metadata of each registered component, from the checked-in table (no torch)."""
    table = json.loads((files("vflbench") / FILE).read_text(encoding="utf-8"))
    return dict(table["kinds"])


def entries(kind: str) -> list[dict[str, Any]]:
    """The metadata of every component of ``kind`` (one of :data:`KINDS`)."""
    return load()[kind]


def names(kinds: Iterable[str] = KINDS) -> list[str]:
    """Every registered name of the ``kinds``, sorted, without repeats."""
    return sorted({e["name"] for kind in kinds for e in entries(kind)})


def infos(kind: str) -> Mapping[str, dict[str, Any]]:
    """Name -> the registry ``info`` of each component of ``kind`` (a dataset's files, checksums, source)."""
    return {e["name"]: e["info"] for e in entries(kind)}


def write(path: Path | None = None) -> Path:
    """Write the catalog of the live registries to ``path`` (default: the package's ``catalog.json``)."""
    from vflbench.experiment.results import write_atomic

    target = path or Path(__file__).with_name(FILE)
    write_atomic(target, json.dumps(build(), indent=1, ensure_ascii=False) + "\n")
    return target


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger(__name__).info("wrote %s", write())
