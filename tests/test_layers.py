"""The import graph runs one way down the layers (issue 18): a module may import only from its own
layer or the layers below it. Lazy imports inside functions count too: they are dependencies all the same.

    base (errors, rng, registry, devices) < data, metrics < models < protocol < mpc, he, net < defenses, attacks
    < experiment < report < api, cli, catalog

Within a package, the modules import each other without a circle (issue 29): type-only imports under
``TYPE_CHECKING`` count, since a circle among types is the same knot one refactor away from an import error. A
package's ``__init__`` is its facade (re-exports, and the registry its plug-in modules register with) and stands
apart from the check.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "vflbench"
LAYERS: dict[str, int] = {
    "errors": 0,
    "rng": 0,
    "registry": 0,
    "_version": 0,
    "devices": 0,
    "data": 1,
    "metrics": 1,
    "models": 2,
    "protocol": 3,
    "mpc": 4,
    "he": 4,
    "net": 4,
    "defenses": 5,
    "attacks": 5,
    "experiment": 6,
    "report": 7,
    "api": 8,
    "cli": 8,
    "catalog": 8,
    "__init__": 8,
    "examples": 8,
}


def _component(module: str) -> str:
    """``vflbench.experiment.run`` -> ``experiment``; ``vflbench`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module(path: Path, src: Path) -> str:
    """``src/vflbench/experiment/run.py`` -> ``vflbench.experiment.run`` (a package's ``__init__`` -> the package)."""
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vflbench") and not node.level:
            if node.module == "vflbench":  # a submodule, or a name of the package itself (the top layer)
                out += [
                    (
                        node.lineno,
                        f"vflbench.{a.name}"
                        if (SRC / a.name).exists() or (SRC / f"{a.name}.py").exists()
                        else "vflbench",
                    )
                    for a in node.names
                ]
            else:
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("vflbench")]
    return out


def _upward_imports() -> list[str]:
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        own = rel.parts[0].removesuffix(".py")
        assert own in LAYERS, f"{rel}: package {own!r} has no layer; add it to LAYERS"
        for line, module in _imports(path):
            other = _component(module)
            assert other in LAYERS, f"{rel}:{line} imports {module}, whose package has no layer"
            if LAYERS[other] > LAYERS[own]:
                bad.append(
                    f"{rel}:{line} ({own}, layer {LAYERS[own]}) imports {module} ({other}, layer {LAYERS[other]})"
                )
    return bad


def _circles() -> list[list[str]]:
    """The import circles between modules of one package (each circle's modules, sorted), facades left out."""
    modules = {_module(p, SRC): p for p in SRC.rglob("*.py") if p.name != "__init__.py"}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.rsplit(".", 1)[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                }
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
        graph[name] = {m for m in imported if m in modules and m != name and m.rsplit(".", 1)[0] == package}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_module_imports_from_a_higher_layer():
    assert _upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: an attack importing the experiment layer is reported."""
    fake = tmp_path / "vflbench"
    (fake / "attacks").mkdir(parents=True)
    (fake / "attacks" / "bad.py").write_text("def f():\n    from vflbench.experiment.run import train_run\n")
    monkeypatch.setattr(__import__(__name__), "SRC", fake)
    assert _upward_imports() == [
        "attacks/bad.py:2 (attacks, layer 5) imports vflbench.experiment.run (experiment, layer 6)"
    ]


def test_no_import_circle_between_modules_of_one_package():
    assert _circles() == []


def test_the_check_sees_a_type_only_circle(tmp_path, monkeypatch):
    """The checker itself: two modules of one package that import each other, one of them for types only."""
    fake = tmp_path / "vflbench"
    (fake / "experiment").mkdir(parents=True)
    (fake / "experiment" / "__init__.py").write_text("")
    (fake / "experiment" / "run.py").write_text("from vflbench.experiment.scoring import run_attacks\n")
    (fake / "experiment" / "scoring.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vflbench.experiment import run\n"
    )
    (fake / "experiment" / "plan.py").write_text("from vflbench.experiment.scoring import run_attacks\n")
    monkeypatch.setattr(__import__(__name__), "SRC", fake)
    assert _circles() == [["vflbench.experiment.run", "vflbench.experiment.scoring"]]
