"""The import graph runs one way down the layers (issue 18): a module may import only from its own
layer or the layers below it. Lazy imports inside functions count too: they are dependencies all the same.

    base (errors, rng, registry, devices) < data, metrics < models < protocol < mpc, he, net < defenses, attacks
    < experiment < report < api, cli, catalog
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "vflbench"
LAYERS: dict[str, int] = {
    "errors": 0, "rng": 0, "registry": 0, "_version": 0, "devices": 0,
    "data": 1, "metrics": 1,
    "models": 2,
    "protocol": 3,
    "mpc": 4, "he": 4, "net": 4,
    "defenses": 5, "attacks": 5,
    "experiment": 6,
    "report": 7,
    "api": 8, "cli": 8, "catalog": 8, "__init__": 8, "examples": 8,
}


def _component(module: str) -> str:
    """``vflbench.experiment.run`` -> ``experiment``; ``vflbench`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vflbench") and not node.level:
            if node.module == "vflbench":  # a submodule, or a name of the package itself (the top layer)
                out += [(node.lineno, f"vflbench.{a.name}" if (SRC / a.name).exists() or (SRC / f"{a.name}.py").exists()
                         else "vflbench") for a in node.names]
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
                bad.append(f"{rel}:{line} ({own}, layer {LAYERS[own]}) imports {module} "
                           f"({other}, layer {LAYERS[other]})")
    return bad


def test_no_module_imports_from_a_higher_layer():
    assert _upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: an attack importing the experiment layer is reported."""
    fake = tmp_path / "vflbench"
    (fake / "attacks").mkdir(parents=True)
    (fake / "attacks" / "bad.py").write_text("def f():\n    from vflbench.experiment.run import train_run\n")
    monkeypatch.setattr(__import__(__name__), "SRC", fake)
    assert _upward_imports() == ["attacks/bad.py:2 (attacks, layer 5) imports vflbench.experiment.run "
                                 "(experiment, layer 6)"]
