"""The house's one-way dependencies, checked on every import statement (lazy ones inside functions included):
``spec -> catalog -> cost -> sim -> calibrate/search -> export/runtime/report -> cli``, each package importing only
from lower layers (and itself), and only ``runtime/`` importing torch."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "meshplan"
LAYERS = {"errors": 0, "spec": 1, "catalog": 2, "cost": 3, "sim": 4, "calibrate": 5, "search": 5, "export": 6,
          "runtime": 6, "report": 6, "cli": 7}
"""Layer of each top-level package; a package may import a strictly lower layer or itself."""


def _imports(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every import in a file, relative imports resolved against its package."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "meshplan":
                out += [(f"meshplan.{a.name}", node.lineno) for a in node.names]
            else:
                out.append((node.module, node.lineno))
    return out


def _package(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 else rel.stem


def test_every_package_has_a_layer():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages - {"catalog", "data"} <= set(LAYERS), packages - set(LAYERS)


def test_imports_point_down_the_layers():
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        here = _package(path)
        if here not in LAYERS:
            continue
        for module, line in _imports(path):
            parts = module.split(".")
            if parts[0] != "meshplan" or len(parts) < 2 or parts[1] == here or parts[1] not in LAYERS:
                continue
            if LAYERS[parts[1]] >= LAYERS[here]:
                wrong.append(f"{path.relative_to(SRC)}:{line} ({here}) imports {module}")
    assert not wrong, "\n".join(wrong)


def test_only_the_runtime_imports_torch():
    found = [f"{p.relative_to(SRC)}:{line}" for p in sorted(SRC.rglob("*.py")) if _package(p) != "runtime"
             for module, line in _imports(p) if module.split(".")[0] == "torch"]
    assert not found, found
