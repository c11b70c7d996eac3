"""The frozen params a broker is handed: one dataclass per call that takes many arguments
(so a new option does not break every backend), and the group payload helpers."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from durq.clock import to_datetime
from durq.errors import DuplicateTaskError, TaskIDConflictError
from durq.states import TaskState
from durq.task import LimitSpec, TaskInfo, make_info

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
            unique_until=(
                None
                if self.unique_key is None or self.unique_ttl is None
                else to_datetime(now + self.unique_ttl)
            ),
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


def check_distinct(items: Sequence[EnqueueParams], now: float) -> None:
    """Refuse a graph (``enqueue_graph``) that names one id (in one queue) or one unique key
    twice, before the storage is asked: the later task's TaskIDConflictError (its id) or
    DuplicateTaskError (its unique key), the first such task in order, id before key."""
    ids: dict[tuple[str, str], EnqueueParams] = {}
    keys: dict[str, str] = {}
    for p in items:
        earlier = ids.setdefault((p.queue, p.id), p)
        if earlier is not p:
            raise TaskIDConflictError(
                f"task {p.id!r} is twice in the graph (queue {p.queue!r})",
                existing=earlier.created(TaskState.PENDING, now),
            )
        if p.unique_key is not None:
            if p.unique_key in keys:
                raise DuplicateTaskError(
                    f"task {p.id!r} has the unique key of {keys[p.unique_key]!r} in the graph",
                    existing_id=keys[p.unique_key],
                )
            keys[p.unique_key] = p.id


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


@dataclass(frozen=True, slots=True)
class WorkflowNodeParams:
    """One node of a workflow's record: its name, its task and the nodes it runs after."""

    name: str
    queue: str
    task_id: str
    type: str
    on_failure: str
    after: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkflowParams:
    """The record of a workflow, written by ``enqueue_graph`` with its nodes' tasks (in the
    same transaction or script) and never updated: progress is read from the tasks.

    A record with the id of an older one (whose tasks are all gone, or the graph would have
    been refused) replaces it."""

    id: str
    name: str
    #: Seconds the record is kept at least; then it goes once none of its nodes' tasks is left.
    retention: float
    #: In the order the tasks were created (each after the nodes it runs after).
    nodes: tuple[WorkflowNodeParams, ...]

    @property
    def queue(self) -> str:
        """The queue whose storage holds the record on Redis (its first node's)."""
        return self.nodes[0].queue

    def nodes_json(self) -> str:
        """The nodes as stored on Redis: ``[[name, queue, task_id, type, on_failure,
        [after...]], ...]``."""
        return json.dumps(
            [[n.name, n.queue, n.task_id, n.type, n.on_failure, list(n.after)] for n in self.nodes],
            separators=(",", ":"),
        )


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
    #: Names this lease; built once (the worker looks it up several times per attempt).
    ref: LeaseRef = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ref", LeaseRef(self.task.queue, self.task.id, self.token))


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
class SignalParams:
    """Deliver the signal ``name`` with ``payload`` (JSON text, validated and bounded by the
    client) to the task ``id`` of ``queue`` (:meth:`Broker.signal`)."""

    queue: str
    id: str
    name: str
    payload: str


#: What :meth:`Broker.signal` did: stored and made the task waiting for it pending
#: ("woken"), stored for later ("kept"), nothing because a signal of that name is stored
#: already ("duplicate") or the task has finished ("finished").
SIGNAL_OUTCOMES = ("woken", "kept", "duplicate", "finished")


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
    #: With ``snooze``: the task waits for the signal of this name (``ctx.wait_for``). It is
    #: stored on the task (``None`` clears it), so that delivering that signal makes the
    #: waiting task pending at once (:meth:`Broker.signal`); if the signal is stored already,
    #: the task is pending at once instead of scheduled.
    awaits: str | None = None
    #: A snooze (:class:`durq.Snooze`): state scheduled instead, ``retried`` unchanged,
    #: ``snoozes`` + 1, ``last_error`` and ``traceback`` kept, not counted as a failure.
    snooze: bool = False
    #: W25: the task keeps the keys of its sequence limits (their slots stay counted and the
    #: task is stored as holding them); its other limits give their units back as usual.
    keep: bool = False


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
class LimitOverride:
    """W23: an operator's limit for one flow-control key of ``queue``, winning over the
    limit every task of the key carries until it is reset. A part left ``None`` keeps the
    tasks' own; ``concurrency`` 0 starts none of the key; ``rate`` starts per ``per``
    seconds. Validated by the inspector; the broker stores it and lets the claim apply it."""

    queue: str
    key: str
    concurrency: int | None = None
    rate: int | None = None
    per: float | None = None


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
class UniqueRelease:
    """Free the unique key ``key`` that task ``id`` holds, only while it is in one of
    ``states`` (:meth:`Broker.free_unique`)."""

    queue: str
    id: str
    key: str
    states: tuple[TaskState, ...]


@dataclass(frozen=True, slots=True)
class TwinReplace:
    """Replace a waiting twin in place (``Unique(on_conflict="replace")``, ``durq.Debounce``),
    fenced by the task holding ``key`` and being pending, scheduled or retry (never active):
    its payload becomes ``payload``; a scheduled one's due time becomes ``delay`` seconds
    from the broker's now (``None``: unchanged), no later than ``within`` seconds after the
    twin was enqueued (``durq.Debounce``'s ``max_wait``), and its priority ``priority``
    (``None``: unchanged). A pending or retry twin keeps its due
    time and priority: it is about to run, or waits on its backoff."""

    queue: str
    id: str
    key: str
    payload: bytes
    delay: float | None = None
    within: float | None = None
    priority: int | None = None


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
