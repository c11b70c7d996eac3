"""The in-memory storage: tasks, queues, counters and workers of one ``memory://`` name.

Plain dicts behind one lock. Every operation is synchronous and short, so brokers on
several event loops and threads of one process (an app's client, its workers, the sync
face) share a store safely; nothing awaits while holding the lock."""

from __future__ import annotations

import heapq
import itertools
import json
import secrets
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from durq.brokers import dependencies, limiter, mailbox
from durq.brokers.base import (
    EnqueueParams,
    GroupInfo,
    GroupMemberInfo,
    GroupParams,
    LimitStats,
    ScheduleRecord,
    WorkerInfo,
    check_distinct,
    fan_in_payload,
    minute_of,
    waiting_follow_up,
)
from durq.brokers.mailbox import Mailbox, Watches
from durq.brokers.params import WorkflowParams
from durq.brokers.views import WorkflowNodeInfo, WorkflowRecord
from durq.clock import to_datetime, utc_day
from durq.errors import DuplicateTaskError, TaskIDConflictError
from durq.progress import decode_logs, progress_of
from durq.states import TaskState
from durq.steps import decode_steps
from durq.task import LimitSpec, TaskInfo, make_info

PENDING, SCHEDULED, ACTIVE, RETRY, ARCHIVED, COMPLETED, WAITING = (
    TaskState.PENDING,
    TaskState.SCHEDULED,
    TaskState.ACTIVE,
    TaskState.RETRY,
    TaskState.ARCHIVED,
    TaskState.COMPLETED,
    TaskState.WAITING,
)
#: States a claim may take a task from (when due).
CLAIMABLE = frozenset({PENDING, SCHEDULED, RETRY})


@dataclass(slots=True, eq=False)
class Row:
    """One stored task; ``info()`` is what leaves the store."""

    id: str
    queue: str
    type: str
    payload: bytes
    state: TaskState
    max_retry: int
    seq: int
    next_process_at: float
    enqueued_at: float
    timeout: float | None = None
    deadline: float | None = None
    retention: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    retried: int = 0
    last_error: str | None = None
    traceback: str | None = None
    completed_at: float | None = None
    expires_at: float | None = None
    result: bytes | None = None
    lost: int = 0
    started_at: float | None = None
    lease_token: str | None = None
    lease_expires_at: float | None = None
    #: The same expiry on the monotonic clock, which decides: a step of the wall clock
    #: expires no lease.
    lease_mono: float | None = None
    worker_id: str | None = None
    cancel_requested: bool = False
    unique_key: str | None = None
    unique_until: float | None = None
    #: ``[queue, id]`` of the waiting tasks this one holds back (as JSON, as the SQL brokers
    #: store it), and how many unfinished dependencies this one still waits for.
    dependents: str | None = None
    waiting_for: int = 0
    priority: int = 0
    limits: tuple[LimitSpec, ...] = ()
    #: The limit key this waiting task is held on (out of ``Queue.waiting`` meanwhile).
    held: str | None = None
    #: W25: it keeps the slots of its sequences' keys across an end that was not final.
    kept: bool = False
    #: W22: its turn under its fair limit (0 without one), that limit's template
    #: (``limits[0].fair``) and its entry in the template's line (``Queue.lines``).
    turn: int = 0
    fair: str | None = None
    line_entry: LineEntry | None = None
    #: Stored forms of the latest progress and the log (:mod:`durq.progress`).
    progress: str | None = None
    logs: str | None = None
    #: Stored form of the durable steps (:mod:`durq.steps`).
    steps: str | None = None
    snoozes: int = 0
    #: Signals delivered to it (name -> payload JSON text, in order of delivery) and the one
    #: it waits for while scheduled (set by the move that made it wait).
    signals: dict[str, str] = field(default_factory=dict)
    awaits: str | None = None

    def info(self) -> TaskInfo:
        return make_info(
            id=self.id,
            queue=self.queue,
            type=self.type,
            raw_payload=self.payload,
            state=self.state,
            max_retry=self.max_retry,
            retried=self.retried,
            last_error=self.last_error,
            timeout=self.timeout,
            deadline=to_datetime(self.deadline),
            next_process_at=to_datetime(self.next_process_at),
            enqueued_at=to_datetime(self.enqueued_at),
            completed_at=to_datetime(self.completed_at),
            raw_result=self.result,
            retention=self.retention,
            lost=self.lost,
            headers=dict(self.headers),
            started_at=to_datetime(self.started_at),
            lease_expires_at=to_datetime(self.lease_expires_at),
            worker_id=self.worker_id,
            cancel_requested=self.cancel_requested,
            traceback=self.traceback,
            priority=self.priority,
            limits=self.limits,
            held_by=self.held,
            progress=progress_of(self.progress, self.state, self.retried),
            logs=decode_logs(self.logs),
            steps=decode_steps(self.steps),
            snoozes=self.snoozes,
            unique_until=to_datetime(self.unique_until),
        )

    def gone(self, now: float) -> bool:
        """A completed task past its retention counts as gone (E3) before the janitor runs."""
        return self.state is COMPLETED and self.expires_at is not None and self.expires_at <= now

    def holds(self, token: str) -> bool:
        return self.state is ACTIVE and self.lease_token == token

    def due(self, now: float) -> bool:
        return self.state in CLAIMABLE and self.next_process_at <= now

    def claim_order(self) -> tuple[int, float, int]:
        """Claim order within a queue: higher priority, then due time, then enqueue order."""
        return (-self.priority, self.next_process_at, self.seq)

    def turn_order(self) -> tuple[int, int, int]:
        """W22, among the tasks of one fair template: priority, then turn, then enqueue order."""
        return (-self.priority, self.turn, self.seq)

    def end_lease(self) -> None:
        self.lease_token = None
        self.lease_expires_at = None
        self.lease_mono = None
        self.cancel_requested = False

    def lease_expired(self, mono: float) -> bool:
        """Active, and its lease ran out on the monotonic clock reading ``mono``."""
        return self.state is ACTIVE and self.lease_mono is not None and self.lease_mono <= mono


