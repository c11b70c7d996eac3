"""``durq enqueue TYPE``: queue one task from the shell (no handler needed here)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer

from durq import durations, ranges
from durq.app import App
from durq.cli.common import (
    BrokerOpt,
    JsonOpt,
    UsageFailure,
    load_app,
    parse_json_object,
    print_json,
    run,
)
from durq.cli.task import print_task
from durq.task import TaskInfo

EPILOG = (
    "Examples:\n\n"
    '  durq enqueue email:send --payload \'{"to": "a@b.c"}\'\n\n'
    "  durq enqueue report:build --queue low --process-in 30s --max-retry 3\n\n"
    "  durq enqueue report:build --priority 10   (claimed before lower priorities)\n\n"
    "  durq enqueue report:build --app examples.quickstart:app   (the task's own options)\n\n"
    '  durq enqueue email:send --payload \'{"to": "a@b.c"}\' --task-id order-1 --json\n\n'
    "A second enqueue with the same --task-id in the same queue is refused (exit 1) and the "
    "message names the existing task's state."
)


def _moment(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageFailure(
            f"--process-at must be an ISO 8601 time (e.g. 2030-01-01T09:00:00+00:00), got {text!r}"
        ) from None


def _duration(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    return ranges.seconds(flag, text, high=durations.MAX_DURATION)


def enqueue_command(
    type: Annotated[str, typer.Argument(metavar="TYPE", help="Task type, e.g. email:send.")],
    payload: Annotated[
        str | None, typer.Option("--payload", "-p", help="The payload, a JSON object.")
    ] = None,
    queue: Annotated[
        str | None,
        typer.Option("--queue", "-q", help="Queue [default: default]", show_default=False),
    ] = None,
    task_id: Annotated[
        str | None, typer.Option("--task-id", help="Idempotency key: one task per id and queue.")
    ] = None,
    process_in: Annotated[
        str | None, typer.Option("--process-in", help="Delay, e.g. 30s, 5m, 1h.")
    ] = None,
    process_at: Annotated[
        str | None, typer.Option("--process-at", help="Run at this ISO 8601 time.")
    ] = None,
    max_retry: Annotated[
        int | None, typer.Option("--max-retry", help="Retries before archiving [default: 25]")
    ] = None,
    timeout: Annotated[str | None, typer.Option("--timeout", help="Per attempt, e.g. 10s.")] = None,
    unique: Annotated[
        str | None, typer.Option("--unique", help="Refuse identical tasks for this long, e.g. 1h.")
    ] = None,
    retention: Annotated[
        str | None,
        typer.Option(
            "--retention",
            help="Keep the completed task this long (default 1h; 0: delete at once), e.g. 24h.",
        ),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority",
            help="-100 to 100; higher is claimed first within the queue [default: 0]",
        ),
    ] = None,
    app_path: Annotated[
        str | None,
        typer.Option(
            "--app",
            envvar="DURQ_APP",
            metavar="APP",
            help="Use this app's task options (queue, retries, retention, payload model), "
            "as module:attribute.",
        ),
    ] = None,
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Enqueue one task and print it.

    Without --app the task gets durq's defaults (queue default, 25 retries, kept an hour after
    success); with --app it gets the options its @app.task declares."""
    data = parse_json_object(payload)
    if max_retry is not None and max_retry < 0:
        raise UsageFailure("--max-retry must be >= 0")
    options: dict[str, Any] = {
        "queue": queue,
        "task_id": task_id,
        "process_in": _duration(process_in, "--process-in"),
        "process_at": _moment(process_at),
        "max_retry": max_retry,
        "timeout": _duration(timeout, "--timeout"),
        "unique": _duration(unique, "--unique"),
        "retention": _duration(retention, "--retention"),
        "priority": priority,
    }

    async def body(app: App) -> TaskInfo:
        return await app.enqueue(type, data, **options)

    info = run(load_app(app_path, broker) if app_path else broker, body)
    if as_json:
        print_json(info.to_dict())
    else:
        print_task(info, title=f"enqueued {info.id}")


def register(app: typer.Typer) -> None:
    """Add ``durq enqueue``."""
    app.command("enqueue", epilog=EPILOG)(enqueue_command)
