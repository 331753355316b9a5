"""The packages' layering, read from the source with ``ast``: every import of every module (top level,
inside functions, under TYPE_CHECKING, relative, and ``importlib.import_module("...")`` with a literal
name) counts, so an import made lazy to dodge a loop is caught like any other.

One stated order, bottom first: each package may import only those before it in ``LAYERS``. Every rule
below is derived from it: the forbidden imports of each package, and that the graph of imports between
packages, and between the parts (subpackages and modules) of any one package, has no cycle.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS: tuple[str, ...] = (
    "ccrk_settings",
    "store",
    "synthetic",
    "model",
    "indexer",
    "monitoring",
    "service",
    "ccrk_cli",
)
UNLAYERED: tuple[str, ...] = ("tests", "bench")  # may import anything; no layer may import them

# A package may import itself and what is below it: everything above it, and the unlayered, is forbidden.
FORBIDDEN: dict[str, frozenset[str]] = {
    package: frozenset(LAYERS[i + 1 :]) | frozenset(UNLAYERED) for i, package in enumerate(LAYERS)
}

Graph = dict[str, set[str]]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def parsed(source: str, attempts: int = 5) -> ast.Module:
    """``ast.parse``, tried again on CPython 3.11's spurious "AST constructor recursion depth mismatch".

    That SystemError comes from the interpreter, not from the source: 3.11 keeps the AST constructor's
    depth count in state shared by every thread, so a parse in another thread of the test process (an
    import that pytest's assertion rewriting parses, say) can unbalance it (cpython gh-106905). The same
    source then parses on the next try; a real error in the source is a SyntaxError and is not retried.
    """
    for attempt in range(attempts):
        try:
            return ast.parse(source)
        except SystemError as error:
            if "recursion depth mismatch" not in str(error) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def imported_modules(source: str, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in one module's source, wherever it stands."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(parsed(source)):  # every node, not only the module's body
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            yield node.lineno, name
            for alias in node.names:  # `from . import service_thing` names a submodule
                yield node.lineno, f"{name}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


@cache
def package_imports(root: Path, package: str) -> tuple[tuple[Path, str, int, str], ...]:
    """(path, module, line, imported name) of every import in a top-level package's modules."""
    found = []
    for path in sorted((root / package).rglob("*.py")):
        module = module_name(path, root)
        source = path.read_text(encoding="utf-8")
        for line, name in imported_modules(source, module, path.stem == "__init__"):
            found.append((path, module, line, name))
    return tuple(found)


def violations(root: Path, package: str, forbidden: frozenset[str]) -> list[str]:
    found = []
    for path, module, line, name in package_imports(root, package):
        if name.split(".")[0] in forbidden:
            found.append(f"{path.relative_to(root)}:{line}: {module} imports {name}")
    return sorted(set(found))


def package_graph(root: Path, packages: tuple[str, ...]) -> Graph:
    """Which of ``packages`` each one imports (itself left out)."""
    graph: Graph = {p: set() for p in packages}
    for package in packages:
        for _, _, _, name in package_imports(root, package):
            top = name.split(".")[0]
            if top in graph and top != package:
                graph[package].add(top)
    return graph


def parts_graph(root: Path, package: str) -> Graph:
    """Between the direct parts (subpackages and modules) of a package at any depth, e.g. ``model``'s
    ``runtime`` and ``starter``: which part's modules import which other part."""
    top, prefix = package.split(".")[0], package + "."
    parts = {
        p.stem if p.is_file() else p.name
        for p in (root / package.replace(".", "/")).iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    graph: Graph = {part: set() for part in parts}
    for _, module, _, name in package_imports(root, top):
        if not (module.startswith(prefix) and name.startswith(prefix)):
            continue  # the package's own __init__, or an import from outside it
        src, dst = module[len(prefix) :].split(".")[0], name[len(prefix) :].split(".")[0]
        if src != dst and dst in graph:  # `from model import NAME` of the __init__'s own names is no part
            graph[src].add(dst)
    return graph


def cycle(graph: Graph) -> list[str] | None:
    """One import loop (first name repeated last), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def subpackages(root: Path) -> list[str]:
    """Every package of the layers, at any depth, as a dotted name."""
    return sorted(
        module_name(init, root) for layer in LAYERS for init in sorted((root / layer).rglob("__init__.py"))
    )


@pytest.mark.parametrize("package", LAYERS)
def test_package_imports_follow_the_layers(package: str) -> None:
    modules = list((REPO / package).rglob("*.py"))
    assert modules, f"no modules under {package}/"
    assert violations(REPO, package, FORBIDDEN[package]) == []


def test_no_import_cycle_between_packages() -> None:
    assert cycle(package_graph(REPO, LAYERS)) is None


@pytest.mark.parametrize("package", subpackages(REPO))
def test_no_import_cycle_between_the_parts_of_a_package(package: str) -> None:
    assert cycle(parts_graph(REPO, package)) is None


def test_every_package_has_a_layer() -> None:
    """A new top-level package must be placed in the layers (or be deliberately unlayered, like tests)."""
    shipped = {
        p.name
        for p in REPO.iterdir()
        if p.is_dir() and (p / "__init__.py").is_file() and p.name not in UNLAYERED
    }
    assert shipped == set(LAYERS)
    assert "model.runtime" in subpackages(REPO) and "model.starter" in subpackages(REPO)


def test_the_checker_finds_each_kind_of_import(tmp_path: Path) -> None:
    """The checker itself: a package breaking the rule in every way an import can be written."""
    pkg = tmp_path / "monitoring"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import sub\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text(
        "from __future__ import annotations\n"
        "import json\n"
        "from typing import TYPE_CHECKING\n"
        "import service.app\n"  # 4
        "from service import runtime\n"  # 5
        "if TYPE_CHECKING:\n"
        "    from service.searching import Searcher\n"  # 7
        "def f() -> None:\n"
        "    from ccrk_cli.main import app\n"  # 9
        "    importlib.import_module('service.cli')\n"  # 10
        "from .. import consistency\n"  # 11: monitoring.consistency, allowed
        "from ...service import errors\n"  # 12: relative beyond monitoring -> top-level service
        "class C:\n"
        "    def m(self) -> None:\n"
        "        import tests.conftest\n"  # 15: the unlayered tests, in a method
    )
    found = violations(tmp_path, "monitoring", FORBIDDEN["monitoring"])
    lines = sorted({int(v.split(":")[1]) for v in found})
    assert lines == [4, 5, 7, 9, 10, 12, 15], found
    assert violations(tmp_path, "monitoring", frozenset({"indexer"})) == []


def test_the_rules_follow_the_one_order() -> None:
    """Upward is forbidden, downward allowed, for every pair of layers."""
    for i, low in enumerate(LAYERS):
        for high in LAYERS[i + 1 :]:
            assert high in FORBIDDEN[low] and low not in FORBIDDEN[high], (low, high)


def test_a_lazy_loop_is_found(tmp_path: Path) -> None:
    """The loop this file was written against: the builder importing monitoring's gate inside a function,
    monitoring importing the builder's gate types; and one between two parts of model, made the same way."""
    files = {
        "indexer/__init__.py": "",
        "indexer/quality_gate.py": "",
        "indexer/build.py": "def _quality_gate() -> None:\n    from monitoring.gate import quality_gate\n",
        "monitoring/__init__.py": "",
        "monitoring/gate.py": "from indexer.quality_gate import GateVerdict\n",
        "model/__init__.py": "from model.runtime import Encoder\n",  # the package's own names: no loop
        "model/runtime/__init__.py": "from .base import Encoder\n",
        "model/runtime/base.py": "def load() -> None:\n    from model.starter import build\n",
        "model/starter/__init__.py": "",
        "model/starter/build.py": "from ..runtime import base\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert violations(tmp_path, "indexer", FORBIDDEN["indexer"]) == [
        "indexer/build.py:2: indexer.build imports monitoring.gate",
        "indexer/build.py:2: indexer.build imports monitoring.gate.quality_gate",
    ]
    assert violations(tmp_path, "monitoring", FORBIDDEN["monitoring"]) == []
    assert set(cycle(package_graph(tmp_path, ("model", "indexer", "monitoring"))) or []) == {
        "indexer",
        "monitoring",
    }
    assert set(cycle(parts_graph(tmp_path, "model")) or []) == {"runtime", "starter"}
    assert cycle(parts_graph(tmp_path, "model.runtime")) is None
    (tmp_path / "model/runtime/base.py").write_text("")  # the loop broken: none found
    package_imports.cache_clear()
    assert cycle(parts_graph(tmp_path, "model")) is None
