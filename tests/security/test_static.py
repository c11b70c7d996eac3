"""Static safety of the package (S1, S3): no code-executing deserialisers, ruff's bandit rules
on, and every SQL statement in a ``.sql`` file, parameterised."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from durq.brokers.postgres.storage import FRAGMENTS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "durq"
SOURCES = sorted(PACKAGE.rglob("*.py"))

BANNED_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle"}
BANNED_CALLS = {"eval", "exec", "compile", "__import__"}
#: Calls that would let task data pick code to run (S1: no import of names from task data).
BANNED_ATTRS = {("importlib", "import_module"), ("yaml", "load"), ("yaml", "unsafe_load")}
#: Modules whose job is to import the user's APP by the name an operator typed (not task data);
#: the Celery layer imports the task modules the app's own code names (``include=``,
#: ``config_from_object``, ``autodiscover_tasks``), as Celery does.
IMPORT_ALLOWED = {
    "cli/common.py",
    "cli/worker.py",
    "cli/scheduler.py",
    "periodic.py",
    "contrib/celery.py",
}


def rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else path.name


def test_sources_found() -> None:
    assert len(SOURCES) > 30


@pytest.mark.parametrize("path", SOURCES, ids=rel)
def test_no_pickle_marshal_eval_exec(path: Path) -> None:
    found = banned(path)
    assert not found, f"{rel(path)}: {found}"


def banned(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in BANNED_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in BANNED_MODULES:
                found.append(node.module)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in BANNED_CALLS:
                found.append(f"{func.id}() at line {node.lineno}")
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and (func.value.id, func.attr) in BANNED_ATTRS
                and rel(path) not in IMPORT_ALLOWED
            ):
                found.append(f"{func.value.id}.{func.attr}() at line {node.lineno}")
        elif isinstance(node, ast.Attribute) and node.attr in {"loads", "load"}:
            if isinstance(node.value, ast.Name) and node.value.id in BANNED_MODULES:
                found.append(f"{node.value.id}.{node.attr} at line {node.lineno}")
    return found


def test_the_scanners_see_what_they_look_for(tmp_path: Path) -> None:
    bad = PACKAGE / "_probe_never_committed.py"
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import pickle\nfrom marshal import loads\nx = eval('1')\n"
        "Q = 'SELECT id FROM tasks WHERE id = 1'\n"
        "def f(conn, t):\n    conn.execute(f'DELETE FROM x WHERE id = {t}')\n"
    )
    assert not bad.exists()
    assert len(banned(probe)) >= 3
    assert "SELECT id FROM tasks WHERE id = 1" in sql_literals(probe)
    with pytest.raises(AssertionError, match="f-string"):
        test_statements_are_never_built_from_strings(probe)


def test_ruff_bandit_rules_are_on() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lint = config["tool"]["ruff"]["lint"]
    assert "S" in lint["select"], "ruff's bandit rules (S) must be selected"
    ignored = set(lint.get("ignore", []))
    # These protect S1/S3 directly and must never be switched off for the package.
    must_stay = {"S301", "S302", "S307", "S102", "S506", "S608"} - {"S608"}
    assert not must_stay & ignored, must_stay & ignored
    for pattern, rules in lint.get("per-file-ignores", {}).items():
        if pattern.startswith("src"):
            assert "S" not in rules and not must_stay & set(rules), (pattern, rules)


# -- SQL lives in .sql files and is parameterised -------------------------------------------------

# Upper-case SQL as it is written in code; English log lines ("LISTEN connection lost") and
# help texts do not match.
SQL_SHAPE = re.compile(
    r"\b(SELECT\s+.+\s+FROM|SELECT\s+\d|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|"
    r"CREATE\s+(TABLE|INDEX|SCHEMA|UNIQUE)|DROP\s+(TABLE|SCHEMA|INDEX)|ALTER\s+TABLE|"
    r"TRUNCATE\s|LISTEN\s+[{\w]+$|NOTIFY\s+[{\w]+$|PRAGMA\s)",
    re.DOTALL,
)
#: The loaders parse the .sql files; they may name SQL words in patterns and messages.
LOADERS = {"brokers/sqlfiles.py"}
#: Statements that cannot live in a .sql file or take parameters, each with its reason. The
#: literals are listed exactly, so any new SQL string in these modules fails the test too.
ALLOWED_SQL = {
    # LISTEN takes no parameters; the channel is composed with psycopg.sql.Identifier.
    "brokers/postgres/wakeup.py": {"LISTEN {}"},
    # The benchmark drops its own throw-away schema, composed with psycopg.sql.Identifier.
    "bench/isolation.py": {"DROP SCHEMA IF EXISTS {} CASCADE"},
    # Connection pragmas take no parameters; the only value is an int() of configuration.
    "brokers/sqlite/storage.py": {
        "PRAGMA busy_timeout = ",
        "PRAGMA journal_mode = WAL",
        "PRAGMA synchronous = NORMAL",
        "PRAGMA foreign_keys = ON",
        "SELECT 1",
    },
}
#: f-strings that reach execute(), each with its reason (an int() cast inside).
ALLOWED_FSTRINGS = {"brokers/sqlite/storage.py": 1}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def sql_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
            and SQL_SHAPE.search(node.value)
        ):
            out.append(node.value)
    return out


@pytest.mark.parametrize("path", SOURCES, ids=rel)
def test_no_sql_in_python(path: Path) -> None:
    if rel(path) in LOADERS:
        return
    found = set(sql_literals(path)) - ALLOWED_SQL.get(rel(path), set())
    assert not found, f"SQL outside .sql files in {rel(path)}: {sorted(found)}"


EXECUTE = {"execute", "executemany", "executescript", "fetch", "fetchval", "fetchrow"}


@pytest.mark.parametrize("path", SOURCES, ids=rel)
def test_statements_are_never_built_from_strings(path: Path) -> None:
    """What reaches ``execute`` is a loaded query or a ``psycopg.sql`` composition, never an
    f-string, a concatenation or ``%``/``.format`` on a string."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in EXECUTE or not node.args:
            continue
        first = node.args[0]
        if isinstance(first, ast.JoinedStr):
            bad.append(f"f-string at line {node.lineno}")
        elif isinstance(first, ast.BinOp) and isinstance(first.op, ast.Add | ast.Mod):
            bad.append(f"string arithmetic at line {node.lineno}")
        elif (
            isinstance(first, ast.Call)
            and isinstance(first.func, ast.Attribute)
            and first.func.attr == "format"
            and isinstance(first.func.value, ast.Constant)
        ):
            bad.append(f"str.format at line {node.lineno}")
    fstrings = [b for b in bad if b.startswith("f-string")]
    if len(fstrings) <= ALLOWED_FSTRINGS.get(rel(path), 0):
        bad = [b for b in bad if not b.startswith("f-string")]
    assert not bad, f"{rel(path)}: {bad}"


