"""``durq task get|ls|run|delete|archive|cancel|signal``: one task, or a queue's tasks by state (I2, I3)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

import typer

from durq import codec, groups, ranges, workflows
from durq.app import App
from durq.cli.common import (
    BrokerOpt,
    JsonOpt,
    QueueOpt,
    UsageFailure,
    console,
    escape,
    examples,
    fmt_time,
    make_table,
    parse_json,
    print_json,
    run,
)
from durq.errors import StepError
from durq.inspector import parse_state
from durq.steps import check_signal_name
from durq.task import TaskInfo

group = typer.Typer(
    name="task",
    help="Look at and act on tasks.",
    epilog=(
        "Examples:\n\n"
        "  durq task ls --queue default --state archived\n\n"
        "  durq task get 3f2a... --queue default --json\n\n"
        "  durq task run 3f2a... --queue default     (archived/retry/scheduled -> pending now)\n\n"
        "  durq task cancel 3f2a... --queue default  (an active handler is cancelled)"
    ),
    no_args_is_help=True,
)

GET_EPILOG = examples(
    "durq task get welcome-1 --queue default",
    "durq task get welcome-1 --queue default --json | jq .result",
)
LS_EPILOG = examples(
    "durq task ls --queue default --state archived",
    "durq task ls --queue default --state completed --limit 100 --page 2",
    "durq task ls --queue default --state retry --json | jq -r '.[].id'",
)
RUN_EPILOG = examples(
    "durq task run charge-7 --queue payments   (archived, retry or scheduled: pending now)",
    "durq task run charge-7 --queue payments --json",
)
ARCHIVE_EPILOG = examples(
    "durq task archive report-42 --queue default",
    "durq task archive report-42 --queue default --json",
)
SIGNAL_EPILOG = examples(
    "durq task signal coverage:ord_1 partner-callback --queue insurance "
    '--data \'{"policy": "POL-1"}\'',
    "durq task signal import-9 go --queue default --json",
)
CANCEL_EPILOG = examples(
    "durq task cancel import-9 --queue default   (an active handler is cancelled)"
)
DELETE_EPILOG = examples(
    "durq task delete welcome-1 --queue default",
    "durq task delete welcome-1 --queue default --json",
)

IdArg = Annotated[str, typer.Argument(metavar="ID", help="The task id.")]

_STATE_STYLE = {
    "pending": "cyan",
    "scheduled": "blue",
    "active": "yellow",
    "retry": "magenta",
    "archived": "red",
    "completed": "green",
}


def styled_state(state: str) -> str:
    """A state name coloured for tables."""
    return f"[{_STATE_STYLE.get(state, 'white')}]{state}[/]"


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def print_task(info: TaskInfo, *, title: str | None = None) -> None:
    """One task as a two-column table. Piped, every field is one line (a traceback too);
    on a terminal a multi-line value folds in its cell."""
    from rich.table import Table

    from durq.cli.tables import RowTable

    data = info.to_dict()
    kind = Table if console.is_terminal else RowTable
    table = kind(title=title or f"task {info.id}", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for key in (
        "id", "queue", "type", "state", "priority", "attempts", "last_error", "payload",
        "result", "timeout", "deadline", "next_process_at", "enqueued_at", "unique", "started_at",
        "completed_at", "retention", "worker_id", "snoozes", "progress", "logs", "steps",
        "traceback",
    ):  # fmt: skip
        value = info.attempts_label if key == "attempts" else data.get(key)
        if key == "progress" and info.progress is not None:
            value = info.progress.describe()
        elif key == "logs":
            value = "\n".join(line.describe() for line in info.logs) or None
        elif key == "steps":
            value = "\n".join(step.describe() for step in info.steps) or None
        elif key == "unique":
            value = info.describe_unique()
        elif key == "snoozes" and not info.snoozes:
            value = None
        if value is None or (value == {} and key != "payload"):
            continue
        if key == "state":
            text = styled_state(str(value))
        elif key in ("payload", "result") and codec.is_sealed(
            info.raw_payload if key == "payload" else info.raw_result
        ):
            text = "(encrypted)"
        elif key in ("payload", "result"):
            text = json.dumps(value, ensure_ascii=False, default=str)
        else:
            text = str(value)
        table.add_row(key, text if key == "state" else escape(text))
    member_of = groups.member_of(info)
    if member_of is not None:  # durq group get shows its progress
        table.add_row("group", escape(f"{member_of[0]} (queue {member_of[1]})"))
    node = workflows.header_of(info.headers)
    if node is not None:  # durq workflow get shows its progress
        text = f"{node.get('id')} ({node.get('name')}), node {node.get('node')}"
        table.add_row("workflow", escape(text))
    console.print(table)


def print_tasks(tasks: Sequence[TaskInfo], *, title: str) -> None:
    """Several tasks as one table."""
    table = make_table(title)
    for name in (
        "id", "type", "state", "priority", "attempts", "next / done at", "last error / result",
    ):  # fmt: skip
        table.add_column(name, overflow="fold")
    for info in tasks:
        state = info.state.value
        when = info.completed_at if state == "completed" else info.next_process_at
        try:
            detail = info.last_error or ""
            if info.raw_result is not None and not detail:
                sealed = codec.is_sealed(info.raw_result)
                detail = "(encrypted)" if sealed else _short(info.result)
        except ValueError:
            detail = "(undecodable result)"
        table.add_row(
            info.id,
            info.type,
            styled_state(state),
            str(info.priority),
            info.attempts_label,
            fmt_time(when),
            escape(_short(detail)),
        )
    console.print(table)


@group.command("get", epilog=GET_EPILOG)
def get_command(
    task_id: IdArg, queue: QueueOpt = "default", broker: BrokerOpt = None, as_json: JsonOpt = False
) -> None:
    """Show one task (exit 1 if there is no such task)."""

    async def body(app: App) -> TaskInfo:
        return await app.inspector.get_task_info(queue, task_id)

    info = run(broker, body)
    if as_json:
        print_json(info.to_dict())
    else:
        print_task(info)


@group.command("ls", epilog=LS_EPILOG)
def ls_command(
    queue: QueueOpt = "default",
    state: Annotated[
        str,
        typer.Option(
            "--state",
            "-s",
            help="pending, scheduled, active, retry, archived, completed or waiting.",
        ),
    ] = "pending",
    limit: Annotated[int, typer.Option("--limit", help="Tasks per page (1..1000).")] = 50,
    page: Annotated[int, typer.Option("--page", help="Page number, from 1.")] = 1,
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the tasks of a queue in one state, oldest first."""
    wanted = parse_state(state)
    ranges.integer("--limit", limit, 1, 1000)
    ranges.integer("--page", page, 1, 1_000_000)

    async def body(app: App) -> list[TaskInfo]:
        return await app.inspector.list_tasks(queue, wanted, limit=limit, offset=(page - 1) * limit)

    tasks = run(broker, body)
    if as_json:
        print_json([t.summary() for t in tasks])
    elif not tasks:
        console.print(f"no {wanted.value} tasks in queue {queue!r} (page {page})")
    else:
        print_tasks(tasks, title=f"{queue}: {wanted.value} (page {page}, {len(tasks)} shown)")


