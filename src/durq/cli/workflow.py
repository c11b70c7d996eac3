"""``durq workflow get|ls|cancel``: workflows (app.enqueue_workflow) from their stored record
and their nodes' tasks."""

from __future__ import annotations

from typing import Annotated

import typer

from durq import durations, ranges
from durq.app import App
from durq.cli.common import (
    BrokerOpt,
    JsonOpt,
    console,
    escape,
    examples,
    fmt_time,
    make_table,
    one_field,
    print_json,
    run,
)
from durq.cli.task import styled_state
from durq.inspector import WorkflowList
from durq.workflow_progress import WORKFLOW_STATES, WorkflowProgress

group = typer.Typer(
    name="workflow",
    help="Look at and cancel workflows (app.enqueue_workflow): progress, nodes, edges.",
    no_args_is_help=True,
)

GET_EPILOG = examples(
    "durq workflow get 7f3a...",
    "durq workflow get 7f3a... --json | jq '.nodes[] | select(.state == \"archived\")'",
)
LS_EPILOG = examples(
    "durq workflow ls",
    "durq workflow ls --state failed --newer-than 1d",
    "durq workflow ls --state running --json | jq -r '.workflows[].id'",
)
CANCEL_EPILOG = examples("durq workflow cancel 7f3a...")

IdArg = Annotated[str, typer.Argument(metavar="ID", help="The workflow id.")]

#: How a workflow's state is coloured.
_STYLE = {"running": "cyan", "succeeded": "green", "failed": "red", "cancelled": "yellow"}


def styled_workflow_state(state: str) -> str:
    """A workflow state coloured for tables."""
    return f"[{_STYLE.get(state, 'white')}]{state}[/]"


def _counts(info: WorkflowProgress) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(info.by_state.items()))


def print_workflow(info: WorkflowProgress) -> None:
    """A workflow's summary line, then one row per node in creation order."""
    console.print(
        f"workflow {escape(info.id)} ({escape(info.name)}): "
        f"{styled_workflow_state(info.state)}, {info.finished}/{info.total} finished "
        f"({_counts(info)}), created {fmt_time(info.created_at)}"
    )
    table = make_table("nodes")
    for name in ("node", "type", "state", "attempts", "after", "task", "last error"):
        table.add_column(name, overflow="fold")
    for n in info.nodes:
        state = "[dim]gone[/]" if n.state == "gone" else styled_state(n.state)
        table.add_row(
            escape(n.name),
            escape(n.type),
            state,
            str(n.attempts),
            escape(", ".join(n.after)) or "-",
            escape(f"{n.task_id} ({n.queue})"),
            escape(one_field(n.last_error or "")),
        )
    console.print(table)


def print_workflows(page: WorkflowList) -> None:
    """Workflows as one table, newest first, and how to see more."""
    table = make_table("workflows")
    for name in ("id", "name", "state", "nodes", "by state", "created"):
        table.add_column(name, overflow="fold")
    for w in page.workflows:
        table.add_row(
            escape(w.id),
            escape(w.name),
            styled_workflow_state(w.state),
            f"{w.finished}/{w.total}",
            escape(_counts(w)),
            fmt_time(w.created_at),
        )
    console.print(table)
    if page.cursor is not None:
        console.print(f"more: --cursor {escape(page.cursor)}")


@group.command("get", epilog=GET_EPILOG)
def get_command(workflow_id: IdArg, broker: BrokerOpt = None, as_json: JsonOpt = False) -> None:
    """Show a workflow and each node's state, attempts, dependencies (exit 1 if unknown)."""

    async def body(app: App) -> WorkflowProgress:
        return await app.inspector.get_workflow(workflow_id)

    info = run(broker, body)
    if as_json:
        print_json(info.to_dict())
    else:
        print_workflow(info)


def _age(flag: str, text: str | None) -> float | None:
    return None if text is None else ranges.seconds(flag, text, high=durations.MAX_DURATION)


@group.command("ls", epilog=LS_EPILOG)
def ls_command(
    state: Annotated[
        str | None,
        typer.Option("--state", "-s", help=", ".join(WORKFLOW_STATES) + " (default: any)."),
    ] = None,
    newer_than: Annotated[
        str | None,
        typer.Option("--newer-than", help="Created at most this long ago (e.g. 90s, 2h, 1d)."),
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option("--older-than", help="Created more than this long ago (e.g. 1d)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="At most this many.")] = 50,
    cursor: Annotated[
        str | None, typer.Option("--cursor", help="Go on after a previous listing.")
    ] = None,
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List workflows, newest first."""
    newer = _age("--newer-than", newer_than)
    older = _age("--older-than", older_than)

    async def body(app: App) -> WorkflowList:
        return await app.inspector.list_workflows(
            state=state, newer_than=newer, older_than=older, limit=limit, cursor=cursor
        )

    page = run(broker, body)
    if as_json:
        print_json(
            {
                "workflows": [w.to_dict(nodes=False) for w in page.workflows],
                "cursor": page.cursor,
            }
        )
    else:
        print_workflows(page)


@group.command("cancel", epilog=CANCEL_EPILOG)
def cancel_command(workflow_id: IdArg, broker: BrokerOpt = None, as_json: JsonOpt = False) -> None:
    """Cancel every unfinished node, running ones too (exit 1 if the workflow is unknown)."""
    cancelled = run(broker, lambda app: app.cancel_workflow(workflow_id))
    if as_json:
        print_json({"id": workflow_id, "cancelled": cancelled})
    else:
        console.print(f"workflow {escape(workflow_id)}: {cancelled} node(s) cancelled")


def register(app: typer.Typer) -> None:
    """Add ``durq workflow ...``."""
    app.add_typer(group)
