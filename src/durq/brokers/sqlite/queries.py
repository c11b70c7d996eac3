"""The SQL of the SQLite broker, loaded once from ``queries.sql`` and ``migrations/*.sql``."""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered schema change: ``0001_init.sql`` is version 1."""

    version: int
    name: str
    sql: str

    def statements(self) -> list[str]:
        """The script split into complete statements (``executescript`` would commit early)."""
        return split_statements(self.sql)


def parse_named(text: str) -> dict[str, str]:
    """``-- name: x`` blocks to ``{"x": "SQL"}``; a block runs until the next name."""
    queries: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = "\n".join(
            line
            for line in text[match.end() : end].splitlines()
            if not line.lstrip().startswith("--")
        ).strip()
        name = match.group(1)
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.rstrip(";").strip()
    return queries


def split_statements(script: str) -> list[str]:
    """Split a script into statements, using SQLite's own notion of a complete statement."""
    statements: list[str] = []
    current: list[str] = []
    for line in script.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("--")):
            continue
        current.append(line)
        text = "\n".join(current)
        if sqlite3.complete_statement(text):
            statements.append(text.strip())
            current = []
    if current and "\n".join(current).strip():
        raise ValueError("migration ends with an incomplete statement")
    return statements


def _load_queries() -> dict[str, str]:
    return parse_named(resources.files(__package__).joinpath("queries.sql").read_text("utf-8"))


def _load_migrations() -> tuple[Migration, ...]:
    found: list[Migration] = []
    for entry in resources.files(__package__).joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise ValueError("SQLite migrations must be numbered 0001, 0002, ... without gaps")
    return tuple(found)


#: Every named statement of ``queries.sql``.
Q: dict[str, str] = _load_queries()
#: Every migration, in version order.
MIGRATIONS: tuple[Migration, ...] = _load_migrations()
#: The schema version this code expects.
SCHEMA_VERSION: int = MIGRATIONS[-1].version
