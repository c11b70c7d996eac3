"""Periodic tasks: schedules, entries and the registry an app keeps of them.

A schedule is a cron expression in a time zone (parsed by ``croniter``) or ``@every <duration>``.
Each tick is one task with the id ``periodic:<entry name>:<tick epoch>``: every scheduler
computes the same id for the same tick, and the broker's task-id rule refuses all but the
first enqueue. That is the whole coordination between schedulers; no locks, no leader.

The scheduler service that enqueues due ticks is :mod:`durq.worker.periodic`; schedules kept
in the broker and changed at run time are :mod:`durq.schedules` (``app.stored_schedules``).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from durq import codec, durations, names
from durq.brokers.views import OVERLAP_POLICIES
from durq.errors import ConfigurationError, TaskNotFoundError, ValidationError
from durq.options import Duration, EnqueueRequest
from durq.taskdef import TaskDef, TaskRegistry

if TYPE_CHECKING:
    from durq.brokers.params import EnqueueParams
    from durq.clock import Clock
    from durq.inspector import Inspector

MissedPolicy = Literal["skip", "run_once"]
MISSED_POLICIES: tuple[str, ...] = ("skip", "run_once")
OverlapPolicy = Literal["allow", "skip", "buffer_one", "cancel_other"]
#: Where an entry comes from: declared in code (read-only at run time) or kept in the broker.
Source = Literal["code", "stored"]

#: Header names put on every periodic task (the handler sees them in ``ctx.headers``).
HEADER_ENTRY = "durq-periodic"
HEADER_TICK = "durq-periodic-tick"

#: A late tick is still enqueued under ``missed="skip"`` when it is at most this old.
DEFAULT_TOLERANCE = 60.0

_EVERY = re.compile(r"^@every\s+(\S+)$")
F = TypeVar("F", bound=Callable[..., Any])


def tick_task_id(entry_name: str, tick: float) -> str:
    """The task id of one tick of an entry; the same on every scheduler."""
    return f"periodic:{entry_name}:{int(tick)}"


# -- schedules ----------------------------------------------------------------------------------


class Schedule(Protocol):
    """When an entry is due. Ticks are whole epoch seconds."""

    @property
    def spec(self) -> str:
        """The schedule as written."""

    def next_after(self, ts: float) -> float:
        """The first tick strictly after ``ts``."""

    def latest(self, ts: float) -> float | None:
        """The last tick at or before ``ts`` (``None`` if there is none)."""


@dataclass(frozen=True)
class Every:
    """``@every 30s``: ticks at whole multiples of the interval since the Unix epoch.

    Anchoring at the epoch (not at process start) is what lets independent schedulers agree
    on the ticks. Time zones do not apply."""

    spec: str
    interval: int

    def next_after(self, ts: float) -> float:
        return float((math.floor(ts / self.interval) + 1) * self.interval)

    def latest(self, ts: float) -> float | None:
        return float(math.floor(ts / self.interval) * self.interval)


@dataclass(frozen=True)
class Cron:
    """A cron expression evaluated in a time zone, DST included (see ``docs/periodic.md``).

    * Spring forward: a wall time that does not exist that day (02:30 in the skipped hour)
      fires once, at the first instant after the gap (03:00).
    * Fall back: an expression whose hour field is a wildcard (``0 * * * *``, ``*/10 * * * *``)
      fires in both copies of the repeated hour, as real time passes. One with fixed hours
      (``30 2 * * *``) fires once, in the first copy, like ISC cron.
    """

    spec: str
    tz: ZoneInfo

    @property
    def _fixed_hours(self) -> bool:
        fields = self.spec.split()
        return not self.spec.startswith("@") and len(fields) >= 2 and not fields[1].startswith("*")

    def _raw_next(self, ts: float) -> float:
        from croniter import croniter

        return float(croniter(self.spec, datetime.fromtimestamp(ts, self.tz)).get_next(float))

    def _repeated_wall_time(self, ts: float) -> bool:
        """``ts`` is the second copy of a wall time repeated when clocks fall back."""
        local = datetime.fromtimestamp(ts, self.tz)
        return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()

    def next_after(self, ts: float) -> float:
        tick = self._raw_next(ts)
        while self._fixed_hours and self._repeated_wall_time(tick):
            tick = self._raw_next(tick)
        return tick

    def latest(self, ts: float) -> float | None:
        from croniter import croniter

        # Walk back with croniter to the last valid tick at or before ts (past repeats of the
        # fall-back hour that next_after skips), then forward with next_after: one source of
        # truth for what the ticks are.
        it = croniter(self.spec, datetime.fromtimestamp(ts + 1, self.tz))
        anchor: float | None = None
        try:
            for _ in range(100):
                candidate = float(it.get_prev(float))
                if candidate <= ts and not (
                    self._fixed_hours and self._repeated_wall_time(candidate)
                ):
                    anchor = candidate
                    break
        except Exception:  # croniter gives up on expressions with no past tick
            return None
        if anchor is None:
            return None
        tick = self.next_after(anchor)
        while tick <= ts:
            anchor, tick = tick, self.next_after(tick)
        return anchor


def resolve_tz(tz: str | ZoneInfo | None) -> ZoneInfo:
    """A :class:`ZoneInfo` from a name (``None``: UTC); ConfigurationError for unknown names."""
    if isinstance(tz, ZoneInfo):
        return tz
    name = tz or "UTC"
    if not isinstance(name, str):
        raise ConfigurationError(f"tz must be an IANA time zone name, got {tz!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(
            f"unknown time zone {name!r}: use an IANA name such as 'Europe/Moscow' or 'UTC'"
        ) from exc


def parse_schedule(spec: str, tz: str | ZoneInfo | None = None) -> Schedule:
    """Parse ``"*/5 * * * *"``, ``"@daily"`` or ``"@every 30s"``; ConfigurationError if invalid."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigurationError("a periodic schedule must be a non-empty cron expression")
    spec = " ".join(spec.split())
    zone = resolve_tz(tz)
    every = _EVERY.match(spec)
    if every:
        try:
            seconds = durations.parse(every.group(1))
        except ValidationError as exc:
            raise ConfigurationError(f"invalid schedule {spec!r}: {exc}") from None
        if seconds < 1 or seconds != int(seconds):
            raise ConfigurationError(
                f"invalid schedule {spec!r}: @every needs a whole number of seconds >= 1"
            )
        return Every(spec, int(seconds))
    if spec.startswith("@every"):
        raise ConfigurationError(f"invalid schedule {spec!r}: write '@every 30s', '@every 5m'")
    try:
        from croniter import croniter
    except ImportError as exc:  # pragma: no cover - croniter is in the periodic extra
        raise ConfigurationError(
            "cron schedules need croniter: pip install 'durq[periodic]'"
        ) from exc
    if spec.lower() == "@reboot" or not croniter.is_valid(spec):
        raise ConfigurationError(
            f"invalid cron expression {spec!r}: expected 5 fields "
            "'minute hour day-of-month month day-of-week' (e.g. '*/5 * * * *'), "
            "@hourly/@daily/@weekly/@monthly/@yearly, or '@every 30s'"
        )
    return Cron(spec, zone)


