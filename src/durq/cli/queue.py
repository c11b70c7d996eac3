"""``durq queue ls|pause|unpause|run-all|delete-all|partitions|unique``: queues, their
sizes, the partitions of their fair limits and the unique keys they hold (I1, I3, I4)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

import typer

from durq.app import App
from durq.brokers.views import FairDepth, PartitionDepth, QueueStats
from durq.cli.common import (
    BrokerOpt,
    JsonOpt,
    confirm_or_refuse,
    console,
    fmt_age,
    fmt_time,
    make_table,
    print_json,
    run,
)
from durq.inspector import Inspector, UniqueList, parse_state
from durq.states import TaskState

group = typer.Typer(
    name="queue",
    help="List, pause and resume queues.",
    epilog=(
        "Examples:\n\n"
        "  durq queue ls\n\n"
        "  durq queue pause emails      (workers take nothing from it; enqueue still works)\n\n"
        "  durq queue unpause emails\n\n"
        "  durq queue run-all emails --state archived\n\n"
        "  durq queue delete-all emails --state archived --yes   (no question asked)\n\n"
        "  durq queue partitions reports --top 50   (fair limits: the busiest partitions)\n\n"
        "  durq queue unique crm   (unique keys held, debounced tasks and when they run)\n\n"
        "  durq queue ls --json"
    ),
    no_args_is_help=True,
)

QueueArg = Annotated[str, typer.Argument(metavar="QUEUE", help="Queue name.")]
StateOpt = Annotated[str, typer.Option("--state", "-s", help="Which tasks of the queue.")]


def print_queues(queues: list[QueueStats]) -> None:
    """Queues as one table: sizes per state, oldest pending age, counters."""
    table = make_table("queues", caption="* paused; today/total: attempts processed/failed")
    table.add_column("queue", style="bold", no_wrap=True)
    for state in TaskState:
        table.add_column(state.value, justify="right")
    table.add_column("oldest", justify="right")
    table.add_column("today", justify="right")
    table.add_column("total", justify="right")
    for q in queues:
        table.add_row(
            f"{q.name}[red]*[/]" if q.paused else q.name,
            *(str(q.sizes.get(state, 0)) for state in TaskState),
            fmt_age(q.oldest_pending_age) if q.sizes.get(TaskState.PENDING) else "-",
            f"{q.processed_today}/{q.failed_today}",
            f"{q.processed_total}/{q.failed_total}",
        )
    console.print(table)


@group.command("ls")
def ls_command(broker: BrokerOpt = None, as_json: JsonOpt = False) -> None:
    """List every known queue with its size per state."""

    async def body(app: App) -> list[QueueStats]:
        return await app.inspector.list_queues()

    queues = run(broker, body)
    if as_json:
        print_json([q.to_dict() for q in queues])
    elif not queues:
        console.print("no queues yet (a queue appears when a task is enqueued into it)")
    else:
        print_queues(queues)


def _set_paused(queue: str, paused: bool, broker: str | None, as_json: bool) -> None:
    async def body(app: App) -> None:
        if paused:
            await app.inspector.pause_queue(queue)
        else:
            await app.inspector.unpause_queue(queue)

    run(broker, body)
    if as_json:
        print_json({"queue": queue, "paused": paused})
    else:
        console.print(f"queue {queue} {'paused' if paused else 'resumed'}")


@group.command("pause")
def pause_command(queue: QueueArg, broker: BrokerOpt = None, as_json: JsonOpt = False) -> None:
    """Pause a queue: workers take nothing from it; enqueue still works."""
    _set_paused(queue, True, broker, as_json)


@group.command("unpause")
def unpause_command(queue: QueueArg, broker: BrokerOpt = None, as_json: JsonOpt = False) -> None:
    """Resume a paused queue."""
    _set_paused(queue, False, broker, as_json)


def _bulk(
    act: Callable[[Inspector, str, TaskState], Awaitable[int]],
    queue: str,
    state: str,
    broker: str | None,
    as_json: bool,
    *,
    key: str,
    done: str,
) -> None:
    """Run a whole-queue action on the tasks in ``state`` and report how many it touched."""
    wanted = parse_state(state)

    async def body(app: App) -> int:
        return await act(app.inspector, queue, wanted)

    count = run(broker, body)
    if as_json:
        print_json({"queue": queue, "state": wanted.value, key: count})
    else:
        console.print(f"{count} {wanted.value} task(s) of {queue} {done}")


@group.command("run-all")
def run_all_command(
    queue: QueueArg,
    state: StateOpt = "archived",
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make every scheduled, retry or archived task of a queue pending now."""
    _bulk(Inspector.run_all, queue, state, broker, as_json, key="run", done="queued to run")


