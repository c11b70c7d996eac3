"""``durq scheduler APP`` (enqueue periodic tasks, no handlers) and ``durq periodic ls APP``."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from typing import Annotated

import typer

from durq.app import App
from durq.cli.common import (
    BrokerOpt,
    JsonOpt,
    console,
    fmt_time,
    load_app,
    print_json,
)
from durq.observability.logging import TaskSummary, setup_logging
from durq.periodic import EntryStatus, status
from durq.worker.periodic import PeriodicScheduler

log = logging.getLogger("durq.cli")

#: Seconds between the INFO lines counting the ticks enqueued (a worker's default too).
SUMMARY_INTERVAL = 60.0

AppArg = Annotated[str, typer.Argument(metavar="APP", help="The app object as module:attribute.")]

SCHEDULER_EPILOG = (
    "Examples:\n\n"
    "  durq scheduler myproject.tasks:app\n\n"
    "Every 'durq worker' already runs a scheduler; any number may run at once, and each tick "
    "is enqueued exactly once (its task id derives from the entry and the tick)."
)


def _load(app_path: str, broker: str | None) -> App:
    # --broker, then DURQ_BROKER_URL, override the broker the app was built with.
    return load_app(app_path, broker)


def scheduler_command(
    app_path: AppArg,
    broker: BrokerOpt = None,
    log_format: Annotated[
        str, typer.Option("--log-format", help="Log format: text or json.")
    ] = "text",
    log_level: Annotated[str, typer.Option("--log-level", help="Log level.")] = "INFO",
) -> None:
    """Enqueue APP's periodic tasks until SIGTERM/SIGINT (runs no handlers)."""
    setup_logging(log_level, log_format)
    application = _load(app_path, broker)
    if not len(application.schedules):
        log.info("%s declares no periodic tasks: ticking stored schedules only", app_path)
    for entry in application.schedules:
        log.info("periodic %s: %s (%s) -> %s", entry.name, entry.spec, entry.tz, entry.type)
    asyncio.run(_run(application))


async def _run(application: App) -> None:
    broker = application.new_broker()
    await broker.connect()
    # Ticks are logged at DEBUG; an INFO line a minute counts them, as a worker's does.
    summary = TaskSummary(f"{socket.gethostname()}:{os.getpid()}", label="scheduler")
    counter = summary.service(SUMMARY_INTERVAL)
    scheduler = PeriodicScheduler(application, broker, on_enqueued=summary.tick_enqueued)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    scheduler.start()
    counter.start()
    try:
        await stop.wait()
    finally:
        await scheduler.stop()
        await counter.stop()  # logs the last partial period
        await broker.close()
        await application.close()
        log.info("scheduler stopped")


def ls_command(app_path: AppArg, broker: BrokerOpt = None, json_out: JsonOpt = False) -> None:
    """List APP's periodic entries and the stored schedules, with their next run and last
    enqueue."""
    application = _load(app_path, broker)

    async def body() -> list[EntryStatus]:
        try:
            # Code entries, then the schedules stored in the broker (durq schedule).
            entries = await application.stored_schedules.list()
            return await status(application, entries=entries)
        finally:
            await application.close()

    rows = asyncio.run(body())
    if json_out:
        print_json([row.to_dict() for row in rows])
        return
    from durq.cli.tables import RowTable

    table = RowTable(box=None)
    for column in ("NAME", "SCHEDULE", "TZ", "TYPE", "QUEUE", "MISSED", "NEXT RUN", "LAST ENQUEUE"):
        table.add_column(column)
    for row in rows:
        last = "-"
        if row.last_task_id:
            last = f"{fmt_time(row.last_enqueued_at)} UTC ({row.last_state})"
        table.add_row(
            row.entry.name,
            row.entry.spec,
            row.entry.tz,
            row.entry.type,
            row.queue,
            row.entry.missed,
            row.next_run.isoformat(),
            last,
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add ``durq scheduler`` and ``durq periodic ls``."""
    app.command("scheduler", epilog=SCHEDULER_EPILOG)(scheduler_command)
    periodic = typer.Typer(
        help="Periodic tasks: list the schedules of an app.", no_args_is_help=True
    )
    periodic.command("ls")(ls_command)
    app.add_typer(periodic, name="periodic")
