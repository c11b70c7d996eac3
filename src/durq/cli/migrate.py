"""``durq migrate``: create or upgrade the broker's storage (tables, indexes, scripts), or
with ``--check``/``--status`` only say what is pending."""

from __future__ import annotations

from typing import Annotated

import typer

from durq.app import App
from durq.cli.common import EXIT_DOMAIN, BrokerOpt, JsonOpt, UsageFailure, console, print_json, run

EPILOG = (
    "Examples:\n\n"
    "  durq migrate\n\n"
    "  durq migrate --broker postgresql://localhost/app?schema=durq --json\n\n"
    "  durq migrate --check   # in a deploy script: exit 1 while migrations are pending\n\n"
    "Safe to run again: it applies only what is missing. --check and --status write nothing."
)


def migrate_command(
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Apply nothing: exit 0 when the schema is current, 1 (and one line naming "
            "them) when migrations are pending.",
        ),
    ] = False,
    status: Annotated[
        bool,
        typer.Option("--status", help="Apply nothing: list the pending migrations, exit 0."),
    ] = False,
) -> None:
    """Apply the broker's missing schema migrations."""
    if check and status:
        raise UsageFailure("give --check or --status, not both")
    dry = check or status

    async def body(app: App) -> tuple[str, list[str]]:
        # A fresh broker, not app.broker(): connecting may refuse an unmigrated schema.
        b = app.new_broker()
        try:
            return b.name, await (b.pending_migrations() if dry else b.migrate())
        finally:
            await b.close()

    name, names = run(broker, body)
    if as_json:
        print_json({"broker": name, "pending" if dry else "applied": names})
    elif dry and names:
        line = f"{name}: {len(names)} migration(s) pending: {', '.join(names)} (run `durq migrate`)"
        if check:
            typer.echo(line, err=True)
        else:
            console.print(line)
    elif names:
        console.print(f"{name}: applied {', '.join(names)}")
    else:
        console.print(f"{name}: schema is up to date")
    if check and names:
        raise typer.Exit(EXIT_DOMAIN)


def register(app: typer.Typer) -> None:
    """Add ``durq migrate``."""
    app.command("migrate", epilog=EPILOG)(migrate_command)