@group.command("delete-all")
def delete_all_command(
    queue: QueueArg,
    state: StateOpt = "archived",
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help="Do not ask (required when there is no terminal to ask on)."
        ),
    ] = False,
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete every task of a queue in one state (not active). Asks first on a terminal;
    without a terminal it refuses unless --yes is given."""
    wanted = parse_state(state)
    confirm_or_refuse(f"Delete every {wanted.value} task of queue {queue!r}?", yes)
    _bulk(Inspector.delete_all, queue, state, broker, as_json, key="deleted", done="deleted")


def _partition_row(p: PartitionDepth, label: str | None = None) -> tuple[str, ...]:
    return (label or p.key, str(p.pending), str(p.running), str(p.partitions))


def print_partitions(seen: FairDepth) -> None:
    """Each fair template with its totals, then the busiest partitions and the rest."""
    table = make_table(f"fair partitions of {seen.queue}", caption="pending includes held tasks")
    table.add_column("template / key", overflow="fold")
    for name in ("pending", "running", "partitions"):
        table.add_column(name, justify="right")
    for t in seen.templates:
        table.add_row(*_partition_row(t, f"[bold]{t.template}[/]"))
    table.add_section()
    for p in seen.top:
        table.add_row(*_partition_row(p))
    others = seen.others
    if others.partitions:
        table.add_row(*_partition_row(others, f"[dim]{others.partitions} other partition(s)[/]"))
    console.print(table)


@group.command("partitions")
def partitions_command(
    queue: QueueArg,
    top: Annotated[
        int, typer.Option("--top", "-n", help="How many partitions to show one by one (1..1000).")
    ] = 20,
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Fair limits of a queue (Limit(..., fair=True)): each key template, and the partitions
    with the most tasks waiting and running, biggest first; the rest summed."""

    async def body(app: App) -> FairDepth:
        return await app.inspector.fair_partitions(queue, top)

    seen = run(broker, body)
    if as_json:
        print_json(seen.to_dict())
    elif not seen.templates:
        console.print(f"no task of {queue} waits or runs under a fair limit")
    else:
        print_partitions(seen)


def print_unique(queue: str, page: UniqueList) -> None:
    """Unique keys held, soonest due first; debounced tasks with when they run at the latest."""
    shown = len(page.entries)
    more = "" if page.complete else " (of the keys read: more are held)"
    table = make_table(
        f"unique keys held in {queue}",
        caption=f"{shown} of {page.total}{more}; latest: a debounced task's max_wait",
    )
    for name in ("task", "type", "state", "due", "holds until", "debounce", "latest", "key"):
        table.add_column(name, overflow="fold", no_wrap=name in ("due", "holds until", "latest"))
    for e in page.entries:
        debounce = "-"
        if e.wait is not None:
            debounce = f"{e.wait:g}s" + ("" if e.max_wait is None else f" / max {e.max_wait:g}s")
        table.add_row(
            e.task_id, e.type, e.state.value, fmt_time(e.due),
            "it finishes" if e.until is None else fmt_time(e.until),
            debounce, fmt_time(e.latest), e.key[:16],
        )  # fmt: skip
    console.print(table)


@group.command("unique")
def unique_command(
    queue: QueueArg,
    limit: Annotated[
        int, typer.Option("--limit", "-n", help="How many keys to show (1..1000).")
    ] = 50,
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Unique keys the tasks of a queue hold now (unique=, durq.Unique, durq.Debounce), soonest
    due first: the task, its state, when it is due and, for a debounced task, when it runs at
    the latest."""

    async def body(app: App) -> UniqueList:
        return await app.inspector.list_unique(queue, limit=limit)

    page = run(broker, body)
    if as_json:
        print_json({"queue": queue, **page.to_dict()})
    elif not page.entries:
        console.print(f"no task of {queue} holds a unique key now")
    else:
        print_unique(queue, page)


def register(app: typer.Typer) -> None:
    """Add ``durq queue ...``."""
    app.add_typer(group)
