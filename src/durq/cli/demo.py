"""``durq demo``: watch tasks go through their lifecycle, in one process."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from durq import ranges
from durq.brokers import open_broker, resolve_url
from durq.cli.common import BrokerOpt, console, fail

EPILOG = (
    "Examples:\n\n"
    "  durq demo\n\n"
    "  durq demo --port 8080\n\n"
    "  durq demo --lifecycle --broker sqlite:////tmp/demo.sqlite3\n\n"
    "Without --lifecycle: the reference insurance service (examples/insurance in the "
    "source tree, shipped as durq.demo.insurance; needs the 'demo' extra) with its "
    "partner simulator and an in-process worker, served until Ctrl-C. With --lifecycle: "
    "a worker and a producer run for a few seconds and print each task's states. "
    "Either way a fresh broker is migrated first."
)


def demo_command(
    broker: BrokerOpt = None,
    port: Annotated[int, typer.Option("--port", help="Port of the web demo's API.")] = 8000,
    lifecycle_only: Annotated[
        bool,
        typer.Option("--lifecycle", help="Run the short task-lifecycle demo instead and exit."),
    ] = False,
) -> None:
    """Run the reference insurance service until Ctrl-C (or, with --lifecycle, show the task
    lifecycle: success, delay, NotReady polling, archive, task-id conflict)."""
    from durq.demo import lifecycle

    ranges.port("--port", port)
    url = resolve_url(broker)
    open_broker(url)  # an unknown scheme is a usage error before anything starts
    if not lifecycle_only:
        _require_demo_extra()  # before the broker's file or schema is created
    _migrate(url)
    if not lifecycle_only:
        _web_demo(url, port)
        return
    ok = asyncio.run(lifecycle.run(url, console=console, broker_flag=broker or ""))
    if not ok:
        fail("the demo did not end as expected")


def _migrate(url: str) -> None:
    """A demo prepares its own storage (a deployment runs ``durq migrate`` instead)."""
    from durq.errors import DurqError

    async def run() -> list[str]:
        broker = open_broker(url)
        try:
            return await broker.migrate()
        finally:
            await broker.close()

    try:
        applied = asyncio.run(run())
    except DurqError as exc:
        fail(f"cannot prepare the broker {url}: {exc}")
    if applied:
        _say(f"durq demo: migrated the broker's schema ({', '.join(applied)})")


def _require_demo_extra() -> None:
    try:
        import durq.demo.insurance.demo  # noqa: F401
    except ImportError as exc:
        fail(
            f"the web demo needs the 'demo' extra ({exc}): pip install 'durq[demo]'; "
            "or run `durq demo --lifecycle`, which needs nothing more"
        )


def _web_demo(url: str, port: int) -> None:
    """The reference service, shipped inside the package as ``durq.demo.insurance``."""
    import os

    from durq.demo.insurance import demo
    from durq.demo.insurance.config import Settings, default_database_url

    settings = Settings.from_env()
    if url != settings.broker_url:
        database = os.environ.get("INSURANCE_DATABASE_URL") or default_database_url(url)
        settings = settings.with_(broker_url=url, database_url=database)
    try:
        asyncio.run(demo.serve(port, out=_say, settings=settings))
    except OSError as exc:
        fail(f"cannot serve the demo on port {port}: {exc} (choose another with --port)")


def _say(text: str) -> None:
    # Plain print: the banner holds JSON and shell quoting that markup would mangle.
    print(text, flush=True)


def register(app: typer.Typer) -> None:
    """Add ``durq demo``."""
    app.command("demo", epilog=EPILOG)(demo_command)
