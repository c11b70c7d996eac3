"""User-facing text speaks plain words: rule ids live only in docs/contract.md, test names and
maintainers' comments. Checked: the README, the guides, the reference service's README, the
changelog, every ``--help`` text and the docstrings of the public API."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer

import durq
from contract_rules import RULE_ID
from durq.cli import app as cli_app
from durq.cli import run as cli

ROOT = Path(__file__).resolve().parents[2]

#: Words of the documents durq was first described in, which mean nothing to a user
#: (``spec:`` is a Kubernetes manifest's key, not one of them).
FOREIGN = re.compile(r"the seed's|seed rule|\blessons?\b|\bSPEC\b(?!:)|R-RES-", re.IGNORECASE)
#: A test named in backticks may carry its rule id (``tests/x.py::test_E3_...``).
TEST_REF = re.compile(r"`tests/[^`]*::[^`]*`")

USER_DOCS = [
    "README.md",
    "CHANGELOG.md",
    *(
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "docs").rglob("*.md"))
        if p.name != "contract.md"
    ),
    *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "examples").rglob("README.md"))),
]

#: Modules whose public names users call; their docstrings are user documentation.
PUBLIC_MODULES = [
    "durq",
    "durq.web",
    "durq.web.asgi",
    "durq.web.wsgi",
    "durq.inspector",
    "durq.periodic",
    "durq.backoff",
    "durq.dashboard",
    "durq.observability.health",
    "durq.observability.logging",
    "durq.observability.metrics",
    "durq.observability.tracing",
]


def problems(text: str) -> list[str]:
    text = TEST_REF.sub("", text)
    return sorted(set(RULE_ID.findall(text)) | {m.group(0) for m in FOREIGN.finditer(text)})


@pytest.mark.parametrize("path", USER_DOCS)
def test_user_docs_speak_plain_words(path: str) -> None:
    found = {
        number: problems(line)
        for number, line in enumerate((ROOT / path).read_text(encoding="utf-8").splitlines(), 1)
        if problems(line)
    }
    assert not found, f"{path}: say what happens instead of {found}"


def test_the_checks_see_what_they_look_for() -> None:
    rule = "E" + "3"  # built, so this file cites no rule itself
    assert problems(f"refused ({rule})") == [rule]
    assert problems(f"see `tests/a.py::test_{rule}_x`") == []
    assert problems("the Seed's flow") == ["the Seed's"]
    assert problems("as the spec says") == ["spec"]
    assert problems("spec:\n  replicas: 2") == []


def command_paths() -> Iterator[list[str]]:
    def walk(command: Any, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
            yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(cli_app), [])


def test_help_texts_speak_plain_words(capsys: pytest.CaptureFixture[str]) -> None:
    seen = 0
    for path in command_paths():
        assert cli([*path, "--help"]) == 0
        text = capsys.readouterr().out
        assert "Usage" in text
        seen += 1
        assert not problems(text), ("durq", *path, problems(text))
    assert seen > 1


def public_docstrings(module: ModuleType) -> Iterator[tuple[str, str]]:
    yield module.__name__, inspect.getdoc(module) or ""
    names = getattr(module, "__all__", [n for n in vars(module) if not n.startswith("_")])
    for name in names:
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not getattr(obj, "__module__", "").startswith("durq"):
            continue
        yield f"{module.__name__}.{name}", inspect.getdoc(obj) or ""
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                target = member.fget if isinstance(member, property) else member
                doc = inspect.getdoc(target) if callable(target) or target is not member else None
                yield f"{module.__name__}.{name}.{attr}", doc or ""


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_docstrings_speak_plain_words(name: str) -> None:
    module = importlib.import_module(name)
    found = {where: problems(doc) for where, doc in public_docstrings(module) if problems(doc)}
    assert not found, found
    assert durq.App.enqueue.__doc__  # the public API is documented at all
