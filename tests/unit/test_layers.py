"""The layers of the package read top to bottom: what the app builds on never imports the
app back, not even for types (it names a small protocol of what it uses instead)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "durq"
SOURCES = sorted(PACKAGE.rglob("*.py"))

#: The modules above the app, which hand it to users or drive it: the package's face, the
#: command line, the benchmark runner, the web and framework adapters.
ABOVE_THE_APP = ("__init__.py", "app.py", "cli/", "bench/", "contrib/", "web/")


def rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at run time or for types only."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_sources_found() -> None:
    assert len(SOURCES) > 30


@pytest.mark.parametrize(
    "path", [p for p in SOURCES if not rel(p).startswith(ABOVE_THE_APP)], ids=rel
)
def test_no_import_of_the_app_from_below(path: Path) -> None:
    assert "durq.app" not in imported_modules(path), (
        f"{rel(path)} imports durq.app: take a protocol of what it uses (durq.appview)"
    )


def private_imports(path: Path) -> list[str]:
    """``from durq.x import _name`` where ``durq.x`` lies in another package than ``path``."""
    package = ".".join(("durq", *path.relative_to(PACKAGE).parent.parts))
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
            continue
        if not node.module.startswith("durq"):
            continue
        home = node.module if (PACKAGE.parent / node.module.replace(".", "/")).is_dir() else ""
        home = home or node.module.rpartition(".")[0]
        if home == package:
            continue
        found += [
            f"{node.module}.{alias.name}"
            for alias in node.names
            if alias.name.startswith("_") and not alias.name.startswith("__")
        ]
    return found


@pytest.mark.parametrize("path", SOURCES, ids=rel)
def test_no_private_name_imported_from_another_package(path: Path) -> None:
    assert not private_imports(path), f"{rel(path)}: {private_imports(path)}"
