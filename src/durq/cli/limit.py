"""``durq limit ls|set|reset``: flow-control keys, what runs under each and what waits on it,
and an operator's override of one key's limit at run time."""

from __future__ import annotations

from typing import Annotated

import typer

from durq.app import App
from durq.brokers.views import LimitStats
from durq.cli.common import (
    BrokerOpt,
    JsonOpt,
    UsageFailure,
    console,
    escape,
    fail,
    make_table,
    print_json,
    run,
)
from durq.limits import format_limit, format_rate

group = typer.Typer(
    name="limit",
    help=(
        "Show flow-control limits (durq.Limit): running, tokens left, tasks waiting; "
        "override one key's limit at run time and reset it."
    ),
    epilog=(
        "Examples:\n\n  durq limit ls\n\n  durq limit ls --queue partners --json\n\n"
        "  durq limit set partner:acme --concurrency 0\n\n"
        "  durq limit set partner-api --queue partners --rate 10/s\n\n"
        "  durq limit reset partner:acme"
    ),
    no_args_is_help=True,
)

QueueOpt = Annotated[str | None, typer.Option("--queue", "-q", help="Only the keys of this queue.")]
KeyArg = Annotated[str, typer.Argument(help="The limit key as tasks resolve it: partner:acme.")]
OneQueueOpt = Annotated[str, typer.Option("--queue", "-q", help="The queue the key counts in.")]


def print_limits(limits: list[LimitStats]) -> None:
    """Keys as one table: running out of the concurrency in force, the rate, tokens left,
    waiting, and an override beside the tasks' own limit."""
    table = make_table(
        "limits",
        caption="running/concurrency and rate in force; an override with the tasks' own limit",
    )
    for name in ("queue", "key", "running", "rate", "tokens", "waiting", "override"):
        table.add_column(
            name, overflow="fold", justify="left" if name in ("queue", "key") else "right"
        )
    for s in limits:
        concurrency = s.limit_concurrency
        override = "-"
        if s.overridden:
            own = format_limit(s.concurrency, s.rate, s.per, "not seen yet")
            override = f"set (tasks': {own})"
        table.add_row(
            escape(s.queue),
            escape(s.key),
            f"{s.running}/{concurrency}" if concurrency is not None else str(s.running),
            format_rate(*s.limit_rate) if s.limit_rate is not None else "-",
            "-" if s.tokens is None else f"{s.tokens:.1f}",
            str(s.waiting),
            override,
        )
    console.print(table)


@group.command("ls")
def ls_command(queue: QueueOpt = None, broker: BrokerOpt = None, as_json: JsonOpt = False) -> None:
    """List the limit keys workers have counted or an override was set on, by queue and key."""

    async def body(app: App) -> list[LimitStats]:
        return await app.inspector.list_limits(queue)

    limits = run(broker, body)
    if as_json:
        print_json([s.to_dict() for s in limits])
    elif not limits:
        console.print("no limits counted yet (a key appears when a worker claims its first task)")
    else:
        print_limits(limits)


@group.command("set")
def set_command(
    key: KeyArg,
    queue: OneQueueOpt = "default",
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency", "-c", help="At most this many run at once; 0 starts none for now."
        ),
    ] = None,
    rate: Annotated[
        str | None, typer.Option("--rate", "-r", help="At most this many start per period: 10/s.")
    ] = None,
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Override one key's limit at run time, until reset.

    It wins over the limit the key's tasks carry; a part not given keeps theirs. Every
    worker applies it at its next claim; running tasks are not touched."""
    if concurrency is None and rate is None:
        raise UsageFailure("give --concurrency, --rate or both")

    async def body(app: App) -> LimitStats:
        return await app.inspector.set_limit(queue, key, concurrency=concurrency, rate=rate)

    stats = run(broker, body)
    if as_json:
        print_json(stats.to_dict())
        return
    limit = format_limit(stats.override_concurrency, stats.override_rate, stats.override_per)
    console.print(f"limit {escape(stats.key)} in queue {escape(stats.queue)} overridden: {limit}")


@group.command("reset")
def reset_command(
    key: KeyArg, queue: OneQueueOpt = "default", broker: BrokerOpt = None, as_json: JsonOpt = False
) -> None:
    """Remove one key's override: the limit its tasks carry applies again."""

    async def body(app: App) -> bool:
        return await app.inspector.reset_limit(queue, key)

    if not run(broker, body):
        fail(f"no override on limit {key!r} in queue {queue!r}: nothing to reset")
    if as_json:
        print_json({"queue": queue, "key": key, "override": None})
    else:
        console.print(f"limit {escape(key)} in queue {escape(queue)} reset to its tasks' own")


def register(app: typer.Typer) -> None:
    """Add ``durq limit ...``."""
    app.add_typer(group)
