"""Periodic schedules kept in the broker (``app.stored_schedules``).

Code declares schedules at import time (:mod:`durq.periodic`); operators add, edit, pause,
resume, trigger, backfill and delete these ones at run time, through this API, ``durq
schedule`` or the dashboard. Both kinds tick the same way: every scheduler reloads the stored
ones every few seconds and enqueues each tick with the task id ``periodic:<name>:<tick>``,
so a tick is enqueued once however many schedulers run (the broker refuses the same id
twice).

A name is either a code entry or a stored one: code entries are read-only here (listed with
``source="code"``) and a stored schedule of the same name is refused. If a deploy declares in
code a name that is stored already, the code entry wins and schedulers ignore the stored
record until it is removed.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from durq.brokers.views import ScheduleRecord
from durq.errors import (
    ConfigurationError,
    DuplicateTaskError,
    ScheduleConflictError,
    ScheduleNotFoundError,
    TaskIDConflictError,
    ValidationError,
)
from durq.periodic import PeriodicEntry

if TYPE_CHECKING:
    from durq.brokers import FullBroker
    from durq.brokers.params import EnqueueParams
    from durq.clock import Clock
    from durq.options import EnqueueRequest
    from durq.periodic import PeriodicRegistry
    from durq.task import TaskInfo

#: A backfill enqueues at most this many ticks; a wider range is refused (narrow it).
MAX_BACKFILL = 1000

#: How often a read-modify-write of a stored record is tried when another writer was first.
_EDIT_ATTEMPTS = 5

_UNSET: Any = object()


def record_of(entry: PeriodicEntry) -> ScheduleRecord:
    """The stored form of a (validated) entry, fenced by the entry's version."""
    return ScheduleRecord(
        name=entry.name,
        spec=entry.spec,
        type=entry.type,
        payload=json.dumps(entry.payload, separators=(",", ":")),
        queue=entry.queue,
        tz=entry.tz,
        overlap=entry.overlap,
        paused=entry.paused,
        version=entry.version,
    )


def entry_of(schedules: PeriodicRegistry, record: ScheduleRecord) -> PeriodicEntry:
    """A stored record as an entry of ``schedules`` (ConfigurationError if it is no longer valid,
    e.g. its payload no longer fits the task's model)."""
    try:
        payload = json.loads(record.payload)
    except ValueError as exc:
        raise ConfigurationError(f"stored schedule {record.name!r}: bad payload: {exc}") from None
    return schedules.build(
        record.spec,
        record.type,
        payload=payload,
        queue=record.queue,
        tz=record.tz,
        overlap=record.overlap,
        name=record.name,
        source="stored",
        paused=record.paused,
        version=record.version,
        updated_at=record.updated_at,
    )


def to_epoch(moment: datetime | float | str) -> float:
    """Epoch seconds from a datetime (naive: UTC), an ISO 8601 text, or a number."""
    if isinstance(moment, int | float):
        return float(moment)
    if isinstance(moment, str):
        try:
            moment = datetime.fromisoformat(moment)
        except ValueError:
            raise ValidationError(f"{moment!r} is not an ISO 8601 time") from None
    if not isinstance(moment, datetime):
        raise ValidationError(f"expected a datetime, got {type(moment).__name__}")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@dataclass(frozen=True)
class BackfillResult:
    """The ticks of a backfilled range, and what became of each."""

    name: str
    #: Every tick in the range, oldest first (epoch seconds).
    ticks: list[float]
    dry_run: bool
    #: Task ids created, and those that existed already (the tick had run: left alone).
    enqueued: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dry_run": self.dry_run,
            "ticks": [datetime.fromtimestamp(t, UTC).isoformat() for t in self.ticks],
            "enqueued": self.enqueued,
            "existing": self.existing,
        }


class ScheduleHost(Protocol):
    """What :class:`StoredSchedules` uses of its app."""

    @property
    def clock(self) -> Clock: ...
    @property
    def schedules(self) -> PeriodicRegistry: ...
    async def broker(self) -> FullBroker: ...
    def params(self, request: EnqueueRequest) -> EnqueueParams: ...


