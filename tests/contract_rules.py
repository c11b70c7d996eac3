"""The rule ids of ``docs/contract.md``: where code cites them and which tests check them.

A test checks a rule when the rule's id is in the test's name or docstring, or, in a module
where no test names an id that way, when the module's docstring cites the rule by itself (not
as the end of a range such as ``I1-I5``).

After adding or renaming a test that names a rule id, rewrite the "Checked by" lists of
``docs/contract.md`` with::

    .venv/bin/python tests/contract_rules.py
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "docs" / "contract.md"

#: A rule id as code cites it: ``E3``, ``test_E3_...``, ``(I1-I5)``; never part of a word
#: or a longer number (``E501``, ``p99``).
RULE_ID = re.compile(r"(?<![A-Za-z0-9])([EWIHOSP][0-9]{1,2})(?![0-9A-Za-z])")

#: Where code lives, and which files in it are code.
CODE_DIRS = ("src", "tests", "examples", "benchmarks")
CODE_SUFFIXES = {".py", ".sql", ".lua", ".html", ".js", ".css"}
#: ``W4-W6``: a module about several rules, too broad to list its tests under each.
RANGE = re.compile(r"[EWIHOSP][0-9]{1,2}\s*[-\u2013]\s*[EWIHOSP][0-9]{1,2}")

#: A rule's heading in docs/contract.md: ``### E3 — one task per id``.
HEADING = re.compile(r"^### ([EWIHOSP][0-9]{1,2}) ")
TEST_REF = re.compile(r"`(tests/[^`:]+\.py)::([A-Za-z_0-9:]+)`")
CHECKED_BY = "Checked by:"
UNTESTED = "Not checked by a test yet:"


def sort_key(rule_id: str) -> tuple[int, int]:
    return ("EWIPHOS".index(rule_id[0]), int(rule_id[1:]))


def code_files() -> Iterator[Path]:
    """Every code file of the repository (sources, tests, examples, benchmarks)."""
    for base in CODE_DIRS:
        for path in sorted((ROOT / base).rglob("*")):
            parts = path.relative_to(ROOT).parts
            # Hidden directories hold installed third-party code (benchmarks/.venv-peers).
            if any(p == "__pycache__" or p.endswith(".egg-info") or p[0] == "." for p in parts):
                continue
            if path.is_file() and path.suffix in CODE_SUFFIXES:
                yield path


def ids_cited_in_code() -> dict[str, set[str]]:
    """Rule id -> the files (relative paths) that cite it."""
    cited: dict[str, set[str]] = defaultdict(set)
    for path in code_files():
        for rule_id in RULE_ID.findall(path.read_text(encoding="utf-8", errors="replace")):
            cited[rule_id].add(str(path.relative_to(ROOT)))
    return cited


def _tests_of(body: list[ast.stmt], prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    for node in body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            yield from _tests_of(node.body, f"{prefix}{node.name}::")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            yield f"{prefix}{node.name}", node


def _test_modules() -> Iterator[Path]:
    yield from sorted((ROOT / "tests").rglob("test_*.py"))


def checks_by_rule() -> dict[str, list[str]]:
    """Rule id -> ``tests/file.py::test_name`` of the tests that check it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in _test_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        rel = path.relative_to(ROOT).as_posix()
        own: dict[str, set[str]] = {}
        for name, node in _tests_of(tree.body):
            doc = ast.get_docstring(node) or ""  # type: ignore[arg-type]
            own[f"{rel}::{name}"] = set(RULE_ID.findall(name)) | set(RULE_ID.findall(doc))
        if not any(own.values()):
            module_doc = RANGE.sub("", ast.get_docstring(tree) or "")
            module_ids = set(RULE_ID.findall(module_doc))
            own = {ref: module_ids for ref in own}
        for ref, ids in own.items():
            for rule_id in ids:
                found[rule_id].append(ref)
    return dict(found)


def names_a_test(ref: str) -> bool:
    """Whether ``tests/file.py::[Class::]test_name`` names a test function that exists."""
    path, _, name = ref.partition("::")
    file = ROOT / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text(encoding="utf-8"))
    return any(found == name for found, _ in _tests_of(tree.body))


@dataclass
class Rule:
    """One rule of docs/contract.md as written there."""

    id: str
    tests: list[str] = field(default_factory=list)
    untested: bool = False


def parse_contract(text: str) -> dict[str, Rule]:
    """The rules defined in ``text`` (docs/contract.md), by id, with the tests listed under each."""
    rules: dict[str, Rule] = {}
    current: Rule | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            match = HEADING.match(line)
            current = Rule(match.group(1)) if match else None
            if current is not None:
                rules[current.id] = current
            continue
        if current is None:
            continue
        if line.startswith(UNTESTED):
            current.untested = True
        current.tests.extend(f"{path}::{name}" for path, name in TEST_REF.findall(line))
    return rules


def render(text: str, tests: dict[str, list[str]]) -> str:
    """``text`` with each rule's "Checked by" list rewritten from ``tests``.

    A rule without tests keeps its "Not checked by a test yet" line (the reason is written by
    hand); a rule that has tests loses it."""
    out: list[str] = []
    rule_id: str | None = None
    skipping = False
    for line in [*text.splitlines(), "#"]:  # the sentinel heading closes the last section
        if line.startswith("#"):
            skipping = False
            match = HEADING.match(line)
            rule_id = match.group(1) if match else None
        elif rule_id is not None and line.startswith(CHECKED_BY):
            skipping = True
            refs = tests.get(rule_id, [])
            if refs:
                out += [CHECKED_BY, "", *(f"- `{ref}`" for ref in refs), ""]
            else:
                out += [f"{UNTESTED} (say why)", ""]
            continue
        elif rule_id is not None and line.startswith(UNTESTED) and tests.get(rule_id):
            skipping = True
            out += [CHECKED_BY, "", *(f"- `{ref}`" for ref in tests[rule_id]), ""]
            continue
        if not skipping:
            out.append(line)
    return "\n".join(out[:-1]) + "\n"


def main() -> int:
    text = CONTRACT.read_text(encoding="utf-8")
    CONTRACT.write_text(render(text, checks_by_rule()), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
