"""``durq schedule``: periodic schedules kept in the broker, changed at run time."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from durq.app import App
from durq.cli.common import (
    BrokerOpt,
    JsonOpt,
    console,
    escape,
    examples,
    load_app,
    make_table,
    parse_json_object,
    print_json,
    run,
)
from durq.periodic import PeriodicEntry
from durq.schedules import BackfillResult

group = typer.Typer(
    name="schedule",
    help="Create, list, pause, resume, trigger, backfill and delete stored periodic schedules.",
    epilog=examples(
        "durq schedule add report:eu '0 9 * * 1-5' report:build --payload '{\"region\": \"eu\"}' "
        "--tz Europe/Berlin --overlap skip",
        "durq schedule ls --app myproject.tasks:app",
        "durq schedule edit report:eu --cron '0 10 * * 1-5' --overlap buffer_one",
        "durq schedule pause report:eu",
        "durq schedule trigger report:eu",
        "durq schedule backfill report:eu --from 2026-01-05T00:00Z --to 2026-01-09T23:59Z "
        "--dry-run",
        "durq schedule rm report:eu",
    ),
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The schedule's name.")]
AppOpt = Annotated[
    str | None,
    typer.Option(
        "--app",
        metavar="APP",
        help="Also know this app's code schedules (module:attribute): listed, and their "
        "names refused for stored ones.",
    ),
]


def _target(app_path: str | None, broker: str | None) -> str | App | None:
    return load_app(app_path, broker) if app_path else broker


def _when(ts: float | None) -> str:
    return "-" if not ts else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _show(entries: list[PeriodicEntry], as_json: bool) -> None:
    if as_json:
        print_json([e.to_dict() for e in entries])
        return
    if not entries:
        console.print("no schedules")
        return
    table = make_table()
    for column in ("name", "source", "schedule", "tz", "type", "queue", "overlap", "state"):
        table.add_column(column, overflow="fold")
    table.add_column("updated (UTC)")
    for e in entries:
        table.add_row(
            escape(e.name),
            e.source,
            escape(e.spec),
            e.tz,
            escape(e.type),
            escape(e.queue or "-"),
            e.overlap,
            "paused" if e.paused else "active",
            _when(e.updated_at),
        )
    console.print(table)


@group.command("add")
def add_command(
    name: NameArg,
    cron: Annotated[
        str, typer.Argument(metavar="CRON", help="'*/5 * * * *', '@daily', '@every 30s'.")
    ],
    type: Annotated[str, typer.Argument(metavar="TYPE", help="The task type each tick enqueues.")],
    payload: Annotated[
        str | None, typer.Option("--payload", "-p", help="The payload, a JSON object.")
    ] = None,
    tz: Annotated[str | None, typer.Option("--tz", help="IANA time zone [default: UTC].")] = None,
    overlap: Annotated[
        str,
        typer.Option(
            "--overlap",
            help="While the previous run is unfinished: allow, skip, buffer_one, cancel_other.",
        ),
    ] = "allow",
    queue: Annotated[
        str | None, typer.Option("--queue", "-q", help="[default: the type's queue]")
    ] = None,
    paused: Annotated[bool, typer.Option("--paused", help="Store it paused.")] = False,
    app_path: AppOpt = None,
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Store a new schedule; running schedulers pick it up within seconds."""
    data = parse_json_object(payload)

    async def body(app: App) -> PeriodicEntry:
        return await app.stored_schedules.add(
            name, cron, type, payload=data, queue=queue, tz=tz, overlap=overlap, paused=paused
        )

    _show([run(_target(app_path, broker), body)], as_json)


