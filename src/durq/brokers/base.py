"""The two seams every broker implements: :class:`Broker` (the hot path) and :class:`Admin`
(the inspector). The CLI, the dashboard and the worker go through these and nothing else.

Times are epoch seconds (``float``) on the broker's clock. Relative times (``process_in``, a
retry's delay, ``unique_ttl``, ``retention``, lease lengths) cross this seam as seconds and
become moments inside the statement or script that stores them: PostgreSQL's and Redis's own
clock, the machine's for SQLite and memory; a test's injected :class:`~durq.clock.Clock` wins.
:class:`~durq.task.TaskInfo` turns them into aware datetimes for users.

Contract notes that every backend honours (the conformance suite checks each):

* A task is claimable when its state is pending, or scheduled/retry with
  ``next_process_at <= now``; a backend may take due scheduled/retry rows directly in
  ``claim`` or forward them in ``promote_due``. Claim order within a queue: ``priority``
  (higher first), then ``next_process_at``, then enqueue order. A task keeps its priority
  through retries, rescues and requeues. Paused queues give nothing.
* Every move of an active task out of it (complete, retry, archive, requeue, and the
  rescuer's ``move_leases``) gives back the running slot of each of its limit keys, in the
  same atomic step, and wakes the queue's workers when tasks are held on such a key.
* Every mutation of an active task names its :class:`LeaseRef`; the backend changes the task
  only if it is still active *with that token* (fencing) and answers ``False`` otherwise.
* A completed task whose retention has passed counts as gone for ``task_id`` conflicts even
  before the janitor deletes it.
* Brokers store; they do not decide. Which state a task goes to next, and which follow-up
  tasks that creates, is decided above this seam by :mod:`durq.lifecycle` (with
  :mod:`durq.states` as the only table of moves); a broker performs the move it is handed,
  fenced, and answers whether the fence held.
* Counters for the inspector (I1): ``complete`` adds one processed; ``retry`` and ``archive``
  (when it counts an attempt) add one processed and one failed, per queue and per UTC day of
  the broker clock (also through ``move_leases``), and per minute of the broker clock, kept
  :data:`MINUTE_COUNTS_KEEP` seconds (the janitor's ``delete_expired`` drops older ones).
* Follow-ups (``follow_ups`` of the params) are created in the same atomic step as the move
  (one transaction, one script), and never when the fence fails; a follow-up whose task id
  (or unique key) exists is skipped without failing the move.
* Groups (:class:`GroupParams`): the members are created all or none. A move that carries
  a :class:`MemberOutcome` (complete, archive, the inspector's archive) records the member's
  first final outcome and counts it finished in the same atomic step; deleting a member that
  has not finished records its ``unfinished`` entry with state ``deleted``. The step that
  counts the last member creates the group's follow-up (payload: ``then.payload``, the
  members' entries in group order joined by ``,``, then ``tail``), exactly once.
* ``list_workers`` shows workers whose last heartbeat is younger than 60 s.
* Backend failures to reach the server raise :class:`~durq.errors.BrokerUnavailableError`
  with ``operation`` set (``"sqlite.claim"``), never a driver exception.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from durq.brokers import search
from durq.clock import Clock, to_datetime
from durq.errors import DuplicateTaskError, TaskIDConflictError, ValidationError
from durq.states import TaskState
from durq.task import LimitSpec, TaskInfo, make_info

# Capability names a backend may declare; conformance tests that need one skip by name.
#: ``enqueue(..., connection=)`` joins the caller's open transaction.
CAP_TRANSACTIONAL_ENQUEUE = "transactional_enqueue"
#: The broker is a :class:`SyncConnectionEnqueue`: it enqueues inside a caller's *sync*
#: connection, on the calling thread (``app.enqueue_sync(..., connection=)``).
CAP_SYNC_CONNECTION_ENQUEUE = "sync_connection_enqueue"
CAP_CROSS_PROCESS_NOTIFY = "cross_process_notify"
#: ``CompleteParams.follow_ups`` / ``ArchiveParams.follow_ups`` are written atomically with
#: the outcome (both or neither). Every broker has it.
CAP_ATOMIC_FOLLOW_UPS = "atomic_follow_ups"
#: ... also when a follow-up goes to another queue than its task. The SQL brokers and a
#: single Redis node write it atomically; a Redis Cluster writes it to the completing queue's
#: outbox atomically and creates it in the other queue's slot right after.
CAP_CROSS_QUEUE_FOLLOW_UPS = "cross_queue_follow_ups"
#: A group's members and its follow-up may be in several queues, still counted and created
#: in one atomic step. All but a Redis Cluster (one script stays in one hash slot there).
CAP_CROSS_QUEUE_GROUPS = "cross_queue_groups"
#: Brokers in other processes (workers, the CLI) see the same tasks. All but ``memory://``.
CAP_MULTI_PROCESS = "multi_process"
#: The claim enforces the flow-control limits tasks carry (``EnqueueParams.limits``); a
#: task with limits is refused at enqueue by a broker without it.
CAP_LIMITS = "limits"
#: The broker is a :class:`CompleteAndClaim`: a worker's completions ride in its next claim,
#: one round trip for both. Without it (``memory://``, which has no round trip to save) the
#: worker sends ``complete_many``, then ``claim``; it does so too for completions the two
#: below do not cover. With it alone, only completions without follow-ups or a group
#: outcome, of the claim's first queue, ride.
CAP_COMPLETE_AND_CLAIM = "complete_and_claim"
#: ... also completions with follow-ups or a group member's outcome (SQLite, Redis; on
#: PostgreSQL those complete in a transaction of their own).
CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS = "complete_and_claim_follow_ups"
#: ... also completions of other queues than the claim's first one, still stored before the
#: claim runs. All but a Redis Cluster (another queue may live on another node, written at
#: the same time as the claim, not surely before it).
CAP_COMPLETE_AND_CLAIM_ANY_QUEUE = "complete_and_claim_any_queue"
#: The broker is a :class:`WaitAndClaim`: an idle worker's wait for work and its next claim
#: go to the broker together, which runs the claim as soon as work arrives (Redis on a single
#: node): a pickup one round trip shorter.
CAP_WAIT_AND_CLAIM = "wait_and_claim"

#: A claim first moves up to this many (or ``limit``, if more) due scheduled/retry tasks of
#: each queue to pending, then takes pending tasks in priority order: so tasks that fall due
#: together are ordered by priority, while one claim stays short in a backlog of due tasks.
CLAIM_FORWARD = 100


@dataclass(frozen=True, slots=True)
class EnqueueParams:
    """One task to create. The client validates and encodes everything before this exists."""

    id: str
    queue: str
    type: str
    payload: bytes
    max_retry: int = 25
    timeout: float | None = None
    deadline: float | None = None
    #: The caller's absolute moment: ``None``, pending now; otherwise scheduled until this
    #: time (pending if already past).
    process_at: float | None = None
    retention: float = 0.0
    #: E4: digest of queue, type and canonical payload, with how long it holds.
    unique_key: str | None = None
    unique_ttl: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: Higher is claimed first within the queue (checked by the client against the bounds
    #: in :mod:`durq.options`; the SQL brokers also CHECK them).
    priority: int = 0
    #: Flow-control limits the claim enforces (resolved keys; counted per queue).
    limits: tuple[LimitSpec, ...] = ()
    #: A delay in seconds (``process_in``): scheduled until the broker's clock, read in the
    #: same statement or script that stores the task, plus this. Wins over ``process_at``.
    process_in: float | None = None
    #: ``(queue, id)`` of the tasks this one waits for (``after=``): stored ``waiting``
    #: until the last of them that has not finished yet finishes.
    after: tuple[tuple[str, str], ...] = ()

    def scheduled_until(self, now: float) -> float | None:
        """When the task becomes due on a broker clock that reads ``now``; ``None``: now."""
        at = now + self.process_in if self.process_in else self.process_at
        return at if at is not None and at > now else None

    def ready_at(self, now: float) -> float:
        """``next_process_at`` as stored by a broker whose clock read ``now`` (a past
        ``process_at`` is kept: it orders the task among the pending ones)."""
        if self.process_in:
            return now + self.process_in
        return now if self.process_at is None else self.process_at

    def created(self, state: TaskState, now: float, at: datetime | None = None) -> TaskInfo:
        """The TaskInfo of the task a broker just created from these params in ``state``,
        on a clock that read ``now``: every field is known, so the write returns none.
        ``at``: ``to_datetime(now)`` when the caller has it already; a batch stamped with
        one clock value shares one (a bulk enqueue built two per task: a tenth of its
        client's instructions), as do the enqueue and due times when they are equal."""
        if at is None:
            at = to_datetime(now)
        ready = self.ready_at(now)
        return make_info(
            id=self.id,
            queue=self.queue,
            type=self.type,
            raw_payload=self.payload,
            state=state,
            max_retry=self.max_retry,
            timeout=self.timeout,
            deadline=None if self.deadline is None else to_datetime(self.deadline),
            next_process_at=at if ready == now else to_datetime(ready),
            enqueued_at=at,
            retention=self.retention,
            headers=dict(self.headers),
            priority=self.priority,
            limits=self.limits,
        )


@dataclass(frozen=True, slots=True)
class EnqueueOutcome:
    """What happened to one item of a bulk enqueue: created, or refused with a reason."""

    params: EnqueueParams
    info: TaskInfo | None = None
    error: TaskIDConflictError | DuplicateTaskError | None = None

    @property
    def created(self) -> bool:
        return self.info is not None


@dataclass(frozen=True, slots=True)
class GroupParams:
    """A group to create: its members, all or none, and the follow-up of its fan-in.

    The members' headers name the group (:mod:`durq.groups` builds all of this)."""

    id: str
    #: The queue whose storage holds the group's record (its first member's).
    queue: str
    members: tuple[EnqueueParams, ...]
    #: Per member, in order: its entry in the follow-up's payload if it is deleted unfinished.
    unfinished: tuple[bytes, ...]
    #: The fan-in task; its ``payload`` is the head the members' entries are appended to.
    then: EnqueueParams | None = None
    #: Bytes closing the follow-up's payload after the members' entries.
    tail: bytes = b""
    #: Seconds the group's record is kept once its last member finished.
    retention: float = 0.0


def fan_in_payload(head: bytes, entries: Sequence[bytes], tail: bytes) -> bytes:
    """The payload of a group's follow-up: ``head``, the entries joined by ``,``, ``tail``."""
    return b"".join((head, b",".join(entries), tail))


def waiting_follow_up(p: GroupParams) -> EnqueueParams | None:
    """The follow-up ``enqueue_group`` creates with the members, ``waiting`` for its group
    (``None``: the group has none). Its payload until the group's last member finishes has
    no entries (``"members":[]``); the step that counts that member writes the full one."""
    if p.then is None:
        return None
    return replace(p.then, payload=fan_in_payload(p.then.payload, (), p.tail))


def follow_up_options(p: EnqueueParams) -> str:
    """A group's follow-up without its payload, as stored in the group's record (JSON)."""
    return json.dumps(
        {
            "id": p.id,
            "queue": p.queue,
            "type": p.type,
            "max_retry": p.max_retry,
            "timeout": p.timeout,
            "retention": p.retention,
            "headers": p.headers,
            "priority": p.priority,
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def follow_up_from(options: str | bytes, payload: bytes) -> EnqueueParams:
    """The follow-up stored by :func:`follow_up_options`, with its built ``payload``."""
    o = json.loads(options)
    return EnqueueParams(
        id=o["id"],
        queue=o["queue"],
        type=o["type"],
        payload=payload,
        max_retry=int(o["max_retry"]),
        timeout=o["timeout"],
        retention=float(o["retention"]),
        headers=dict(o["headers"]),
        priority=int(o.get("priority", 0)),  # absent in records written before priority
    )


@dataclass(frozen=True, slots=True)
class MemberOutcome:
    """How a group member finished, recorded by the move that carries it: only a member's
    first final outcome counts (a rerun archived member does not count twice)."""

    group: str
    #: The group's queue (:attr:`GroupParams.queue`).
    group_queue: str
    #: ``"completed"`` or ``"archived"``.
    state: str
    #: The member's entry in the follow-up's payload (JSON).
    entry: bytes


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
class ClaimParams:
    """Take up to ``limit`` claimable tasks, filling from ``queues`` in the order given."""

    queues: Sequence[str]
    limit: int
    worker_id: str
    lease_seconds: float


@dataclass(frozen=True, slots=True)
class LeaseRef:
    """Names one lease: the task and the fencing token its claim produced."""

    queue: str
    id: str
    token: str

    @property
    def task_key(self) -> tuple[str, str]:
        """``(queue, id)`` of the task, as brokers report ended tasks."""
        return (self.queue, self.id)


@dataclass(frozen=True, slots=True)
class Lease:
    """A claimed task (state active, ``retried`` as before this attempt) and its lease."""

    task: TaskInfo
    token: str

    @property
    def ref(self) -> LeaseRef:
        return LeaseRef(self.task.queue, self.task.id, self.token)


class Claimed(list[Lease]):
    """What :meth:`Broker.claim` returns: the leases, in claim order, and ``wake_at``, the
    broker time at which a task held back by a rate limit may be taken (``None``: no such
    task, or a running attempt must end first, and its end wakes the workers)."""

    wake_at: float | None = None

    def __init__(self, leases: Iterable[Lease] = (), wake_at: float | None = None) -> None:
        super().__init__(leases)
        self.wake_at = wake_at


@dataclass(frozen=True, slots=True)
class LeaseReport:
    """Answer to a heartbeat: leases no longer held, and active tasks asked to cancel (W12)."""

    lost: frozenset[str] = frozenset()
    cancel: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class CompleteParams:
    """The handler returned: completed with its result for ``retention`` s, or deleted if 0."""

    lease: LeaseRef
    result: bytes | None = None
    retention: float = 0.0
    #: Tasks to create in the same atomic step, only if the lease is held.
    #: One whose id exists already is skipped; the completion still succeeds.
    follow_ups: tuple[EnqueueParams, ...] = ()
    #: A group member's outcome, recorded in the same atomic step.
    group: MemberOutcome | None = None
    #: The task counted against flow-control limits: its end frees a slot on their keys,
    #: which a held task may take (brokers count slots from the stored row, not from this).
    limited: bool = False


@dataclass(frozen=True, slots=True)
class ProgressParams:
    """What a running attempt reported since its last write (:mod:`durq.progress` builds the
    stored forms and bounds them)."""

    lease: LeaseRef
    #: The new latest progress (stored form); ``None``: unchanged; ``""``: cleared (a new
    #: attempt's first write when it has only log lines, so no earlier progress stays).
    progress: str | None = None
    #: Log lines to append (stored forms, one line each); the task keeps the last
    #: :data:`durq.progress.MAX_LOG_LINES`.
    lines: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StepsParams:
    """A running attempt's durable steps after it recorded one (:mod:`durq.steps` builds
    the stored form; the broker keeps it as opaque text)."""

    lease: LeaseRef
    #: The task's whole stored steps, replacing what it had.
    steps: str


@dataclass(frozen=True, slots=True)
class RetryParams:
    """The attempt failed: state retry for ``delay`` seconds, ``retried`` + 1."""

    lease: LeaseRef
    error: str
    #: Seconds from the broker's clock (read in the same statement or script as the write)
    #: to the next attempt; 0 or less: due at once.
    delay: float = 0.0
    #: ``lost`` + 1 as well (the rescuer: the worker holding the lease is gone).
    lost: bool = False
    #: Also fenced by the lease having expired at this time and at the broker's now (the
    #: rescuer), so a heartbeat that extended it after the rescuer listed it wins.
    expired_by: float | None = None
    #: The attempt's traceback with its exception chain, bounded (shown for one task);
    #: ``None`` clears the stored one (the attempt ended without a crash).
    traceback: str | None = None
    #: A snooze (:class:`durq.Snooze`): state scheduled instead, ``retried`` unchanged,
    #: ``snoozes`` + 1, ``last_error`` and ``traceback`` kept, not counted as a failure.
    snooze: bool = False


@dataclass(frozen=True, slots=True)
class ArchiveParams:
    """Give up: state archived with ``error``; ``retried`` + 1 when ``count_attempt``."""

    lease: LeaseRef
    error: str
    count_attempt: bool = True
    #: As :attr:`RetryParams.traceback`.
    traceback: str | None = None
    #: As :attr:`CompleteParams.follow_ups`.
    follow_ups: tuple[EnqueueParams, ...] = ()
    #: As :attr:`RetryParams.lost` and :attr:`RetryParams.expired_by`.
    lost: bool = False
    expired_by: float | None = None
    #: As :attr:`CompleteParams.group`.
    group: MemberOutcome | None = None


#: A fenced move of a held lease out of active (see :meth:`Broker.move_leases`).
LeaseMove = RetryParams | ArchiveParams


def ended_by(moves: Sequence[LeaseMove], done: Sequence[bool]) -> list[tuple[str, str]]:
    """``(queue, id)`` of the tasks that ``moves`` ended: the archives whose fence held."""
    return [
        m.lease.task_key
        for m, ok in zip(moves, done, strict=True)
        if ok and isinstance(m, ArchiveParams)
    ]


@dataclass(frozen=True, slots=True)
class ArchivedRetention:
    """How long the janitor keeps archived tasks, counted from when each was archived:
    ``default`` seconds in every queue but those of ``queues`` (queue -> seconds); ``None``
    keeps them until someone runs or deletes them."""

    default: float | None
    queues: Mapping[str, float | None] = field(default_factory=dict)

    def of(self, queue: str) -> float | None:
        """The retention of ``queue``'s archived tasks (``None``: kept)."""
        return self.queues[queue] if queue in self.queues else self.default

    @property
    def keeps_all(self) -> bool:
        """Nothing to delete anywhere: every queue keeps its archived tasks."""
        return self.default is None and all(v is None for v in self.queues.values())


@dataclass(frozen=True, slots=True)
class TaskRewrite:
    """Replace a stored task's payload and result bytes (``durq encryption rotate``), fenced:
    only if the task is still in ``expect`` (not active; a completed task past its
    retention counts as gone) and still holds exactly ``payload`` and ``result``, so a task
    that moved or was rewritten meanwhile is left as it is."""

    queue: str
    id: str
    expect: TaskState
    payload: bytes
    result: bytes | None
    new_payload: bytes
    new_result: bytes | None


@dataclass(frozen=True, slots=True)
class TaskMove:
    """The inspector's move of one task that is not active, fenced by the state it was in
    when the move was decided (:mod:`durq.lifecycle` reads it, then asks for this)."""

    queue: str
    id: str
    #: The fence: the move happens only if the task is still in this state (a completed
    #: task past its retention counts as gone).
    expect: TaskState
    #: ``PENDING`` (due now, ``lost`` and the cancel flag reset, wakes workers),
    #: ``ARCHIVED`` (unique key released) or ``None`` (deleted, unique key released).
    to: TaskState | None
    #: ``last_error`` to set when archiving; ``None`` keeps the current one.
    error: str | None = None
    #: Tasks to create in the same atomic step, only if the fence holds.
    follow_ups: tuple[EnqueueParams, ...] = ()
    #: As :attr:`CompleteParams.group` (an archive of a group member).
    group: MemberOutcome | None = None

    @property
    def kind(self) -> str:
        """``"run"``, ``"archive"`` or ``"delete"``: which write this is."""
        if self.to is None:
            return "delete"
        if self.to is TaskState.PENDING:
            return "run"
        if self.to is TaskState.ARCHIVED:
            return "archive"
        raise ValueError(f"not a task move: to {self.to}")


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


class EndWatch(Protocol):
    """A subscription to the end of one task (see :meth:`Broker.watch_end`)."""

    async def wait(self, timeout: float) -> bool:
        """Wait until the task may have ended (completed, archived or deleted), or
        ``timeout`` s. ``True`` when notified; a notification that came before this call
        (since the subscription began) returns at once. Spurious wake-ups are allowed."""


@runtime_checkable
class Broker(Protocol):
    """The hot path: what clients and workers call. All methods are coroutine functions."""

    #: Short name used in errors and metrics: ``"sqlite"``, ``"postgres"``, ``"redis"``.
    name: str
    #: Capability names (see ``CAP_*``) this backend provides.
    capabilities: frozenset[str]

    @property
    def clock(self) -> Clock:
        """The clock this broker stamps times with (the server's, once measured)."""

    async def connect(self) -> None:
        """Open connections (idempotent). Raises BrokerUnavailableError or SchemaError."""

    async def close(self) -> None:
        """Release every connection (idempotent)."""

    async def migrate(self) -> list[str]:
        """Bring the storage to the current schema; returns the migrations applied."""

    async def pending_migrations(self) -> list[str]:
        """The migrations :meth:`migrate` would apply now, by the names it reports; writes
        nothing (a missing SQLite file stays missing). SchemaError for a schema newer than
        this code."""

    async def ping(self) -> None:
        """One cheap round trip; raises BrokerUnavailableError."""

    async def enqueue(self, params: EnqueueParams, *, connection: Any = None) -> TaskInfo:
        """Create one task, atomically checking task id (E3) and uniqueness (E4).

        ``connection``: on SQL brokers, the caller's open connection; the task is written in
        its transaction and exists only if the caller commits (E8)."""

    async def enqueue_many(
        self, items: Sequence[EnqueueParams], *, connection: Any = None
    ) -> list[EnqueueOutcome]:
        """Create many tasks in one round trip where the backend can; one outcome per item."""

    async def enqueue_group(self, params: GroupParams) -> list[TaskInfo]:
        """Create a group's record, all its members and its follow-up (waiting for the
        group: :func:`waiting_follow_up`) atomically, or nothing: the first refused task
        raises its TaskIDConflictError/DuplicateTaskError. Returns the members' infos."""

    async def claim(self, params: ClaimParams) -> list[Lease]:
        """Lease up to ``params.limit`` claimable tasks (state active, new fencing token,
        ``lease_expires_at = now + lease_seconds``). Never hands one task to two callers.

        Flow control, atomically with the lease: a task is taken only if each of its
        ``limits`` has room (running < concurrency, a token in the bucket), and counts one
        running and one token on each; a task without room is held (stays pending, out of
        the claimable set) and the claim goes on with the next task. Held tasks come back
        in a later claim once their key has room. May return :class:`Claimed` to say when
        a token comes for a held task."""

    async def extend_leases(self, leases: Sequence[LeaseRef], lease_seconds: float) -> LeaseReport:
        """Heartbeat: push the expiry of every held lease; report lost ones and cancel asks."""

    async def complete(self, params: CompleteParams) -> bool:
        """Finish a task; ``False`` (and no change) if the lease is no longer held."""

    async def complete_many(self, items: Sequence[CompleteParams]) -> list[bool]:
        """``complete`` for several tasks in one round trip."""

    async def report_progress(self, params: ProgressParams) -> bool:
        """Store a running attempt's progress and log lines on its task, fenced like every
        other write of an active task: ``False`` (and no change) if the lease is no longer
        held. Keeps the last :data:`durq.progress.MAX_LOG_LINES` lines."""

    async def read_steps(self, lease: LeaseRef) -> str | None:
        """The stored durable steps of a leased task (:mod:`durq.steps`), ``None`` for none;
        read once per attempt, at its first step."""

    async def record_steps(self, params: StepsParams) -> bool:
        """Store a running attempt's durable steps, fenced like every other write of an
        active task: ``False`` (and no change) if the lease is no longer held."""

    async def read_snoozes(self, lease: LeaseRef) -> int | None:
        """How often a leased task was snoozed; ``None`` if the lease is no longer held."""

    async def retry(self, params: RetryParams) -> bool:
        """Schedule the next attempt; ``False`` if the lease is no longer held."""

    async def archive(self, params: ArchiveParams) -> bool:
        """Give up on the task; ``False`` if the lease is no longer held."""

    async def requeue(self, lease: LeaseRef) -> bool:
        """Hand an active task back as pending without counting an attempt (shutdown, W7)."""

    async def promote_due(self) -> int:
        """Move scheduled/retry tasks whose time has come to pending; returns how many."""

    async def expired_leases(self, limit: int) -> list[Lease]:
        """Up to ``limit`` active tasks whose lease expired by now, oldest expiry first, with
        their tokens (the rescuer decides what becomes of them, W1)."""

    async def move_leases(self, moves: Sequence[LeaseMove]) -> list[bool]:
        """Apply several fenced ``retry``/``archive`` moves (with their follow-ups) at once:
        one transaction on SQL brokers; on Redis one script per move, each atomic with its
        follow-ups. One answer per move: whether its fence held."""

    async def delete_archived(self, retention: ArchivedRetention, limit: int) -> int:
        """Janitor: delete up to ``limit`` archived tasks archived longer ago than their
        queue's ``retention``; how many. Their group records and follow-ups are unchanged
        (a member's outcome was recorded when it was archived)."""

    async def delete_expired(self, limit: int) -> int:
        """Janitor: delete up to ``limit`` completed tasks whose retention has passed (and
        per-minute counters older than :data:`MINUTE_COUNTS_KEEP`, not counted)."""

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Wait until a task may be claimable in ``queues`` or ``timeout`` passes.

        Returns ``True`` when woken by a notification. Spurious wake-ups are allowed.
        Level-triggered: an enqueue into ``queues`` that committed after this instance's
        previous ``claim`` started makes it return at once, so nothing slips between a claim
        that came back short and the wait that follows it."""

    def watch_end(self, queue: str, task_id: str) -> AbstractAsyncContextManager[EndWatch]:
        """Subscribe to the end of one task for the duration of the ``async with`` block.

        Entering returns once the subscription holds, so a task read inside the block that
        ends afterwards is always notified: ``complete``, ``archive`` (also through
        ``move_leases``) and the inspector's archive and delete notify, after their commit,
        through the broker's wake-up channel (other processes included where the broker
        has ``multi_process``). When the channel may have lost notifications (a reconnect)
        every watch is woken."""

    async def register_worker(self, info: WorkerInfo) -> None:
        """Insert or refresh a worker's row (its heartbeat); also makes its queues known and
        forgets workers silent for :data:`FORGET_WORKERS_AFTER`."""

    async def unregister_worker(self, worker_id: str) -> None:
        """Remove a worker's row at shutdown."""

    async def durability_warnings(self) -> list[str]:
        """Server settings under which acknowledged tasks can be lost (the worker logs them
        once at start); empty when there are none or the broker cannot tell."""


@runtime_checkable
class WaitAndClaim(Protocol):
    """What a broker declaring :data:`CAP_WAIT_AND_CLAIM` also offers."""

    async def wait_and_claim(self, claim: ClaimParams, timeout: float) -> Claimed | None:
        """Wait up to ``timeout`` seconds for work in ``claim.queues`` and claim it in the
        same step, as :meth:`Broker.claim` would: the leases (none when the time ran out
        with nothing to claim). ``None`` when it does not serve these queues: nothing was
        waited for or claimed, and the caller waits and claims the usual way.

        Cancelling it (the worker stops) ends the wait at once and never loses a lease: a
        claim already under way completes, and what it leased goes back to pending without
        counting an attempt."""
        ...


@runtime_checkable
class CompleteAndClaim(Protocol):
    """What a broker declaring :data:`CAP_COMPLETE_AND_CLAIM` also offers."""

    async def complete_and_claim(
        self, items: Sequence[CompleteParams], claim: ClaimParams
    ) -> tuple[list[bool], list[Lease]]:
        """``complete_many(items)`` then ``claim(claim)`` in one round trip (one transaction on
        SQLite, one pipeline on PostgreSQL and Redis): a busy worker acknowledges the tasks
        it finished and takes the next ones at once.

        The completions are stored before the claim runs, so the claim may fill the slots
        they free and a crash at any moment leaves the worker with no more unacknowledged
        leases than slots. Answers as the two calls would; on an error, as with
        ``complete_many``, some completions may have been stored.

        Called only with at least one completion, a claim of at least one task in at least
        one queue, and completions the broker's capabilities say ride in a claim
        (:data:`CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS`, :data:`CAP_COMPLETE_AND_CLAIM_ANY_QUEUE`):
        the worker decides (``durq.worker.fetcher.rides_in_claim``) and sends the others
        as ``complete_many``, then ``claim``."""


@runtime_checkable
class SyncConnectionEnqueue(Protocol):
    """What a broker declaring :data:`CAP_SYNC_CONNECTION_ENQUEUE` also offers."""

    def enqueue_sync_in(self, params: EnqueueParams, connection: Any) -> TaskInfo:
        """Create one task inside the caller's open sync transaction; no commit."""

    def enqueue_many_sync_in(
        self, items: Sequence[EnqueueParams], connection: Any
    ) -> list[EnqueueOutcome]:
        """``enqueue_many`` inside the caller's open sync transaction; no commit."""


@runtime_checkable
class Admin(Protocol):
    """The inspector's seam (I1-I5). The CLI and the dashboard use only this."""

    async def list_queues(self) -> list[QueueStats]:
        """Every known queue (enqueued into, served by a worker, or paused)."""

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue; QueueNotFoundError if unknown."""

    async def list_tasks(
        self, queue: str, state: TaskState, *, limit: int = 50, offset: int = 0
    ) -> list[TaskInfo]:
        """Tasks of one queue in one state, oldest first; QueueNotFoundError if unknown."""

    async def search_tasks(self, search: TaskSearch) -> TaskSearchResult:
        """Tasks of one queue and state that pass a filter, with the total that match;
        QueueNotFoundError if the queue is unknown. The SQL brokers filter in the database;
        Redis reads the state's tasks in order up to a bound and says so."""

    async def minute_counts(self, queue: str | None, since: float) -> list[MinuteCounts]:
        """Processed and failed per minute from the minute of ``since`` on, oldest first, of
        one queue or (``None``) summed over all; minutes with nothing, and minutes older
        than :data:`MINUTE_COUNTS_KEEP` (see :func:`first_counted_minute`), are left out.
        What every dashboard draws its throughput chart from."""

    async def get_task(self, queue: str, task_id: str) -> TaskInfo:
        """One task; TaskNotFoundError if absent (or completed past its retention)."""

    async def move_task(self, move: TaskMove) -> TaskInfo | None:
        """Move one task as :class:`TaskMove` says, with its follow-ups, if it is still in
        ``move.expect``; the task after the move (before it, when deleted), or ``None`` when
        the fence failed (moved meanwhile, or gone)."""

    async def get_group(self, queue: str, group_id: str) -> GroupInfo:
        """One group by its queue and id; GroupNotFoundError if absent (or expired)."""

    async def request_cancel(self, queue: str, task_id: str) -> TaskInfo | None:
        """Flag an active task so its worker cancels the handler (W12); ``None`` if the
        task is not active (or gone)."""

    async def rewrite_task(self, rewrite: TaskRewrite) -> bool:
        """Replace a task's payload and result bytes if the fences of :class:`TaskRewrite`
        hold; whether it did."""

    async def move_all(self, queue: str, state: TaskState, to: TaskState | None) -> int:
        """Move every task of ``queue`` in ``state`` as :class:`TaskMove` would (``to``
        pending or ``None``: deleted), in short batches; how many. QueueNotFoundError if the
        queue is unknown."""

    async def pause_queue(self, queue: str) -> None:
        """Stop handing out tasks of ``queue``; enqueue still works (W8)."""

    async def unpause_queue(self, queue: str) -> None:
        """Resume handing out tasks of ``queue``."""

    async def list_workers(self) -> list[WorkerInfo]:
        """Worker processes whose last heartbeat is younger than :data:`WORKER_VISIBLE_FOR`."""

    async def list_limits(self, queue: str | None = None) -> list[LimitStats]:
        """Flow-control keys (of one queue, or all) that a claim has counted, by queue and
        key: running attempts, the limit, tokens left, tasks held back."""

    async def list_schedules(self) -> list[ScheduleRecord]:
        """Every stored schedule, by name."""

    async def get_schedule(self, name: str) -> ScheduleRecord | None:
        """One stored schedule; ``None`` if there is none of that name."""

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord | None:
        """Store ``record`` if the stored version is still ``record.version`` (0: none of
        that name is stored); the record as stored (next version, the broker's time in
        ``updated_at``), or ``None`` when the fence failed."""

    async def delete_schedule(self, name: str) -> bool:
        """Delete one stored schedule; whether there was one."""


class FullBroker(Broker, Admin, Protocol):
    """What a backend class implements: both seams."""


class AdminForwarder:
    """The :class:`Admin` seam of ``self.admin``, forwarded. A backend composes the one
    object the app hands around from its hot path (the class that inherits this) and its
    inspector (``admin``, another object over the same storage)."""

    admin: Admin

    async def list_queues(self) -> list[QueueStats]:
        """See :meth:`Admin.list_queues`."""
        return await self.admin.list_queues()

    async def queue_stats(self, queue: str) -> QueueStats:
        """See :meth:`Admin.queue_stats`."""
        return await self.admin.queue_stats(queue)

    async def list_tasks(
        self, queue: str, state: TaskState, *, limit: int = 50, offset: int = 0
    ) -> list[TaskInfo]:
        """See :meth:`Admin.list_tasks`."""
        return await self.admin.list_tasks(queue, state, limit=limit, offset=offset)

    async def search_tasks(self, search: TaskSearch) -> TaskSearchResult:
        """See :meth:`Admin.search_tasks`."""
        return await self.admin.search_tasks(search)

    async def minute_counts(self, queue: str | None, since: float) -> list[MinuteCounts]:
        """See :meth:`Admin.minute_counts`."""
        return await self.admin.minute_counts(queue, since)

    async def get_task(self, queue: str, task_id: str) -> TaskInfo:
        """See :meth:`Admin.get_task`."""
        return await self.admin.get_task(queue, task_id)

    async def move_task(self, move: TaskMove) -> TaskInfo | None:
        """See :meth:`Admin.move_task`."""
        return await self.admin.move_task(move)

    async def get_group(self, queue: str, group_id: str) -> GroupInfo:
        """See :meth:`Admin.get_group`."""
        return await self.admin.get_group(queue, group_id)

    async def request_cancel(self, queue: str, task_id: str) -> TaskInfo | None:
        """See :meth:`Admin.request_cancel`."""
        return await self.admin.request_cancel(queue, task_id)

    async def rewrite_task(self, rewrite: TaskRewrite) -> bool:
        """See :meth:`Admin.rewrite_task`."""
        return await self.admin.rewrite_task(rewrite)

    async def move_all(self, queue: str, state: TaskState, to: TaskState | None) -> int:
        """See :meth:`Admin.move_all`."""
        return await self.admin.move_all(queue, state, to)

    async def pause_queue(self, queue: str) -> None:
        """See :meth:`Admin.pause_queue`."""
        await self.admin.pause_queue(queue)

    async def unpause_queue(self, queue: str) -> None:
        """See :meth:`Admin.unpause_queue`."""
        await self.admin.unpause_queue(queue)

    async def list_workers(self) -> list[WorkerInfo]:
        """See :meth:`Admin.list_workers`."""
        return await self.admin.list_workers()

    async def list_limits(self, queue: str | None = None) -> list[LimitStats]:
        """See :meth:`Admin.list_limits`."""
        return await self.admin.list_limits(queue)

    async def list_schedules(self) -> list[ScheduleRecord]:
        """See :meth:`Admin.list_schedules`."""
        return await self.admin.list_schedules()

    async def get_schedule(self, name: str) -> ScheduleRecord | None:
        """See :meth:`Admin.get_schedule`."""
        return await self.admin.get_schedule(name)

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord | None:
        """See :meth:`Admin.put_schedule`."""
        return await self.admin.put_schedule(record)

    async def delete_schedule(self, name: str) -> bool:
        """See :meth:`Admin.delete_schedule`."""
        return await self.admin.delete_schedule(name)


#: ``EnqueueParams.after``: a task waits for others and is released in the same atomic step
#: as the outcome of the last of them (see :mod:`durq.brokers.dependencies`).
CAP_DEPENDENCIES = "dependencies"
