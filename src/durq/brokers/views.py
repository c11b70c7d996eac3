"""The read models of the admin seam (what the inspector shows: queues, workers, limits,
groups, searches, stored schedules) and the bounds brokers keep them within."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from durq.brokers import search
from durq.errors import ValidationError
from durq.states import TaskState
from durq.task import TaskInfo


@dataclass(frozen=True, slots=True)
class GroupMemberInfo:
    """One member of a group: its state now (``completed``/``archived``/``deleted`` once it
    finished, else its task's state, ``None`` if gone)."""

    id: str
    queue: str
    type: str
    state: str | None
    finished: bool


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A group as the inspector shows it: progress and its members."""

    id: str
    queue: str
    total: int
    finished: int
    created_at: float
    #: When the last member finished (and the follow-up was created); ``None`` before.
    finished_at: float | None
    #: The follow-up's task id and queue, ``None`` for a group without one.
    then_id: str | None
    then_queue: str | None
    members: tuple[GroupMemberInfo, ...]

    @property
    def by_state(self) -> dict[str, int]:
        """How many members are in each state (finished members by their outcome)."""
        counts: dict[str, int] = {}
        for m in self.members:
            key = m.state or "gone"
            counts[key] = counts.get(key, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "queue": self.queue,
            "total": self.total,
            "finished": self.finished,
            "by_state": self.by_state,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "then_id": self.then_id,
            "then_queue": self.then_queue,
            "members": [
                {
                    "id": m.id,
                    "queue": m.queue,
                    "type": m.type,
                    "state": m.state,
                    "finished": m.finished,
                }
                for m in self.members
            ],
        }


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """What a task that runs after another reads of it (a workflow node of each of its
    dependencies, :meth:`~durq.brokers.contract.Admin.get_outcomes`): its state, result
    (completed) or last error, and headers (the node's ``on_failure``), no more."""

    id: str
    state: TaskState
    raw_result: bytes | None
    last_error: str | None
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class WorkflowNodeInfo:
    """One node of a stored workflow, with its task as read with the record: ``state``
    ``None`` when the task is gone (deleted, or completed past its retention)."""

    name: str
    queue: str
    task_id: str
    type: str
    on_failure: str
    #: The names of the nodes it runs after.
    after: tuple[str, ...]
    state: TaskState | None
    #: Failed attempts so far (the task's ``retried``).
    retried: int = 0
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    """A workflow's stored record (see :class:`~durq.brokers.params.WorkflowParams`) and
    its nodes' tasks as read at the same moment."""

    id: str
    name: str
    created_at: float
    retention: float
    #: In the order they were created: each after the nodes it runs after.
    nodes: tuple[WorkflowNodeInfo, ...]


#: At most this many records in one page of :meth:`Admin.list_workflows`.
WORKFLOW_PAGE_MAX = 500


@dataclass(frozen=True, slots=True)
class WorkflowQuery:
    """A page of workflow records, newest first: created at or after ``created_after``
    and before ``created_before`` (epoch seconds on the broker's clock, ``None``: no bound),
    after ``cursor`` (a previous page's, opaque)."""

    created_after: float | None = None
    created_before: float | None = None
    limit: int = 50
    cursor: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= WORKFLOW_PAGE_MAX:
            raise ValidationError(f"limit must be 1..{WORKFLOW_PAGE_MAX}")
        if self.cursor is not None:
            parse_cursor(self.cursor)


@dataclass(frozen=True, slots=True)
class WorkflowPage:
    """Workflow records, newest first, and the cursor of the next page (``None``: last)."""

    records: tuple[WorkflowRecord, ...]
    cursor: str | None


def workflow_cursor(created_at: float, workflow_id: str) -> str:
    """The cursor after a record: its creation time (``%020.6f``, so that cursors sort as
    records do) and its id. A broker keeps creation times to the microsecond."""
    return f"{created_at:020.6f}:{workflow_id}"


def parse_cursor(cursor: str) -> tuple[float, str]:
    """``(created_at, id)`` of a cursor; ValidationError for anything else."""
    at, sep, workflow_id = cursor.partition(":")
    try:
        value = float(at)
    except ValueError:
        value = math.nan
    if not sep or not workflow_id or not math.isfinite(value) or len(cursor) > 200:
        raise ValidationError(f"invalid cursor {cursor[:80]!r}")
    return value, workflow_id


def in_page(created_at: float, workflow_id: str, query: WorkflowQuery) -> bool:
    """Whether a record created at ``created_at`` belongs to ``query``'s page (bounds and
    cursor): the rule the SQL of a listing says, for brokers that sort in Python."""
    if query.created_after is not None and created_at < query.created_after:
        return False
    if query.created_before is not None and created_at >= query.created_before:
        return False
    if query.cursor is not None:
        at, after_id = parse_cursor(query.cursor)
        return (created_at, workflow_id) < (at, after_id)
    return True


def next_cursor(records: Sequence[WorkflowRecord], limit: int) -> str | None:
    """The cursor after a page of ``limit`` records (``None``: it was the last)."""
    if len(records) < limit:
        return None
    last = records[-1]
    return workflow_cursor(last.created_at, last.id)


#: Characters of one payload field name in a search (``partner``, ``customer.id``); use
#: ``fullmatch`` (``$`` alone would let a trailing newline through).
PAYLOAD_FIELD = re.compile(r"^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7}$")


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks a search keeps: every condition given must hold. What each one means
    is written once in :mod:`durq.brokers.search`; the values are checked here, before any
    broker (ValidationError)."""

    #: The task type, exactly.
    type: str | None = None
    #: Text the last error contains (ASCII case-insensitive).
    error: str | None = None
    #: ``(field path, value)`` pairs: the payload's value at the dotted path matches the
    #: value (:func:`durq.brokers.search.value_matches`).
    payload: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.type is not None:
            search.check_text("task type", self.type)
        if self.error is not None:
            search.check_text("error text", self.error)
        for field_, value in self.payload:
            if not PAYLOAD_FIELD.fullmatch(field_):
                raise ValidationError(
                    f"payload field {field_[:80]!r} must be names of letters, digits, _ or - "
                    "joined by dots (customer.id)"
                )
            search.check_text("payload value", value)

    @property
    def empty(self) -> bool:
        return self.type is None and self.error is None and not self.payload

    def matches(self, task: TaskInfo) -> bool:
        """The same test in Python, for brokers that cannot ask their storage."""
        if self.type is not None and task.type != self.type:
            return False
        return self.matches_content(task.last_error, task.raw_payload)

    def matches_content(self, last_error: str | None, raw_payload: bytes | str | None) -> bool:
        """The error and payload conditions alone (SQLite calls it from SQL)."""
        if self.error is not None and not search.error_matches(last_error, self.error):
            return False
        return search.payload_matches(raw_payload, self.payload)


@dataclass(frozen=True, slots=True)
class TaskSearch:
    """Tasks of one queue in one state that pass ``filter``, a page at a time (oldest
    first, as :meth:`Admin.list_tasks` orders them)."""

    queue: str
    state: TaskState
    filter: TaskFilter
    limit: int = 50
    offset: int = 0


@dataclass(frozen=True, slots=True)
class TaskSearchResult:
    """One page of a search, and how many tasks matched in all."""

    tasks: list[TaskInfo]
    #: Matching tasks in all (among the ``scanned`` ones when ``complete`` is false).
    total: int
    #: ``False`` when the broker looked at only the first ``scanned`` tasks of the state
    #: (Redis filters in the client, within a bound): more may match.
    complete: bool = True
    scanned: int | None = None


#: How long per-minute counters are kept (seconds of the broker clock).
MINUTE_COUNTS_KEEP = 2 * 86400.0


#: ``list_workers`` shows the workers whose last heartbeat is younger than this (seconds of
#: the broker clock).
WORKER_VISIBLE_FOR = 60.0


#: A worker silent this long (stopped without unregistering: killed, its machine gone) is
#: dropped from the registry when another worker registers or sends its heartbeat.
FORGET_WORKERS_AFTER = 86400.0


def minute_of(ts: float) -> int:
    """The start of the minute ``ts`` falls in (epoch seconds, a multiple of 60)."""
    return int(ts // 60) * 60


def first_counted_minute(since: float, now: float) -> int:
    """Where :meth:`Admin.minute_counts` starts: the minute of ``since``, but never a minute
    older than the keep (Redis drops them by expiry, not at the janitor's run)."""
    return max(minute_of(since), math.ceil((now - MINUTE_COUNTS_KEEP) / 60) * 60)


@dataclass(frozen=True, slots=True)
class MinuteCounts:
    """Tasks processed and failed in one minute of the broker clock."""

    #: The minute's start, epoch seconds (a multiple of 60).
    minute: int
    processed: int
    failed: int


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker process as the inspector shows it."""

    id: str
    host: str
    pid: int
    queues: dict[str, int]
    concurrency: int
    started_at: float
    last_heartbeat: float = 0.0
    active: int = 0
    strict: bool = False


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue as the inspector shows it."""

    name: str
    paused: bool
    sizes: dict[TaskState, int]
    #: Seconds since the oldest pending task became ready; 0 when none.
    oldest_pending_age: float
    processed_today: int
    failed_today: int
    processed_total: int
    failed_total: int
    #: Unique keys (durq.Unique, ``unique=``) its unfinished tasks hold now.
    unique_keys: int = 0

    @property
    def size(self) -> int:
        return sum(self.sizes.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "paused": self.paused,
            "size": self.size,
            "sizes": {s.value: self.sizes.get(s, 0) for s in TaskState},
            "oldest_pending_age": self.oldest_pending_age,
            "processed_today": self.processed_today,
            "failed_today": self.failed_today,
            "processed_total": self.processed_total,
            "failed_total": self.failed_total,
            "unique_keys": self.unique_keys,
        }


@dataclass(frozen=True, slots=True)
class LimitStats:
    """One flow-control key of a queue as the inspector shows it."""

    queue: str
    key: str
    #: Attempts of the key running now (leases held).
    running: int
    #: The limit the last task of the key carried.
    concurrency: int | None
    rate: int | None
    per: float | None
    #: Tokens in the bucket now (``None`` without a rate).
    tokens: float | None
    #: Pending tasks held back on this key.
    waiting: int
    #: An operator's override (``durq limit set``), each part ``None`` where the tasks'
    #: own limit applies; a set part wins over every task's until it is reset.
    override_concurrency: int | None = None
    override_rate: int | None = None
    override_per: float | None = None

    @property
    def overridden(self) -> bool:
        """Whether an override is set on the key."""
        return self.override_concurrency is not None or self.override_rate is not None

    @property
    def limit_concurrency(self) -> int | None:
        """The concurrency in force: the override's, or the last task's."""
        if self.override_concurrency is not None:
            return self.override_concurrency
        return self.concurrency

    @property
    def limit_rate(self) -> tuple[int, float] | None:
        """The rate in force as ``(starts, seconds)``: the override's, or the last task's."""
        if self.override_rate is not None and self.override_per is not None:
            return self.override_rate, self.override_per
        if self.rate is not None and self.per is not None:
            return self.rate, self.per
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "key": self.key,
            "running": self.running,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "per": self.per,
            "tokens": None if self.tokens is None else round(self.tokens, 3),
            "waiting": self.waiting,
            "override": None
            if not self.overridden
            else {
                "concurrency": self.override_concurrency,
                "rate": self.override_rate,
                "per": self.override_per,
            },
        }


#: What a schedule does when its previous run is unfinished at a tick (docs/periodic.md).
OVERLAP_POLICIES: tuple[str, ...] = ("allow", "skip", "buffer_one", "cancel_other")


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A periodic schedule kept in the broker (``app.stored_schedules``), as stored.

    The broker keeps it as data: ``payload`` is JSON text it does not read, and it checks
    nothing but the version fence. ``version`` 0 is a record not stored yet; each write
    stores the next version and the broker's time in ``updated_at``."""

    name: str
    spec: str
    type: str
    payload: str = "{}"
    queue: str | None = None
    tz: str = "UTC"
    overlap: str = "allow"
    paused: bool = False
    updated_at: float = 0.0
    version: int = 0


#: The most partitions :meth:`Admin.fair_partitions` returns one by one (the rest are summed).
PARTITIONS_TOP_MAX = 1000


@dataclass(frozen=True, slots=True)
class PartitionDepth:
    """One partition of a fair limit (its resolved key, ``tenant:7``) or, in
    :attr:`FairDepth.templates`, a whole template (``key`` empty): tasks waiting (pending,
    held ones included) and running (active)."""

    template: str
    key: str
    pending: int
    running: int
    #: Partitions counted here: 1 for a partition, all of them for a template.
    partitions: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "key": self.key,
            "pending": self.pending,
            "running": self.running,
            "partitions": self.partitions,
        }


@dataclass(frozen=True, slots=True)
class FairDepth:
    """The fair limits of one queue as the inspector shows them: each template with its
    totals, and the ``top`` partitions with the most tasks (pending + running, then
    template and key), so that a queue with 100,000 tenants stays one bounded read."""

    queue: str
    templates: tuple[PartitionDepth, ...]
    top: tuple[PartitionDepth, ...]

    @property
    def others(self) -> PartitionDepth:
        """What is not in :attr:`top`, summed (template and key empty)."""
        return PartitionDepth(
            "",
            "",
            sum(t.pending for t in self.templates) - sum(p.pending for p in self.top),
            sum(t.running for t in self.templates) - sum(p.running for p in self.top),
            sum(t.partitions for t in self.templates) - len(self.top),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "templates": [t.to_dict() for t in self.templates],
            "top": [p.to_dict() for p in self.top],
            "others": self.others.to_dict(),
        }


def biggest(p: PartitionDepth) -> tuple[int, str, str]:
    """The order of :attr:`FairDepth.top`: most tasks first, then template and key."""
    return (-(p.pending + p.running), p.template, p.key)


def fair_depth(queue: str, counts: dict[tuple[str, str], list[int]], top: int) -> FairDepth:
    """A :class:`FairDepth` from ``(template, key) -> [pending, running]`` of every
    partition, for brokers that count in Python (the SQL brokers say the same in SQL)."""
    parts = [PartitionDepth(t, k, n[0], n[1]) for (t, k), n in counts.items() if n[0] or n[1]]
    sums: dict[str, list[int]] = {}
    for p in parts:
        total = sums.setdefault(p.template, [0, 0, 0])
        total[0] += p.pending
        total[1] += p.running
        total[2] += 1
    templates = tuple(PartitionDepth(t, "", *n) for t, n in sorted(sums.items()))
    return FairDepth(queue, templates, tuple(sorted(parts, key=biggest)[:top]))


#: The most holds :meth:`Admin.list_unique` returns in one page.
UNIQUE_PAGE_MAX = 1000


@dataclass(frozen=True, slots=True)
class UniqueHold:
    """A unique key (``unique=``, :class:`durq.Unique`, :func:`durq.Debounce`) and the
    unfinished task that holds it now."""

    key: str
    task: TaskInfo


@dataclass(frozen=True, slots=True)
class UniqueHolds:
    """A page of the unique keys one queue's tasks hold now, soonest due first (then task
    id), and how many are held in all."""

    holds: tuple[UniqueHold, ...]
    total: int
    #: ``False`` when the broker read only the first ``scanned`` holds (Redis keeps them in
    #: one hash, read up to a bound): the page is the soonest among those.
    complete: bool = True
    scanned: int | None = None
