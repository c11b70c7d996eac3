"""``durq encryption rotate|new-key``: re-seal stored tasks with the newest key."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from durq import encryption as crypt
from durq.app import App
from durq.cli.common import (
    BrokerOpt,
    JsonOpt,
    UsageFailure,
    console,
    load_app,
    print_json,
    run,
)
from durq.names import check_queue

group = typer.Typer(
    name="encryption",
    help="Keys of encrypted payloads and results: make one, re-encrypt stored tasks.",
    epilog=(
        "Examples:\n\n"
        "  durq encryption new-key\n\n"
        "  DURQ_ENCRYPTION_KEYS=k2:...,k1:... durq encryption rotate myapp.tasks:app --dry-run\n\n"
        "  durq encryption rotate myapp.tasks:app --queue payments"
    ),
    no_args_is_help=True,
)


@group.command("rotate")
def rotate_command(
    app_spec: Annotated[
        str, typer.Argument(metavar="APP", help="The app object as module:attribute.")
    ],
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", "-q", help="Only this queue (repeat for several; default all)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be re-encrypted; change nothing.")
    ] = False,
    batch: Annotated[
        int, typer.Option("--batch", min=1, max=1000, help="Tasks read and written per batch.")
    ] = crypt.ROTATE_BATCH,
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-encrypt the payloads and results of stored tasks with APP's newest key.

    Pending, scheduled, retry, archived, completed and waiting tasks are rewritten (tasks stored in
    the clear are encrypted too); active ones are left to their workers. Each write is
    fenced by the task's state and stored bytes: a task that moves meanwhile is left as it
    is, and a second run picks it up."""
    wanted = [check_queue(q) for q in queue or ()]
    app = load_app(app_spec, broker)
    keys = app.encryption
    if keys is None:
        raise UsageFailure(f"{app_spec} has no encryption keys (set {crypt.ENV})")

    async def body(app: App) -> crypt.RotateReport:
        admin = (await app.broker()).admin
        queues = wanted or [q.name for q in await admin.list_queues()]
        return await crypt.rotate(admin, keys, queues, dry_run=dry_run, batch=batch)

    report = run(app, body)
    if as_json:
        print_json({**report.to_dict(), "dry_run": dry_run})
        return
    verb = "would re-encrypt" if dry_run else "re-encrypted"
    console.print(
        f"{verb} {report.rewritten} of {report.examined} tasks with key {report.newest!r} "
        f"({report.current} already current, {report.moved} moved meanwhile, "
        f"{report.unreadable} unreadable, {report.active} active left to their workers)"
    )


@group.command("new-key")
def new_key_command() -> None:
    """Print a new random AES-256 key (base64), for DURQ_ENCRYPTION_KEYS=<id>:<key>."""
    sys.stdout.write(crypt.Encryption.new_key() + "\n")


def register(app: typer.Typer) -> None:
    """Add ``durq encryption ...``."""
    app.add_typer(group)
