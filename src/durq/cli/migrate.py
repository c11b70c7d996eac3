"""``durq migrate``: create or upgrade the broker's storage (tables, indexes, scripts)."""

from __future__ import annotations

import typer

from durq.app import App
from durq.cli.common import BrokerOpt, JsonOpt, console, print_json, run

EPILOG = (
    "Examples:\n\n"
    "  durq migrate\n\n"
    "  durq migrate --broker postgresql://localhost/app?schema=durq --json\n\n"
    "Safe to run again: it applies only what is missing."
)


def migrate_command(broker: BrokerOpt = None, as_json: JsonOpt = False) -> None:
    """Apply the broker's missing schema migrations."""

    async def body(app: App) -> tuple[str, list[str]]:
        # A fresh broker, not app.broker(): connecting may refuse an unmigrated schema.
        b = app.new_broker()
        try:
            return b.name, await b.migrate()
        finally:
            await b.close()

    name, applied = run(broker, body)
    if as_json:
        print_json({"broker": name, "applied": applied})
    elif applied:
        console.print(f"{name}: applied {', '.join(applied)}")
    else:
        console.print(f"{name}: schema is up to date")


def register(app: typer.Typer) -> None:
    """Add ``durq migrate``."""
    app.command("migrate", epilog=EPILOG)(migrate_command)