@dataclass(slots=True, eq=False)
class Group:
    """One group's record: the members' entries and the follow-up it creates."""

    params: GroupParams
    created_at: float
    #: Per member, in order: its entry in the follow-up, and its final state once finished.
    entries: list[bytes]
    states: list[str | None]
    finished: int = 0
    finished_at: float | None = None

    def info(self, tasks: dict[tuple[str, str], Row], now: float) -> GroupInfo:
        members = []
        for p, state in zip(self.params.members, self.states, strict=True):
            row = tasks.get((p.queue, p.id))
            live = None if row is None or row.gone(now) else row.state.value
            members.append(GroupMemberInfo(p.id, p.queue, p.type, state or live, state is not None))
        then = self.params.then
        return GroupInfo(
            id=self.params.id,
            queue=self.params.queue,
            total=len(self.entries),
            finished=self.finished,
            created_at=self.created_at,
            finished_at=self.finished_at,
            then_id=then.id if then else None,
            then_queue=then.queue if then else None,
            members=tuple(members),
        )


#: W22: a waiting task's place in its fair template's line: ``(-priority, turn, seq, row)``
#: (``seq`` is unique: two entries never compare their rows).
LineEntry = tuple[int, int, int, Row]


@dataclass(slots=True)
class Queue:
    name: str
    created_at: float
    paused: bool = False
    #: Tasks of the queue that a claim may take once due (pending, scheduled, retry).
    waiting: dict[str, Row] = field(default_factory=dict)
    #: Tasks of the queue waiting for a signal (state waiting, ``awaits`` set): the promoter
    #: makes those whose wait ran out pending.
    awaiting: dict[str, Row] = field(default_factory=dict)
    #: Flow-control keys of the queue, and the waiting tasks held on each.
    counters: dict[str, limiter.Counter] = field(default_factory=dict)
    held: dict[str, dict[str, Row]] = field(default_factory=dict)
    #: W22: the last turn given to each partition of a fair template (template, key), and
    #: each template's round (the turn of the latest of its tasks a claim started).
    turns: dict[tuple[str, str], int] = field(default_factory=dict)
    rounds: dict[str, int] = field(default_factory=dict)
    #: W22: per fair template, a heap of the entries of its waiting tasks in turn order
    #: (priority, then turn, then enqueue order). A task entering ``waiting`` (or changing
    #: priority there) pushes a new entry; an entry that is not its row's ``line_entry``, or
    #: whose row has left ``waiting``, is stale and dropped when it comes to the top. So a
    #: claim reads a template's first turns without sorting the whole queue again.
    lines: dict[str, list[LineEntry]] = field(default_factory=dict)

    def give_turn(self, row: Row) -> None:
        """W22: a stored task with a fair limit takes the next turn of its partition."""
        spec = row.limits[0]
        assert spec.fair is not None
        partition = (spec.fair, spec.key)
        row.turn = max(self.turns.get(partition, 0), self.rounds.get(spec.fair, 0)) + 1
        self.turns[partition] = row.turn

    def started(self, row: Row) -> None:
        """W22: a claim started a task with a fair limit: its template's round moves on."""
        name = row.limits[0].fair
        assert name is not None
        self.rounds[name] = max(self.rounds.get(name, 0), row.turn)

    def enter(self, row: Row) -> None:
        """``row`` joins the claimable set (``waiting``), or changed priority there."""
        self.waiting[row.id] = row
        if row.fair is not None:
            self.line_up(row)

    def line_up(self, row: Row) -> None:
        """W22: a new entry for ``row`` (waiting, with a fair limit) in its template's line;
        the one it had before is stale."""
        assert row.fair is not None
        entry = row.line_entry = (-row.priority, row.turn, row.seq, row)
        heapq.heappush(self.lines.setdefault(row.fair, []), entry)

    def line(self, name: str) -> list[LineEntry]:
        """W22: template ``name``'s line (a heap; may hold stale entries), its stale top
        dropped first, and the whole of it rebuilt when stale entries outnumber the rest."""
        line = self.lines.get(name)
        if not line:
            return []
        waiting = self.waiting
        while line and (
            (row := line[0][3]).line_entry is not line[0] or waiting.get(row.id) is not row
        ):
            heapq.heappop(line)
        if len(line) > 2 * len(waiting) + 64:
            line[:] = [r.line_entry for r in waiting.values() if r.fair == name and r.line_entry]
            heapq.heapify(line)
        return line

    def hold(self, row: Row, key: str) -> None:
        """Take a waiting task out of the claimable set until ``key`` has room."""
        self.waiting.pop(row.id, None)
        self.held.setdefault(key, {})[row.id] = row
        row.held = key
        self.counters[key].waiting = True

    def unhold(self, row: Row) -> None:
        if row.held is None:
            return
        rows = self.held.get(row.held)
        if rows is not None:
            rows.pop(row.id, None)
            if not rows:
                del self.held[row.held]
        row.held = None
        if row.state in CLAIMABLE:
            self.enter(row)

    def let_back(self, now: float) -> None:
        """Held tasks of keys that have room again go back to the claimable set in claim
        order, as many as there is room."""
        for key, counter in self.counters.items():
            if not counter.waiting:
                continue
            held = self.held.get(key, {})
            room = counter.room(now)
            if room <= 0 and held:
                continue  # a full key: no sort of its held tasks on every claim
            count = len(held)
            for row in heapq.nsmallest(room, held.values(), key=Row.claim_order):
                self.unhold(row)
            if room >= count:
                counter.waiting = False

    def wake_at(self, now: float) -> float | None:
        """When a token comes for a key with held tasks (the claim's ``wake_at``)."""
        return limiter.wake_at(self.counters.values(), now)

    def release(self, row: Row, keep: bool = False) -> bool:
        """An attempt of ``row`` ended: give back its running units (its cost) on each key,
        but for its sequences' keys when it ``keep`` s them (W25, marked ``kept``); whether
        tasks are held on one of its keys (the queue's workers should look again)."""
        row.kept = keep and limiter.keeps(row.limits)
        return self._give_back(limiter.given_back(row.limits, keep))

    def give_back_kept(self, row: Row) -> bool:
        """W25: ``row`` leaves without running (archived, cancelled, deleted): the slots of
        the keys it kept come back; whether tasks are held on one of them."""
        if not row.kept:
            return False
        row.kept = False
        return self._give_back(limiter.kept_back(row.limits))

    def _give_back(self, specs: tuple[LimitSpec, ...]) -> bool:
        wake = False
        for spec in specs:
            counter = self.counters.get(spec.key)
            if counter is not None:
                counter.running = max(0, counter.running - spec.cost)
                wake = wake or counter.waiting
        return wake

    def limit_stats(self, now: float) -> list[LimitStats]:
        return [
            c.stats(self.name, key, len(self.held.get(key, ())), now)
            for key, c in sorted(self.counters.items())
        ]