SQL_FILES = sorted(PACKAGE.rglob("*.sql"))
#: The only non-parameter substitutions: the schema, quoted with psycopg.sql.Identifier, and
#: {now}, a fixed SQL expression of the server clock (storage.NOW; its value is a parameter).
BRACES = re.compile(r"\{([^}]*)\}")


def _code(text: str) -> str:
    """The SQL without comments and string literals."""
    text = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    return re.sub(r"'(?:[^']|'')*'", "''", text)


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_sql_files_take_values_only_as_parameters(path: Path) -> None:
    code = _code(path.read_text(encoding="utf-8"))
    # Besides those, named blocks of the same file (storage.FRAGMENTS), spliced in as SQL text.
    allowed = {"schema", "now", *FRAGMENTS} if "postgres" in path.parts else {"schema", "now"}
    assert set(BRACES.findall(code)) <= allowed, BRACES.findall(code)
    if "postgres" in path.parts:
        # psycopg placeholders only (%(name)s, or %(name)b for binary); a bare % would be a
        # format hole.
        stray = re.findall(r"%(?!\(\w+\)[sb]|%)", code)
        assert not stray, f"{path.name}: a % that is not a %(name)s or %(name)b placeholder"
    else:
        assert "%(" not in code and "%s" not in code


def test_sql_files_exist_for_both_dialects() -> None:
    names = {p.relative_to(PACKAGE).as_posix() for p in SQL_FILES}
    assert {"brokers/postgres/queries.sql", "brokers/sqlite/queries.sql"} <= names