def max_gap(schedule: Schedule, start: float, samples: int = 64) -> float:
    """The longest time between consecutive ticks over the next ``samples`` ticks."""
    if isinstance(schedule, Every):
        return float(schedule.interval)
    gap, tick = 0.0, schedule.next_after(start)
    for _ in range(samples):
        following = schedule.next_after(tick)
        gap = max(gap, following - tick)
        tick = following
    return gap


# -- entries ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeriodicEntry:
    """One declared schedule: enqueue task ``type`` with ``payload`` at every tick."""

    name: str
    schedule: Schedule
    type: str
    payload: dict[str, Any] = field(default_factory=dict)
    #: ``None``: the task type's queue (or the app's default queue).
    queue: str | None = None
    missed: MissedPolicy = "skip"
    tolerance: float = DEFAULT_TOLERANCE
    #: How long a finished tick's task is kept; it is what refuses a late duplicate enqueue.
    retention: float = 0.0
    max_retry: int | None = None
    timeout: float | None = None
    #: What a tick does while the previous run is unfinished (see docs/periodic.md).
    overlap: OverlapPolicy = "allow"
    source: Source = "code"
    #: Stored entries only: paused (no ticks), the stored version and its time.
    paused: bool = False
    version: int = 0
    updated_at: float | None = None

    @property
    def spec(self) -> str:
        return self.schedule.spec

    @property
    def tz(self) -> str:
        return str(self.schedule.tz) if isinstance(self.schedule, Cron) else "UTC"

    def task_id(self, tick: float) -> str:
        return tick_task_id(self.name, tick)

    def request(self, tick: float, task_id: str | None = None) -> EnqueueRequest:
        """The enqueue request for one tick (pending now; id derived from the tick unless
        ``task_id`` is given: a run started by hand)."""
        return EnqueueRequest(
            self.type,
            dict(self.payload),
            queue=self.queue,
            task_id=task_id or self.task_id(tick),
            max_retry=self.max_retry,
            timeout=self.timeout,
            retention=self.retention,
            headers={HEADER_ENTRY: self.name, HEADER_TICK: str(int(tick))},
        )

    def due(self, now: float, last: float | None) -> float | None:
        """The tick to enqueue at ``now``, given the last tick already handled, or ``None``.

        Only the latest due tick is ever a candidate, so a long outage or a clock jump
        forward yields one enqueue, not a burst. ``skip`` drops it when it is older than
        ``tolerance``; ``run_once`` enqueues it whatever its age (one catch-up)."""
        latest = self.schedule.latest(now)
        if latest is None or (last is not None and latest <= last):
            return None
        if self.missed == "skip" and now - latest > self.tolerance:
            return None
        return latest

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "schedule": self.spec,
            "tz": self.tz,
            "type": self.type,
            "queue": self.queue,
            "payload": self.payload,
            "missed": self.missed,
            "tolerance": self.tolerance,
            "retention": self.retention,
            "overlap": self.overlap,
            "source": self.source,
            # "state", not "paused": the dashboard's "paused" is the queue's.
            "state": "paused" if self.paused else "active",
            "version": self.version,
            "updated_at": (
                datetime.fromtimestamp(self.updated_at, UTC).isoformat()
                if self.updated_at
                else None
            ),
        }