class Store:
    """The tasks of one ``memory://`` name, shared by every broker on it in this process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.tasks: dict[tuple[str, str], Row] = {}
        self.queues: dict[str, Queue] = {}
        self.unique: dict[str, Row] = {}
        #: ``(queue, day) -> [processed, failed]``.
        self.stats: dict[tuple[str, str], list[int]] = {}
        #: ``(queue, minute start) -> [processed, failed]``.
        self.minutes: dict[tuple[str, int], list[int]] = {}
        self.workers: dict[str, WorkerInfo] = {}
        #: Stored periodic schedules by name.
        self.schedules: dict[str, ScheduleRecord] = {}
        #: ``(queue, group id) -> Group``, and each unfinished member's group and position.
        self.groups: dict[tuple[str, str], Group] = {}
        self.members: dict[tuple[str, str], tuple[Group, int]] = {}
        #: Workflow records by id, with their creation time.
        self.workflows: dict[str, tuple[WorkflowParams, float]] = {}
        self._seq = itertools.count(1)
        # Key in the in-process wake-up registry (never an SQLite file's absolute path).
        self._key = f"memory://{name}"

    # -- wake-ups ------------------------------------------------------------------------------

    def mailbox(self) -> Mailbox:
        """A new mailbox for a broker on this store."""
        return mailbox.register(self._key)

    def notify(self, queues: Iterable[str]) -> None:
        """Wake waiters of every broker on this store (call without holding the lock)."""
        mailbox.notify(self._key, queues)

    def watches(self) -> Watches:
        """The watches of task ends on this store (``App.wait``)."""
        return mailbox.watches(self._key)

    def ended(self, tasks: Iterable[tuple[str, str]]) -> None:
        """These ``(queue, id)`` ended: wake their watches (call without holding the lock)."""
        mailbox.ended(self._key, tasks)

    # -- rows (callers hold the lock) ------------------------------------------------------------

    def queue(self, name: str, now: float) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = Queue(name, now)
        return queue

    def get(self, queue: str, task_id: str, now: float) -> Row | None:
        row = self.tasks.get((queue, task_id))
        return None if row is None or row.gone(now) else row

    def move(self, row: Row, state: TaskState) -> None:
        """Change a row's state, keeping the queue's index of waiting rows right."""
        queue = self.queues[row.queue]
        queue.unhold(row)
        if state in CLAIMABLE:
            queue.enter(row)
        else:
            queue.waiting.pop(row.id, None)
        if state is WAITING and row.awaits is not None:
            queue.awaiting[row.id] = row
        else:
            queue.awaiting.pop(row.id, None)
        row.state = state
        if state in (COMPLETED, ARCHIVED):
            self.release_unique(row)

    def release_unique(self, row: Row) -> None:
        if row.unique_key is not None and self.unique.get(row.unique_key) is row:
            del self.unique[row.unique_key]
        row.unique_key = row.unique_until = None

    def delete(self, row: Row) -> None:
        self.release_unique(row)
        queue = self.queues[row.queue]
        queue.unhold(row)
        queue.waiting.pop(row.id, None)
        queue.awaiting.pop(row.id, None)
        del self.tasks[(row.queue, row.id)]

    def insert(self, p: EnqueueParams, now: float) -> Row:
        """Create one task, or raise its conflict (E3) or duplicate (E4) writing nothing."""
        existing = self.tasks.get((p.queue, p.id))
        if existing is not None:
            if not existing.gone(now):
                raise TaskIDConflictError(
                    f"task {p.id!r} already exists in queue {p.queue!r} ({existing.state})",
                    existing=existing.info(),
                )
            self.delete(existing)
        if p.unique_key is not None:
            holder = self.unique.get(p.unique_key)
            if (
                holder is not None
                and holder.unique_until is not None
                and holder.unique_until <= now
            ):
                self.release_unique(holder)
                holder = None
            if holder is not None:
                raise DuplicateTaskError(
                    f"an identical task {holder.id!r} is already queued", existing_id=holder.id
                )
        until = p.scheduled_until(now)
        scheduled = until is not None
        holding = (
            [d for d in map(self.tasks.get, p.after) if d is not None and self.holds(d, now)]
            if p.after
            else ()
        )
        row = Row(
            id=p.id,
            queue=p.queue,
            type=p.type,
            payload=bytes(p.payload),
            state=WAITING if holding else SCHEDULED if scheduled else PENDING,
            max_retry=p.max_retry,
            seq=next(self._seq),
            next_process_at=now if until is None else until,
            enqueued_at=now,
            timeout=p.timeout,
            deadline=p.deadline,
            retention=p.retention,
            headers=dict(p.headers),
            priority=p.priority,
            limits=p.limits,
            fair=p.limits[0].fair if p.limits else None,
        )
        if p.unique_key is not None:
            row.unique_key = p.unique_key
            row.unique_until = None if p.unique_ttl is None else now + p.unique_ttl
            self.unique[p.unique_key] = row
        self.tasks[(p.queue, p.id)] = row
        queue = self.queue(p.queue, now)
        if row.fair is not None:
            queue.give_turn(row)
        if holding:
            row.waiting_for = len(holding)
            for dependency in holding:
                known = dependencies.decode(dependency.dependents)
                known.append((p.queue, p.id))
                dependency.dependents = json.dumps(known)
        else:
            queue.waiting[row.id] = row  # Queue.enter, without a call for a plain task
            if row.fair is not None:
                queue.line_up(row)
        return row

    @staticmethod
    def holds(row: Row, now: float) -> bool:
        """Whether ``row`` is a dependency that has not finished (and is not gone)."""
        return not row.gone(now) and dependencies.unfinished(row.state)

    def release_dependents(self, row: Row, now: float) -> set[str]:
        """``row`` finished (or is deleted unfinished): count its dependents down and release
        those it was the last for; the queues that got pending work."""
        raw, row.dependents = row.dependents, None
        woken: set[str] = set()
        for key, n in dependencies.countdown([raw]).items():
            waiting = self.tasks.get(key)
            if waiting is None or waiting.state is not WAITING:
                continue  # cancelled, deleted or archived meanwhile
            waiting.waiting_for = dependencies.left_after(waiting.waiting_for, n)
            if waiting.waiting_for == 0:
                to = dependencies.released(waiting.next_process_at, now)
                self.move(waiting, to)
                if to is PENDING:
                    woken.add(waiting.queue)
        return woken

    def insert_follow_ups(self, follow_ups: Iterable[EnqueueParams], now: float) -> set[str]:
        """Create follow-up tasks; one whose id or unique key is taken is skipped. Returns
        the queues that got pending work."""
        woken: set[str] = set()
        for p in follow_ups:
            try:
                row = self.insert(p, now)
            except (TaskIDConflictError, DuplicateTaskError):
                continue  # created by an earlier outcome of the same task
            if row.state is PENDING:
                woken.add(p.queue)
        return woken

    def check_insert(self, p: EnqueueParams, now: float) -> None:
        """Raise what :meth:`insert` would raise for ``p``, writing nothing."""
        existing = self.tasks.get((p.queue, p.id))
        if existing is not None and not existing.gone(now):
            raise TaskIDConflictError(
                f"task {p.id!r} already exists in queue {p.queue!r} ({existing.state})",
                existing=existing.info(),
            )
        if p.unique_key is not None:
            holder = self.unique.get(p.unique_key)
            if holder is not None and (holder.unique_until is None or holder.unique_until > now):
                raise DuplicateTaskError(
                    f"an identical task {holder.id!r} is already queued", existing_id=holder.id
                )

    def insert_graph(self, items: Sequence[EnqueueParams], now: float) -> list[Row]:
        """Create every task of a graph (``after`` naming earlier items), or raise the first
        refusal writing nothing."""
        edges = dependencies.graph_edges(items)
        check_distinct(items, now)
        for p in items:
            self.check_insert(p, now)
        rows = [self.insert(replace(p, after=()), now) for p in items]
        # Each dependency is an earlier item, created unfinished: every edge holds. Each
        # list of dependents is written once (appending one by one re-encodes it each time).
        listed: dict[int, list[tuple[str, str]]] = {}
        for row, e in zip(rows, edges, strict=True):
            if e:
                self.move(row, WAITING)
                row.waiting_for = len(e)
                for j in e:
                    listed.setdefault(j, []).append((row.queue, row.id))
        for j, dependents in listed.items():
            rows[j].dependents = json.dumps(dependents)
        return rows

    def insert_group(self, p: GroupParams, now: float) -> list[Row]:
        """Create a group, its members and its follow-up (waiting for the group), or raise
        the first refusal writing nothing."""
        then = waiting_follow_up(p)
        earlier: dict[str, str] = {}  # unique key -> member: a later member must not take it
        for member in (*p.members, *([then] if then else [])):
            self.check_insert(member, now)
            if member.unique_key is None:
                continue
            if member.unique_key in earlier:
                raise DuplicateTaskError(
                    f"an identical task {earlier[member.unique_key]!r} is already queued",
                    existing_id=earlier[member.unique_key],
                )
            earlier[member.unique_key] = member.id
        group = Group(p, now, list(p.unfinished), [None] * len(p.members))
        rows = [self.insert(member, now) for member in p.members]
        if then is not None:
            # Waits for one thing, its group: the group's own count releases it.
            row = self.insert(then, now)
            self.move(row, WAITING)
            row.waiting_for = 1
        self.groups[(p.queue, p.id)] = group
        for i, member in enumerate(p.members):
            self.members[(member.queue, member.id)] = (group, i)
        return rows

    def finish_member(
        self, queue: str, task_id: str, state: str, entry: bytes | None, now: float
    ) -> set[str]:
        """Record a member's final outcome (``entry`` None: its stored deleted entry) and
        release the group's follow-up with its payload if it was the last; the queues that
        got work."""
        found = self.members.pop((queue, task_id), None)
        if found is None:
            return set()
        group, i = found
        group.states[i] = state
        if entry is not None:
            group.entries[i] = entry
        group.finished += 1
        if group.finished < len(group.entries):
            return set()
        group.finished_at = now
        then = group.params.then
        if then is None:
            return set()
        row = self.tasks.get((then.queue, then.id))
        if row is None or row.state is not WAITING:
            return set()  # the waiting follow-up was cancelled or deleted: it never runs
        row.payload = fan_in_payload(then.payload, group.entries, group.params.tail)
        row.waiting_for = 0
        to = dependencies.released(row.next_process_at, now)
        self.move(row, to)
        return {row.queue} if to is PENDING else set()

    def forget(self, row: Row, now: float) -> set[str]:
        """A task is deleted by the inspector: an unfinished member finishes as deleted, and
        its dependents count it as finished."""
        if row.state in (COMPLETED, ARCHIVED):
            return set()
        woken = self.release_dependents(row, now)
        return woken | self.finish_member(row.queue, row.id, "deleted", None, now)

    def workflow(self, workflow_id: str, now: float) -> WorkflowRecord | None:
        """A workflow's record with its nodes' tasks as they are now."""
        stored = self.workflows.get(workflow_id)
        if stored is None:
            return None
        p, created_at = stored
        nodes = []
        for n in p.nodes:
            row = self.get(n.queue, n.task_id, now)
            nodes.append(
                WorkflowNodeInfo(
                    n.name,
                    n.queue,
                    n.task_id,
                    n.type,
                    n.on_failure,
                    n.after,
                    None if row is None else row.state,
                    0 if row is None else row.retried,
                    None if row is None else row.last_error,
                )
            )
        return WorkflowRecord(p.id, p.name, created_at, p.retention, tuple(nodes))

    def drop_expired_workflows(self, now: float, limit: int) -> None:
        """Up to ``limit`` workflow records past their retention none of whose nodes'
        tasks is left."""
        expired = [
            wf_id
            for wf_id, (p, created_at) in self.workflows.items()
            if created_at + p.retention <= now
            and all(self.get(n.queue, n.task_id, now) is None for n in p.nodes)
        ]
        for wf_id in expired[:limit]:
            del self.workflows[wf_id]

    def drop_expired_groups(self, now: float) -> None:
        for key, group in list(self.groups.items()):
            done = group.finished_at
            if done is not None and done + group.params.retention <= now:
                del self.groups[key]

    def lease(self, row: Row, now: float, mono: float, lease_seconds: float, worker_id: str) -> str:
        self.move(row, ACTIVE)
        row.lease_token = secrets.token_hex(16)
        row.lease_expires_at = now + lease_seconds
        row.lease_mono = mono + lease_seconds
        row.worker_id = worker_id
        row.started_at = now
        row.cancel_requested = False
        return row.lease_token

    def bump(self, queue: str, now: float, *, failed: bool, count: int = 1) -> None:
        for counters in (
            self.stats.setdefault((queue, utc_day(now).isoformat()), [0, 0]),
            self.minutes.setdefault((queue, minute_of(now)), [0, 0]),
        ):
            counters[0] += count
            if failed:
                counters[1] += count

    def prune_minutes(self, before: float) -> None:
        for key in [k for k in self.minutes if k[1] < before]:
            del self.minutes[key]

    def rows(self, queue: str) -> Iterator[Row]:
        return (row for (q, _), row in self.tasks.items() if q == queue)


_lock = threading.Lock()
# Weak: a name's tasks live as long as a broker on it does (an app keeps its brokers).
_stores: weakref.WeakValueDictionary[str, Store] = weakref.WeakValueDictionary()


def store_for(name: str) -> Store:
    """The store of ``memory://name`` in this process, created when first asked for."""
    with _lock:
        store = _stores.get(name)
        if store is None:
            store = _stores[name] = Store(name)
        return store
