"""``durq group get``: a group's progress (total, finished, members by state) and members."""

from __future__ import annotations

from typing import Annotated

import typer

from durq.app import App
from durq.brokers.views import GroupInfo
from durq.cli.common import (
    BrokerOpt,
    JsonOpt,
    QueueOpt,
    console,
    escape,
    examples,
    fmt_time,
    make_table,
    print_json,
    run,
)
from durq.cli.task import styled_state
from durq.clock import to_datetime

group = typer.Typer(
    name="group",
    help="Look at groups of tasks (app.enqueue_group) and their fan-in follow-up.",
    no_args_is_help=True,
)

GET_EPILOG = examples(
    "durq group get 9c1e... --queue default",
    "durq group get 9c1e... --queue default --json | jq .by_state",
)

IdArg = Annotated[str, typer.Argument(metavar="ID", help="The group id.")]


def print_group(info: GroupInfo) -> None:
    """A group's progress line, then one row per member."""
    states = ", ".join(f"{n} {state}" for state, n in sorted(info.by_state.items()))
    console.print(
        f"group {escape(info.id)} (queue {escape(info.queue)}): "
        f"{info.finished}/{info.total} finished ({states})"
    )
    if info.then_id is not None:
        when = fmt_time(to_datetime(info.finished_at)) if info.finished_at else "not yet"
        console.print(
            f"follow-up {escape(info.then_id)} in {escape(info.then_queue or '')}: {when}"
        )
    table = make_table("members")
    for name in ("#", "id", "queue", "type", "state"):
        table.add_column(name, overflow="fold")
    for i, m in enumerate(info.members):
        state = styled_state(m.state) if m.state else "[dim]gone[/]"
        table.add_row(str(i), escape(m.id), escape(m.queue), escape(m.type), state)
    console.print(table)


@group.command("get", epilog=GET_EPILOG)
def get_command(
    group_id: IdArg, queue: QueueOpt = "default", broker: BrokerOpt = None, as_json: JsonOpt = False
) -> None:
    """Show one group by its first member's queue and its id (exit 1 if there is none)."""

    async def body(app: App) -> GroupInfo:
        return await app.inspector.get_group(queue, group_id)

    info = run(broker, body)
    if as_json:
        print_json(info.to_dict())
    else:
        print_group(info)


def register(app: typer.Typer) -> None:
    """Add ``durq group ...``."""
    app.add_typer(group)