def _act(
    broker: str | None,
    as_json: bool,
    act: Callable[[App], Awaitable[TaskInfo]],
    done: str,
) -> None:
    info = run(broker, act)
    if as_json:
        print_json(info.to_dict())
    else:
        console.print(f"task {info.id} {done}: now {styled_state(info.state.value)}")


@group.command("run", epilog=RUN_EPILOG)
def run_command(
    task_id: IdArg, queue: QueueOpt = "default", broker: BrokerOpt = None, as_json: JsonOpt = False
) -> None:
    """Make a scheduled, retry or archived task pending now."""
    _act(broker, as_json, lambda app: app.inspector.run_task(queue, task_id), "queued to run")


@group.command("archive", epilog=ARCHIVE_EPILOG)
def archive_command(
    task_id: IdArg, queue: QueueOpt = "default", broker: BrokerOpt = None, as_json: JsonOpt = False
) -> None:
    """Archive a pending, scheduled or retry task."""
    _act(broker, as_json, lambda app: app.inspector.archive_task(queue, task_id), "archived")


@group.command("cancel", epilog=CANCEL_EPILOG)
def cancel_command(
    task_id: IdArg, queue: QueueOpt = "default", broker: BrokerOpt = None, as_json: JsonOpt = False
) -> None:
    """Cancel a task; an active one's handler is cancelled by its worker."""
    info = run(broker, lambda app: app.inspector.cancel_task(queue, task_id))
    if as_json:
        print_json(info.to_dict())
    elif info.state.value == "active":
        # Only a request: the worker holding the task cancels its handler at its next heartbeat.
        console.print(
            f"task {info.id} cancel requested: still {styled_state('active')}, its worker "
            "cancels the handler and archives it"
        )
    else:
        console.print(f"task {info.id} cancelled: now {styled_state(info.state.value)}")


@group.command("signal", epilog=SIGNAL_EPILOG)
def signal_command(
    task_id: IdArg,
    name: Annotated[str, typer.Argument(metavar="NAME", help="The signal's name.")],
    data: Annotated[
        str | None, typer.Option("--data", help="The signal's payload, any JSON (default null).")
    ] = None,
    queue: QueueOpt = "default",
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Deliver a signal to a task that waits, or will wait, for it (ctx.wait_for)."""
    try:
        check_signal_name(name)
    except StepError as exc:
        raise UsageFailure(str(exc)) from None
    payload = None if data is None else parse_json(data, "--data")

    async def body(app: App) -> bool:
        return await app.signal(task_id, name, payload, queue=queue)

    delivered = run(broker, body)
    if as_json:
        print_json({"queue": queue, "id": task_id, "name": name, "delivered": delivered})
    elif delivered:
        console.print(f"signal {name!r} delivered to task {task_id}")
    else:
        console.print(f"signal {name!r} was delivered to task {task_id} before: nothing changed")


@group.command("delete", epilog=DELETE_EPILOG)
def delete_command(
    task_id: IdArg, queue: QueueOpt = "default", broker: BrokerOpt = None, as_json: JsonOpt = False
) -> None:
    """Delete a task that is not active (cancel an active one first)."""

    async def body(app: App) -> None:
        await app.inspector.delete_task(queue, task_id)

    run(broker, body)
    if as_json:
        print_json({"id": task_id, "queue": queue, "deleted": True})
    else:
        console.print(f"task {task_id} deleted")


def register(app: typer.Typer) -> None:
    """Add ``durq task ...``."""
    app.add_typer(group)
