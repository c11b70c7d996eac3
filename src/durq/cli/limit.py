"""``durq limit ls``: flow-control keys, what runs under each and what waits on it."""

from __future__ import annotations

from typing import Annotated

import typer

from durq.app import App
from durq.brokers.views import LimitStats
from durq.cli.common import BrokerOpt, JsonOpt, console, make_table, print_json, run
from durq.limits import format_rate

group = typer.Typer(
    name="limit",
    help="Show flow-control limits (durq.Limit): running, tokens left, tasks waiting.",
    epilog=(
        "Examples:\n\n  durq limit ls\n\n  durq limit ls --queue partners\n\n  durq limit ls --json"
    ),
    no_args_is_help=True,
)

QueueOpt = Annotated[str | None, typer.Option("--queue", "-q", help="Only the keys of this queue.")]


def print_limits(limits: list[LimitStats]) -> None:
    """Keys as one table: running out of the concurrency, tokens out of the rate, waiting."""
    table = make_table("limits", caption="running/concurrency; tokens left of rate per period")
    for name in ("queue", "key", "running", "rate", "tokens", "waiting"):
        table.add_column(
            name, overflow="fold", justify="left" if name in ("queue", "key") else "right"
        )
    for s in limits:
        table.add_row(
            s.queue,
            s.key,
            f"{s.running}/{s.concurrency}" if s.concurrency is not None else str(s.running),
            format_rate(s.rate, s.per),
            "-" if s.tokens is None else f"{s.tokens:.1f}",
            str(s.waiting),
        )
    console.print(table)


@group.command("ls")
def ls_command(queue: QueueOpt = None, broker: BrokerOpt = None, as_json: JsonOpt = False) -> None:
    """List the limit keys workers have counted, by queue and key."""

    async def body(app: App) -> list[LimitStats]:
        return await app.inspector.list_limits(queue)

    limits = run(broker, body)
    if as_json:
        print_json([s.to_dict() for s in limits])
    elif not limits:
        console.print("no limits counted yet (a key appears when a worker claims its first task)")
    else:
        print_limits(limits)


def register(app: typer.Typer) -> None:
    """Add ``durq limit ...``."""
    app.add_typer(group)