class PeriodicHost(TaskRegistry, Protocol):
    """What a :class:`PeriodicRegistry` uses of its app."""

    @property
    def clock(self) -> Clock: ...
    @property
    def max_payload(self) -> int: ...
    def params(self, request: EnqueueRequest) -> EnqueueParams: ...


class PeriodicRegistry:
    """The periodic entries of one app (``app.schedules``); use ``app.periodic`` and friends."""

    def __init__(self, app: PeriodicHost) -> None:
        self._app = app
        self._entries: dict[str, PeriodicEntry] = {}

    def __iter__(self) -> Iterator[PeriodicEntry]:
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> PeriodicEntry:
        """The entry called ``name``; ``KeyError`` if there is none."""
        return self._entries[name]

    def add(
        self,
        schedule: str,
        type: str,
        *,
        payload: Any = None,
        queue: str | None = None,
        tz: str | ZoneInfo | None = None,
        missed: str = "skip",
        tolerance: Duration | None = None,
        retention: Duration | None = None,
        max_retry: int | None = None,
        timeout: Duration | None = None,
        overlap: str = "allow",
        name: str | None = None,
    ) -> PeriodicEntry:
        """Declare a schedule for task ``type``; everything is validated here, not at the tick.

        ``name`` (default: the type) names the entry in task ids and ``durq periodic ls``;
        keep it stable, since renaming it changes the ids of future ticks. ``retention``
        defaults to the longest gap between ticks plus ``tolerance``. ``overlap``: what a
        tick does while the previous run is unfinished (``allow``, ``skip``, ``buffer_one``,
        ``cancel_other``)."""
        entry = self.build(
            schedule,
            type,
            payload=payload,
            queue=queue,
            tz=tz,
            missed=missed,
            tolerance=tolerance,
            retention=retention,
            max_retry=max_retry,
            timeout=timeout,
            overlap=overlap,
            name=name,
        )
        if entry.name in self._entries:
            raise ConfigurationError(
                f"periodic entry {entry.name!r} is declared twice: give each one a name="
            )
        self._entries[entry.name] = entry
        return entry

    def build(
        self,
        schedule: str,
        type: str,
        *,
        payload: Any = None,
        queue: str | None = None,
        tz: str | ZoneInfo | None = None,
        missed: str = "skip",
        tolerance: Duration | None = None,
        retention: Duration | None = None,
        max_retry: int | None = None,
        timeout: Duration | None = None,
        overlap: str = "allow",
        name: str | None = None,
        **stored: Any,
    ) -> PeriodicEntry:
        """A validated entry, not registered (:meth:`add` and stored schedules use it);
        ``stored``: the stored entry's ``source``, ``paused``, ``version``, ``updated_at``."""
        parsed = parse_schedule(schedule, tz)
        try:
            names.check_enqueued_type(type)
            entry_name = names.check_type(name or type)
            if queue is not None:
                names.check_queue(queue)
        except ValidationError as exc:
            raise ConfigurationError(f"periodic {schedule!r}: {exc}") from None
        if missed not in MISSED_POLICIES:
            raise ConfigurationError(f"missed={missed!r} is not a policy: use 'skip' or 'run_once'")
        if overlap not in OVERLAP_POLICIES:
            raise ConfigurationError(
                f"overlap={overlap!r} is not a policy: use one of {', '.join(OVERLAP_POLICIES)}"
            )
        try:
            grace = durations.seconds(tolerance)
            keep = durations.seconds(retention)
            limit = durations.seconds(timeout)
            data = codec.to_jsonable(payload if payload is not None else {})
            codec.encode_payload(data, max_bytes=self._app.max_payload)
        except ValidationError as exc:
            raise ConfigurationError(f"periodic {entry_name!r}: {exc}") from None
        grace = DEFAULT_TOLERANCE if grace is None else grace
        try:
            gap = max_gap(parsed, self._app.clock.now())
        except Exception:  # croniter finds no date at all (e.g. "0 0 31 2 *", February 31st)
            raise ConfigurationError(f"schedule {schedule!r} never ticks") from None
        if keep is None:
            keep = gap + grace
        entry = PeriodicEntry(
            name=entry_name,
            schedule=parsed,
            type=type,
            payload=cast(dict[str, Any], data),
            queue=queue,
            missed=cast(MissedPolicy, missed),
            tolerance=grace,
            retention=keep,
            max_retry=max_retry,
            timeout=limit,
            overlap=cast(OverlapPolicy, overlap),
            **stored,
        )
        if type in self._app.tasks:
            self.params(entry, 0.0)  # typed payloads are checked against the model now
        return entry

    def params(self, entry: PeriodicEntry, tick: float) -> EnqueueParams:
        """Validated broker params for one tick (ConfigurationError if the entry is unusable)."""
        try:
            return self._app.params(entry.request(tick))
        except ValidationError as exc:
            raise ConfigurationError(f"periodic {entry.name!r}: {exc}") from None

    def decorator(
        self, schedule: str, *, type: str | None = None, **options: Any
    ) -> Callable[[Any], TaskDef[Any, Any]]:
        """``@app.periodic("*/5 * * * *", tz=...)``: register the handler (if it is not a task
        yet) and a schedule for it. Task options (``max_retry``, ``timeout``, ``queue``…) go
        to :meth:`durq.App.task`; the rest to :meth:`add`."""
        schedule_keys = {
            "payload", "tz", "missed", "tolerance", "retention", "name", "queue", "overlap",
        }  # fmt: skip
        entry_options = {k: v for k, v in options.items() if k in schedule_keys}
        task_options = {k: v for k, v in options.items() if k not in schedule_keys}
        if "queue" in options:
            task_options["queue"] = options["queue"]
        # Fail on a bad schedule before registering anything.
        parse_schedule(schedule, options.get("tz"))

        def register(fn: Any) -> TaskDef[Any, Any]:
            if isinstance(fn, TaskDef):
                if task_options.keys() - {"queue"}:
                    raise ConfigurationError(
                        f"{fn.type!r} is already a task: give its options to @app.task"
                    )
                task_def: TaskDef[Any, Any] = fn
            else:
                task_type = str(type or getattr(fn, "__name__", ""))
                task_def = self._app.task(task_type, **task_options)(fn)
            try:
                self.add(schedule, task_def.type, **entry_options)
            except Exception:
                if not isinstance(fn, TaskDef):  # leave no half-declared task behind
                    self._app.tasks.pop(task_def.type, None)
                raise
            return task_def

        return register

    def load(self, source: str | Path | Mapping[str, Any]) -> list[PeriodicEntry]:
        """Add entries from a TOML file (or its parsed mapping)::

        [[periodic]]
        cron = "*/5 * * * *"          # or schedule = "@every 30s"
        type = "reports:refresh"
        tz = "Europe/Moscow"
        payload = { region = "eu" }
        missed = "run_once"
        """
        if isinstance(source, Mapping):
            data: Mapping[str, Any] = source
            where = "periodic config"
        else:
            where = str(source)
            try:
                data = tomllib.loads(Path(source).read_text(encoding="utf-8"))
            except OSError as exc:
                raise ConfigurationError(f"cannot read {where}: {exc}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigurationError(f"{where} is not valid TOML: {exc}") from exc
        items = data.get("periodic", [])
        if not isinstance(items, list):
            raise ConfigurationError(f"{where}: 'periodic' must be an array of tables")
        allowed = {
            "cron", "schedule", "type", "payload", "queue", "tz", "missed", "tolerance",
            "retention", "max_retry", "timeout", "name", "overlap",
        }  # fmt: skip
        added = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise ConfigurationError(f"{where}: periodic[{i}] must be a table")
            unknown = set(item) - allowed
            if unknown:
                raise ConfigurationError(
                    f"{where}: periodic[{i}] has unknown keys {sorted(unknown)}"
                )
            options = dict(item)
            spec = options.pop("cron", None) or options.pop("schedule", None)
            task_type = options.pop("type", None)
            if not spec or not task_type:
                raise ConfigurationError(f"{where}: periodic[{i}] needs 'cron' and 'type'")
            added.append(self.add(spec, task_type, **options))
        return added


@dataclass(frozen=True)
class EntryStatus:
    """One entry as ``durq periodic ls`` shows it."""

    entry: PeriodicEntry
    queue: str
    next_run: datetime
    #: The most recent tick found in the broker, its task id, when it was enqueued, its state.
    last_tick: datetime | None = None
    last_task_id: str | None = None
    last_enqueued_at: datetime | None = None
    last_state: str | None = None
    #: The next runs from now, ``next_run`` first (as many as ``status(upcoming=)`` asked).
    next_runs: tuple[datetime, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        def iso(dt: datetime | None) -> str | None:
            return dt.isoformat() if dt else None

        return {
            **self.entry.to_dict(),
            "queue": self.queue,
            "next_run": iso(self.next_run),
            "last_tick": iso(self.last_tick),
            "last_task_id": self.last_task_id,
            "last_enqueued_at": iso(self.last_enqueued_at),
            "last_state": self.last_state,
            "next_runs": [iso(run) for run in self.next_runs],
        }


class StatusHost(Protocol):
    """What :func:`status` reads of an app."""

    @property
    def clock(self) -> Clock: ...
    @property
    def schedules(self) -> PeriodicRegistry: ...
    @property
    def inspector(self) -> Inspector: ...


async def status(
    app: StatusHost,
    *,
    lookback: int = 2,
    upcoming: int = 1,
    entries: Iterable[PeriodicEntry] | None = None,
) -> list[EntryStatus]:
    """Every entry of ``app`` (or ``entries``, e.g. with the stored ones) with its next
    ``upcoming`` runs and last enqueue.

    The last enqueue is read from the broker: the task of one of the ``lookback`` most recent
    ticks, found by its computed id. It is visible while that task exists (pending, running,
    failed, or completed within the entry's retention)."""
    now = app.clock.now()
    out = []
    for entry in app.schedules if entries is None else entries:
        queue = app.schedules.params(entry, 0.0).queue
        zone = entry.schedule.tz if isinstance(entry.schedule, Cron) else ZoneInfo("UTC")
        found: dict[str, Any] = {}
        tick = entry.schedule.latest(now)
        for _ in range(lookback):
            if tick is None:
                break
            try:
                info = await app.inspector.get_task_info(queue, entry.task_id(tick))
            except TaskNotFoundError:
                tick = entry.schedule.latest(tick - 1)
                continue
            found = {
                "last_tick": datetime.fromtimestamp(tick, zone),
                "last_task_id": info.id,
                "last_enqueued_at": info.enqueued_at,
                "last_state": info.state.value,
            }
            break
        runs = [entry.schedule.next_after(now)]
        while len(runs) < upcoming:
            runs.append(entry.schedule.next_after(runs[-1]))
        next_runs = tuple(datetime.fromtimestamp(run, zone) for run in runs)
        out.append(EntryStatus(entry, queue, next_runs[0], **found, next_runs=next_runs))
    return out
