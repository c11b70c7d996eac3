"""Load the named queries and the numbered migrations once, with the schema quoted in.

SQL lives in ``queries.sql`` (``-- name: x`` blocks) and ``migrations/NNNN_name.sql``; runtime
code holds no SQL strings. The schema cannot be a parameter, so ``{schema}`` is replaced by a
:class:`psycopg.sql.Identifier` when a broker is built."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from psycopg import sql

_NAME_LINE = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$")
_MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered migration file."""

    version: int
    name: str
    text: str


def _strip_comments(text: str) -> str:
    # Whole-line comments only: they may hold % and braces, which psycopg and str.format
    # would otherwise read as placeholders.
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("--") and ln.strip()]
    return "\n".join(lines)


def parse_named(text: str) -> dict[str, str]:
    """Split a ``-- name: x`` file into ``{name: sql}`` (comments stripped)."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _NAME_LINE.match(line.strip())
        if match:
            if match.group(1) in blocks:
                raise ValueError(f"query {match.group(1)!r} is defined twice")
            current = blocks.setdefault(match.group(1), [])
        elif current is not None:
            current.append(line)
    return {
        name: _strip_comments("\n".join(lines)).rstrip().rstrip(";")
        for name, lines in blocks.items()
    }


@cache
def raw_queries() -> dict[str, str]:
    """The query texts of ``queries.sql``, with ``{schema}`` still in them."""
    text = resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8")
    return parse_named(text)


@cache
def migrations() -> tuple[Migration, ...]:
    """Every migration, in version order."""
    folder = resources.files(__package__).joinpath("migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return tuple(found)


def render(text: str, schema: str) -> bytes:
    """The query as bytes with the schema quoted in (bytes: psycopg runs it as is)."""
    composed = sql.SQL(text).format(schema=sql.Identifier(schema))
    return composed.as_bytes(None)


@cache
def render_all(schema: str) -> dict[str, bytes]:
    """Every named query for one schema (rendered once per schema; treat as read-only)."""
    return {name: render(text, schema) for name, text in raw_queries().items()}


def render_migration(migration: Migration, schema: str) -> bytes:
    """A migration's statements for one schema (comments stripped, run as one script)."""
    return render(_strip_comments(migration.text), schema)
