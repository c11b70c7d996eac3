"""Tables for people (imported by the commands that print them, so rich loads only there)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from durq.cli.common import one_field


class RowTable(Table):
    """A table whose every text cell is one line: a stored error or value with line breaks
    or other control characters shows them as escapes (``\\n``), so each row of a table is
    one line, piped or not, and nothing in a cell acts on the terminal."""

    def add_row(self, *renderables: Any, **options: Any) -> None:
        cells = [one_field(r) if isinstance(r, str) else r for r in renderables]
        super().add_row(*cells, **options)
