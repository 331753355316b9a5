"""The packages' layering, read from the source with ``ast``: every import of every module (top level,
inside functions, under TYPE_CHECKING, relative, and ``importlib.import_module("...")`` with a literal
name) is checked against what its package may not import.

    ccrk_settings <- model <- indexer <- monitoring <- service <- ccrk_cli

(each may use what is to its left; ``ccrk_settings`` uses none of them).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("ccrk_settings", "model", "indexer", "monitoring", "service", "ccrk_cli")
FORBIDDEN: dict[str, frozenset[str]] = {
    "ccrk_settings": frozenset({"model", "indexer", "monitoring", "service", "ccrk_cli"}),
    "model": frozenset({"indexer", "service", "monitoring", "ccrk_cli"}),
    "indexer": frozenset({"service", "ccrk_cli"}),
    "monitoring": frozenset({"service", "ccrk_cli"}),
    "service": frozenset({"ccrk_cli"}),
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in one module's source."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
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


def violations(root: Path, package: str, forbidden: frozenset[str]) -> list[str]:
    found = []
    for path in sorted((root / package).rglob("*.py")):
        module = module_name(path, root)
        for line, name in imported_modules(path.read_text(encoding="utf-8"), module, path.stem == "__init__"):
            top = name.split(".")[0]
            if top in forbidden:
                found.append(f"{path.relative_to(root)}:{line}: {module} imports {name}")
    return sorted(set(found))


@pytest.mark.parametrize("package", list(FORBIDDEN))
def test_package_imports_follow_the_layers(package: str) -> None:
    modules = list((REPO / package).rglob("*.py"))
    assert modules, f"no modules under {package}/"
    assert violations(REPO, package, FORBIDDEN[package]) == []


def test_every_package_has_a_rule() -> None:
    """A new top-level package must be placed in the layers (or deliberately be the top, ccrk_cli)."""
    shipped = {
        p.name for p in REPO.iterdir() if p.is_dir() and (p / "__init__.py").is_file() and p.name != "tests"
    }
    assert shipped == set(PACKAGES)
    assert set(FORBIDDEN) == set(PACKAGES) - {"ccrk_cli"}


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
    )
    found = violations(tmp_path, "monitoring", FORBIDDEN["monitoring"])
    lines = sorted({int(v.split(":")[1]) for v in found})
    assert lines == [4, 5, 7, 9, 10, 12], found
    assert violations(tmp_path, "monitoring", frozenset({"indexer"})) == []