@group.command("edit")
def edit_command(
    name: NameArg,
    cron: Annotated[str | None, typer.Option("--cron", help="A new schedule.")] = None,
    type: Annotated[str | None, typer.Option("--type", help="A new task type.")] = None,
    payload: Annotated[
        str | None, typer.Option("--payload", "-p", help="A new payload, a JSON object.")
    ] = None,
    tz: Annotated[str | None, typer.Option("--tz", help="A new time zone.")] = None,
    overlap: Annotated[str | None, typer.Option("--overlap", help="A new overlap policy.")] = None,
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="A new queue.")] = None,
    app_path: AppOpt = None,
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change the given fields of a stored schedule; schedulers pick it up within seconds."""
    changes: dict[str, Any] = {"schedule": cron, "type": type, "tz": tz, "overlap": overlap}
    if payload is not None:
        changes["payload"] = parse_json_object(payload)
    if queue is not None:
        changes["queue"] = queue

    async def body(app: App) -> PeriodicEntry:
        return await app.stored_schedules.update(name, **changes)

    _show([run(_target(app_path, broker), body)], as_json)


@group.command("ls")
def ls_command(app_path: AppOpt = None, broker: BrokerOpt = None, as_json: JsonOpt = False) -> None:
    """List the stored schedules (and, with --app, the app's code schedules first)."""

    async def body(app: App) -> list[PeriodicEntry]:
        return await app.stored_schedules.list()

    _show(run(_target(app_path, broker), body), as_json)


def _action(verb: str, name: str, app_path: str | None, broker: str | None, as_json: bool) -> None:
    async def body(app: App) -> PeriodicEntry:
        return await getattr(app.stored_schedules, verb)(name)  # type: ignore[no-any-return]

    _show([run(_target(app_path, broker), body)], as_json)


@group.command("pause")
def pause_command(
    name: NameArg, app_path: AppOpt = None, broker: BrokerOpt = None, as_json: JsonOpt = False
) -> None:
    """Stop a stored schedule's ticks (runs already enqueued go on)."""
    _action("pause", name, app_path, broker, as_json)


@group.command("resume")
def resume_command(
    name: NameArg, app_path: AppOpt = None, broker: BrokerOpt = None, as_json: JsonOpt = False
) -> None:
    """Let a paused schedule tick again, from its next tick."""
    _action("resume", name, app_path, broker, as_json)


@group.command("rm")
def rm_command(
    name: NameArg, app_path: AppOpt = None, broker: BrokerOpt = None, as_json: JsonOpt = False
) -> None:
    """Delete a stored schedule (runs already enqueued go on)."""

    async def body(app: App) -> None:
        await app.stored_schedules.remove(name)

    run(_target(app_path, broker), body)
    if as_json:
        print_json({"deleted": name})
    else:
        console.print(f"deleted schedule {escape(name)}")


@group.command("trigger")
def trigger_command(
    name: NameArg, app_path: AppOpt = None, broker: BrokerOpt = None, as_json: JsonOpt = False
) -> None:
    """Enqueue one run of a schedule now, with its own task id."""

    async def body(app: App) -> Any:
        return await app.stored_schedules.trigger(name)

    info = run(_target(app_path, broker), body)
    if as_json:
        print_json(info.to_dict())
    else:
        console.print(f"enqueued {escape(info.id)} in queue {escape(info.queue)}")


@group.command("backfill")
def backfill_command(
    name: NameArg,
    start: Annotated[
        str, typer.Option("--from", metavar="ISO", help="First instant (ISO 8601; naive: UTC).")
    ],
    end: Annotated[str, typer.Option("--to", metavar="ISO", help="Last instant (included).")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List the ticks; enqueue nothing.")
    ] = False,
    app_path: AppOpt = None,
    broker: BrokerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Enqueue the ticks between two instants (at most 1000), each under its tick's id: a
    tick that ran already is left alone."""

    async def body(app: App) -> BackfillResult:
        return await app.stored_schedules.backfill(name, start, end, dry_run=dry_run)

    result = run(_target(app_path, broker), body)
    if as_json:
        print_json(result.to_dict())
        return
    for tick in result.ticks:
        console.print(_when(tick))
    if dry_run:
        console.print(f"{len(result.ticks)} tick(s); nothing enqueued (--dry-run)")
    else:
        console.print(f"{len(result.enqueued)} enqueued, {len(result.existing)} existed already")


def register(app: typer.Typer) -> None:
    """Add ``durq schedule ...``."""
    app.add_typer(group)