class StoredSchedules:
    """The schedules of ``app`` kept in its broker, and the run-time actions on any schedule.

    Every method validates as :meth:`durq.App.add_periodic` does (ValidationError for bad
    input) and raises ScheduleNotFoundError for an unknown name and ScheduleConflictError
    for a name declared in code (read-only) or taken."""

    def __init__(self, app: ScheduleHost) -> None:
        self._app = app

    def _build(self, **options: Any) -> PeriodicEntry:
        try:
            return self._app.schedules.build(**options)
        except ConfigurationError as exc:
            raise ValidationError(exc.message) from None

    def _writable(self, name: str) -> None:
        if name in self._app.schedules:
            raise ScheduleConflictError(
                f"schedule {name!r} is declared in code: change it there (read-only here)"
            )

    async def list(self) -> list[PeriodicEntry]:
        """Code entries (``source="code"``) then stored ones, each by name. A stored record
        shadowed by a code entry of its name, or no longer valid, is left out."""
        broker = await self._app.broker()
        stored = []
        for record in await broker.admin.list_schedules():
            if record.name in self._app.schedules:
                continue
            try:
                stored.append(entry_of(self._app.schedules, record))
            except ConfigurationError:
                continue
        code = sorted(self._app.schedules, key=lambda e: e.name)
        return [*code, *stored]

    async def get(self, name: str) -> PeriodicEntry:
        """The schedule called ``name``, from code or the broker."""
        if name in self._app.schedules:
            return self._app.schedules.get(name)
        record = await (await self._app.broker()).admin.get_schedule(name)
        if record is None:
            raise ScheduleNotFoundError(f"no schedule named {name!r}")
        try:
            return entry_of(self._app.schedules, record)
        except ConfigurationError as exc:
            raise ValidationError(exc.message) from None

    async def add(
        self,
        name: str,
        schedule: str,
        type: str,
        *,
        payload: Any = None,
        queue: str | None = None,
        tz: str | None = None,
        overlap: str = "allow",
        paused: bool = False,
    ) -> PeriodicEntry:
        """Store a new schedule; it ticks within a few seconds (schedulers reload)."""
        entry = self._build(
            schedule=schedule,
            type=type,
            payload=payload,
            queue=queue,
            tz=tz,
            overlap=overlap,
            name=name,
            source="stored",
            paused=paused,
        )
        self._writable(entry.name)
        stored = await (await self._app.broker()).admin.put_schedule(record_of(entry))
        if stored is None:
            raise ScheduleConflictError(f"a schedule named {entry.name!r} is stored already")
        return entry_of(self._app.schedules, stored)

    async def update(
        self,
        name: str,
        *,
        schedule: str | None = None,
        type: str | None = None,
        payload: Any = _UNSET,
        queue: Any = _UNSET,
        tz: str | None = None,
        overlap: str | None = None,
    ) -> PeriodicEntry:
        """Change the given fields of a stored schedule (``queue=None``: the type's queue)."""

        def change(entry: PeriodicEntry) -> dict[str, Any]:
            return {
                "schedule": entry.spec if schedule is None else schedule,
                "type": type or entry.type,
                "payload": entry.payload if payload is _UNSET else payload,
                "queue": entry.queue if queue is _UNSET else queue,
                "tz": tz or entry.tz,
                "overlap": overlap or entry.overlap,
            }

        return await self._edit(name, change)

    async def pause(self, name: str) -> PeriodicEntry:
        """Stop a stored schedule's ticks (its runs already enqueued are left alone)."""
        return await self._edit(name, lambda entry: {"paused": True})

    async def resume(self, name: str) -> PeriodicEntry:
        """Let a paused schedule tick again, from its next tick (the missed ones are not
        caught up; backfill them if they are wanted)."""
        return await self._edit(name, lambda entry: {"paused": False})

    async def _edit(
        self, name: str, change: Callable[[PeriodicEntry], dict[str, Any]]
    ) -> PeriodicEntry:
        """Read, change, validate and store, fenced by the version read; again if another
        writer was first."""
        self._writable(name)
        broker = await self._app.broker()
        for _ in range(_EDIT_ATTEMPTS):
            record = await broker.admin.get_schedule(name)
            if record is None:
                raise ScheduleNotFoundError(f"no stored schedule named {name!r}")
            current = entry_of(self._app.schedules, record)
            options: dict[str, Any] = {
                "schedule": current.spec,
                "type": current.type,
                "payload": current.payload,
                "queue": current.queue,
                "tz": current.tz,
                "overlap": current.overlap,
                "paused": current.paused,
            }
            options.update(change(current))
            paused = options.pop("paused")
            entry = self._build(
                **options, name=name, source="stored", paused=paused, version=record.version
            )
            stored = await broker.admin.put_schedule(record_of(entry))
            if stored is not None:
                return entry_of(self._app.schedules, stored)
        raise ScheduleConflictError(f"schedule {name!r} keeps changing: try again")

    async def remove(self, name: str) -> None:
        """Delete a stored schedule; its runs already enqueued are left alone."""
        self._writable(name)
        if not await (await self._app.broker()).admin.delete_schedule(name):
            raise ScheduleNotFoundError(f"no stored schedule named {name!r}")

    async def trigger(self, name: str) -> TaskInfo:
        """Enqueue one run of a schedule (code or stored, paused or not) now, with its own
        id ``periodic:<name>:run:<epoch>-<random>``: it is no tick, so it never takes a
        tick's place, and the overlap policy does not apply to it."""
        entry = await self.get(name)
        now = self._app.clock.now()
        task_id = f"periodic:{entry.name}:run:{int(now)}-{secrets.token_hex(4)}"
        params = self._params(entry, now, task_id)
        return await (await self._app.broker()).enqueue(params)

    async def backfill(
        self,
        name: str,
        start: datetime | float | str,
        end: datetime | float | str,
        *,
        dry_run: bool = False,
    ) -> BackfillResult:
        """Enqueue the ticks of a schedule from ``start`` to ``end`` (both included), each
        under its tick's own id: a tick that ran already (its task still stored) is left
        alone, and a backfill run twice enqueues nothing more. More than
        :data:`MAX_BACKFILL` ticks are refused; ``dry_run`` only lists them."""
        first, last = to_epoch(start), to_epoch(end)
        if not (math.isfinite(first) and math.isfinite(last)) or first > last:
            raise ValidationError("backfill needs a start at or before its end")
        entry = await self.get(name)
        ticks: list[float] = []
        tick = entry.schedule.next_after(math.ceil(first) - 1)
        while tick <= last:
            if len(ticks) == MAX_BACKFILL:
                raise ValidationError(
                    f"the range holds more than {MAX_BACKFILL} ticks of {name!r}: narrow it"
                )
            ticks.append(tick)
            tick = entry.schedule.next_after(tick)
        result = BackfillResult(entry.name, ticks, dry_run)
        if dry_run:
            return result
        broker = await self._app.broker()
        for tick in ticks:
            params = self._params(entry, tick)
            try:
                await broker.enqueue(params)
            except (TaskIDConflictError, DuplicateTaskError):
                result.existing.append(params.id)
            else:
                result.enqueued.append(params.id)
        return result

    def _params(
        self, entry: PeriodicEntry, tick: float, task_id: str | None = None
    ) -> EnqueueParams:
        return self._app.params(entry.request(tick, task_id))
