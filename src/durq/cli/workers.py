"""``durq workers``: live worker processes (I5)."""

from __future__ import annotations

import time
from dataclasses import asdict

import typer

from durq.app import App
from durq.brokers.views import WorkerInfo
from durq.cli.common import (
    BrokerOpt,
    JsonOpt,
    console,
    fmt_age,
    fmt_time,
    make_table,
    print_json,
    run,
)

EPILOG = "Examples:\n\n  durq workers\n\n  durq workers --json | jq '.[].active'"


def print_workers(workers: list[WorkerInfo]) -> None:
    """Workers as one table (the id holds host and pid; ``--json`` has every field)."""
    now = time.time()  # only to show the heartbeat's age
    table = make_table("workers")
    for name in ("worker", "queues", "busy", "started (UTC)", "heartbeat"):
        table.add_column(name, overflow="fold")
    for w in workers:
        queues = ",".join(f"{q}={n}" for q, n in w.queues.items()) + (" strict" if w.strict else "")
        table.add_row(
            w.id,
            queues,
            f"{w.active}/{w.concurrency}",
            fmt_time(w.started_at),
            f"{fmt_age(max(0.0, now - w.last_heartbeat))} ago",
        )
    console.print(table)


def workers_command(broker: BrokerOpt = None, as_json: JsonOpt = False) -> None:
    """List worker processes that sent a heartbeat in the last minute."""

    async def body(app: App) -> list[WorkerInfo]:
        return await app.inspector.list_workers()

    workers = run(broker, body)
    if as_json:
        print_json([asdict(w) for w in workers])
    elif not workers:
        console.print("no live workers")
    else:
        print_workers(workers)


def register(app: typer.Typer) -> None:
    """Add ``durq workers``."""
    app.command("workers", epilog=EPILOG)(workers_command)
