"""docs/configuration.md lists every environment variable durq reads, with the flag it backs
and that flag's default, and nothing durq does not read."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from durq.cli import app as cli_app

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
ENV_NAME = re.compile(r"^(DURQ|INSURANCE)_[A-Z0-9_]+$")
ROW = re.compile(r"^\|\s*`([A-Z][A-Z0-9_]+)`\s*\|(.*)$")


def python_files(*bases: str) -> Iterator[Path]:
    for base in bases:
        for path in sorted((ROOT / base).rglob("*.py")):
            if not any(p.endswith(".egg-info") for p in path.parts):
                yield path


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def variables_read(*bases: str) -> set[str]:
    """Names passed to ``os.environ``/``os.getenv``/``envvar=``, and every string constant
    that is a whole ``DURQ_*`` name (a module constant read later)."""
    found: set[str] = set()
    for path in python_files(*bases):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[ast.AST] = []
            if isinstance(node, ast.Call):
                func = node.func
                reads = isinstance(func, ast.Attribute) and (
                    (func.attr == "get" and _is_environ(func.value)) or func.attr == "getenv"
                )
                if reads and node.args:
                    names.append(node.args[0])
                names += [kw.value for kw in node.keywords if kw.arg == "envvar"]
            elif isinstance(node, ast.Subscript) and _is_environ(node.value):
                names.append(node.slice)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if ENV_NAME.match(node.value) and node.value.startswith("DURQ_"):
                    names.append(node)
            found |= {
                n.value for n in names if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
    return found


@pytest.fixture(scope="module")
def rows() -> dict[str, list[str]]:
    """Variable -> the other cells of its table row, for every table of the page."""
    table: dict[str, list[str]] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            table[match.group(1)] = [cell.strip() for cell in match.group(2).split("|")]
    return table


def env_options() -> Iterator[tuple[str, Any]]:
    """(command path, click option) for every CLI option that an environment variable backs."""

    def walk(command: Any, path: str) -> Iterator[tuple[str, Any]]:
        for name, sub in (getattr(command, "commands", None) or {}).items():
            yield from walk(sub, f"{path} {name}")
        for param in command.params:
            if getattr(param, "envvar", None):
                yield path, param

    yield from walk(typer.main.get_command(cli_app), "durq")


def test_every_variable_the_library_reads_is_in_the_table(rows: dict[str, list[str]]) -> None:
    read = variables_read("src")
    assert "DURQ_BROKER_URL" in read  # the scanner sees the simplest case
    assert sorted(read - set(rows)) == []


def test_every_variable_in_the_table_is_read_somewhere(rows: dict[str, list[str]]) -> None:
    read = variables_read("src", "tests", "examples")
    assert sorted(set(rows) - read) == []


def test_each_row_names_the_flag_and_its_default(rows: dict[str, list[str]]) -> None:
    options = list(env_options())
    assert options
    for command, option in options:
        flag, default, envvar = option.opts[0], option.default, option.envvar
        assert envvar in rows, (command, flag)
        flags_cell, default_cell = rows[envvar][0], rows[envvar][1]
        assert f"`{flag}`" in flags_cell, (envvar, flag, flags_cell)
        assert f"`{command}`" in flags_cell, (envvar, command, flags_cell)
        if default is not None and not isinstance(default, bool):
            assert f"`{default}`" in default_cell, (envvar, default, default_cell)
