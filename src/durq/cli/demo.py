"""``durq demo``: watch tasks go through their lifecycle, in one process."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from durq.brokers import open_broker, resolve_url
from durq.cli.common import BrokerOpt, console, fail

EPILOG = (
    "Examples:\n\n"
    "  durq demo\n\n"
    "  durq demo --broker sqlite:////tmp/demo.sqlite3\n\n"
    "Runs a worker and a producer in this process for a few seconds, prints each task's "
    "states and ends with how to inspect them with the CLI."
)


def demo_command(
    broker: BrokerOpt = None,
    port: Annotated[
        int, typer.Option("--port", help="Port of the web demo (unused by this lifecycle demo).")
    ] = 8000,
) -> None:
    """Show the task lifecycle: success, delay, NotReady polling, archive, task-id conflict."""
    from durq.demo import lifecycle

    url = resolve_url(broker)
    open_broker(url)  # an unknown scheme is a usage error before anything starts
    ok = asyncio.run(lifecycle.run(url, console=console, broker_flag=broker or ""))
    if not ok:
        fail("the demo did not end as expected")


def register(app: typer.Typer) -> None:
    """Add ``durq demo``."""
    app.command("demo", epilog=EPILOG)(demo_command)
