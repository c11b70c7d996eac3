"""The in-memory broker (``memory://`` or ``memory://name``): tasks live in this process.

For tests (see ``durq.testing``), notebooks and scripts: nothing to install or start, no
thread, no file. Brokers of one process on the same name share the tasks; another process
sees none of them, and they are gone once no broker on the name is left. Every operation is
atomic (one lock), fenced by lease tokens like the other brokers."""

from __future__ import annotations

import asyncio
import heapq
import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Self
from urllib.parse import urlsplit

from durq.brokers import limiter
from durq.brokers.contract import (
    CAP_CROSS_QUEUE_FOLLOW_UPS,
    CAP_CROSS_QUEUE_GROUPS,
    CAP_DEPENDENCIES,
    EndWatch,
)
from durq.brokers.mailbox import Waiter, end_key
from durq.brokers.memory.admin import MemoryAdmin
from durq.brokers.memory.storage import (
    ARCHIVED,
    COMPLETED,
    PENDING,
    RETRY,
    SCHEDULED,
    WAITING,
    Queue,
    Row,
    Store,
    store_for,
)
from durq.brokers.params import (
    ArchivedRetention,
    ArchiveParams,
    Claimed,
    ClaimParams,
    CompleteParams,
    EnqueueOutcome,
    EnqueueParams,
    GroupParams,
    Lease,
    LeaseMove,
    LeaseRef,
    LeaseReport,
    ProgressParams,
    RetryParams,
    SignalParams,
    StepsParams,
    TwinReplace,
    UniqueRelease,
    WorkflowParams,
    ended_by,
)
from durq.brokers.views import FORGET_WORKERS_AFTER, MINUTE_COUNTS_KEEP, WorkerInfo
from durq.clock import SYSTEM_CLOCK, Clock
from durq.errors import (
    ConfigurationError,
    DuplicateTaskError,
    TaskIDConflictError,
    TaskNotFoundError,
)
from durq.progress import append_lines
from durq.task import TaskInfo


class MemoryBroker:
    """Broker and Admin on a :class:`~durq.brokers.memory.storage.Store` of this process: the
    hot path here, the inspector in :class:`MemoryAdmin`."""

    name = "memory"
    capabilities: frozenset[str] = frozenset(
        {CAP_CROSS_QUEUE_FOLLOW_UPS, CAP_CROSS_QUEUE_GROUPS, CAP_DEPENDENCIES}
    )

    def __init__(self, name: str = "", *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.url = f"memory://{name}"
        self._store: Store = store_for(name)
        self._clock = clock
        self._mailbox = self._store.mailbox()
        self.admin = MemoryAdmin(self._store, clock)

    @property
    def clock(self) -> Clock:
        """The clock this broker stamps times with."""
        return self._clock

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK) -> Self:
        """``memory://`` or ``memory://name``: brokers on one name share their tasks."""
        parts = urlsplit(url)
        if parts.scheme.lower() != "memory":
            raise ConfigurationError(f"not a memory URL: {url!r}")
        if parts.query or parts.fragment:
            raise ConfigurationError(f"memory URLs take no options: {url!r}")
        return cls(parts.netloc + parts.path, clock=clock)

    def __repr__(self) -> str:
        return f"<MemoryBroker {self.url}>"

    # -- lifecycle: nothing to open --------------------------------------------------------------

    async def connect(self) -> None:
        """Nothing to connect to."""

    async def close(self) -> None:
        """Nothing to release: the tasks stay while any broker on the name exists."""

    async def migrate(self) -> list[str]:
        """No schema."""
        return []

    async def pending_migrations(self) -> list[str]:
        """No schema."""
        return []

    async def ping(self) -> None:
        """Always reachable."""

    # -- enqueue ---------------------------------------------------------------------------------

    async def enqueue(self, params: EnqueueParams, *, connection: Any = None) -> TaskInfo:
        """Create one task, checking task id (E3) and uniqueness (E4) atomically."""
        self._no_connection(connection)
        store = self._store
        with store.lock:
            info = store.insert(params, self._clock.now()).info()
        store.notify([params.queue])
        return info

    async def enqueue_many(
        self, items: Sequence[EnqueueParams], *, connection: Any = None
    ) -> list[EnqueueOutcome]:
        """Every item in one step; a refused item does not undo the others (E9)."""
        self._no_connection(connection)
        store = self._store
        outcomes: list[EnqueueOutcome] = []
        with store.lock:
            now = self._clock.now()
            for p in items:
                try:
                    outcomes.append(EnqueueOutcome(p, info=store.insert(p, now).info()))
                except (TaskIDConflictError, DuplicateTaskError) as exc:
                    outcomes.append(EnqueueOutcome(p, error=exc))
        store.notify({o.params.queue for o in outcomes if o.created})
        return outcomes

    async def enqueue_group(self, params: GroupParams) -> list[TaskInfo]:
        """The group, all its members and the waiting follow-up in one step, or nothing."""
        store = self._store
        with store.lock:
            infos = [row.info() for row in store.insert_group(params, self._clock.now())]
        store.notify({i.queue for i in infos if i.state is PENDING})
        return infos

    async def enqueue_graph(
        self, items: Sequence[EnqueueParams], workflow: WorkflowParams | None = None
    ) -> list[TaskInfo]:
        """Every task of a graph and the workflow's record in one step, or nothing."""
        store = self._store
        with store.lock:
            now = self._clock.now()
            infos = [row.info() for row in store.insert_graph(items, now)]
            if workflow is not None:
                store.workflows[workflow.id] = (workflow, round(now, 6))
        store.notify({i.queue for i in infos if i.state is PENDING})
        return infos

    def _no_connection(self, connection: Any) -> None:
        if connection is not None:
            raise ConfigurationError(
                "the memory broker has no transaction to join: enqueue without connection="
            )

    # -- claim and leases ------------------------------------------------------------------------

    async def claim(self, params: ClaimParams) -> list[Lease]:
        """Lease up to ``limit`` due tasks, filling from the queues in the order given."""
        if params.limit <= 0:
            return []
        queues = list(dict.fromkeys(params.queues))
        self._mailbox.take(queues)  # notifications so far are answered by this claim
        store = self._store
        leases = Claimed()
        with store.lock:
            now = self._clock.now()
            for name in queues:
                queue = store.queues.get(name)
                if queue is None or queue.paused:
                    continue
                if queue.counters:
                    queue.let_back(now)
                due = [row for row in queue.waiting.values() if row.next_process_at <= now]
                due.sort(key=Row.claim_order)
                for row, _ in limiter.in_turns(due, _ident, _template, _turns(queue, now)):
                    if len(leases) >= params.limit:
                        break
                    if row.limits:
                        full = limiter.admit(row.limits, queue.counters, now, row.kept)
                        if full is not None:
                            queue.hold(row, full)  # no head-of-line blocking: skip it
                            continue
                        if row.turn:
                            queue.started(row)
                    token = store.lease(
                        row, now, self._clock.monotonic(), params.lease_seconds, params.worker_id
                    )
                    leases.append(Lease(row.info(), token))
                if queue.counters:
                    wake_at = queue.wake_at(now)
                    if wake_at is not None and (leases.wake_at is None or wake_at < leases.wake_at):
                        leases.wake_at = wake_at
                if len(leases) >= params.limit:
                    break
        if len(leases) >= params.limit:
            self._mailbox.post(frozenset(queues))  # a full claim may have left work behind
        return leases

    async def extend_leases(self, leases: Sequence[LeaseRef], lease_seconds: float) -> LeaseReport:
        """Push every held lease's expiry; report lost ones and cancel requests."""
        lost: set[str] = set()
        cancel: set[str] = set()
        with self._store.lock:
            now, mono = self._clock.now(), self._clock.monotonic()
            for ref in leases:
                row = self._held(ref)
                if row is None:
                    lost.add(ref.id)
                    continue
                row.lease_expires_at = now + lease_seconds
                row.lease_mono = mono + lease_seconds
                if row.cancel_requested:
                    cancel.add(ref.id)
        return LeaseReport(lost=frozenset(lost), cancel=frozenset(cancel))

    def _held(self, ref: LeaseRef) -> Row | None:
        row = self._store.tasks.get((ref.queue, ref.id))
        return row if row is not None and row.holds(ref.token) else None

    def _complete(self, p: CompleteParams, now: float, woken: set[str]) -> bool:
        store = self._store
        row = self._held(p.lease)
        if row is None:
            return False
        if row.limits and store.queues[row.queue].release(row):
            woken.add(row.queue)
        if p.retention > 0:
            store.move(row, COMPLETED)
            row.completed_at = now
            row.result = p.result
            row.retention = p.retention
            row.expires_at = now + p.retention
            row.end_lease()
        else:
            store.delete(row)
        store.bump(row.queue, now, failed=False)
        if row.dependents is not None:
            woken |= store.release_dependents(row, now)
        woken |= store.insert_follow_ups(p.follow_ups, now)
        if p.group is not None:
            woken |= store.finish_member(row.queue, row.id, p.group.state, p.group.entry, now)
        return True

    async def complete(self, params: CompleteParams) -> bool:
        """Completed (kept ``retention`` s with its result) or deleted, with its follow-ups."""
        return (await self.complete_many([params]))[0]

    async def complete_many(self, items: Sequence[CompleteParams]) -> list[bool]:
        """``complete`` for several tasks in one step."""
        woken: set[str] = set()
        with self._store.lock:
            now = self._clock.now()
            done = [self._complete(p, now, woken) for p in items]
        self._store.notify(woken)
        self._store.ended(p.lease.task_key for p, ok in zip(items, done, strict=True) if ok)
        return done

    def _move(self, p: LeaseMove, now: float, woken: set[str]) -> bool:
        """One fenced retry or archive (also fenced by ``expired_by``), its counters and its
        follow-ups."""
        store = self._store
        row = self._held(p.lease)
        if row is None:
            return False
        if p.expired_by is not None and not row.lease_expired(self._clock.monotonic()):
            return False
        keep = isinstance(p, RetryParams) and p.keep
        if row.limits and store.queues[row.queue].release(row, keep):
            woken.add(row.queue)
        snooze = isinstance(p, RetryParams) and p.snooze
        count = not snooze and (not isinstance(p, ArchiveParams) or p.count_attempt)
        row.retried += int(count)
        row.lost += int(p.lost)
        if snooze:
            row.snoozes += 1
        else:
            row.last_error = p.error
            row.traceback = p.traceback
        row.end_lease()
        if isinstance(p, RetryParams):
            row.awaits = p.awaits
            if p.awaits is not None and p.awaits in row.signals:
                # Waits for a signal delivered already: no wait at all.
                store.move(row, PENDING)
                row.next_process_at = now
                woken.add(row.queue)
            else:
                awaits = p.awaits is not None
                store.move(row, WAITING if awaits else SCHEDULED if snooze else RETRY)
                row.next_process_at = now + max(0.0, p.delay)
                if p.delay <= 0 and not awaits:
                    woken.add(row.queue)
        else:
            store.move(row, ARCHIVED)
            row.expires_at = now  # the moment it was archived, as on the SQL brokers
            if row.dependents is not None:
                woken |= store.release_dependents(row, now)
            woken |= store.insert_follow_ups(p.follow_ups, now)
            if p.group is not None:
                woken |= store.finish_member(row.queue, row.id, p.group.state, p.group.entry, now)
        if count:
            store.bump(row.queue, now, failed=True)
        return True

    async def move_leases(self, moves: Sequence[LeaseMove]) -> list[bool]:
        """Several fenced retry/archive moves in one step."""
        woken: set[str] = set()
        with self._store.lock:
            now = self._clock.now()
            done = [self._move(p, now, woken) for p in moves]
        self._store.notify(woken)
        self._store.ended(ended_by(moves, done))
        return done

    async def retry(self, params: RetryParams) -> bool:
        """State retry for ``delay`` seconds, ``retried`` + 1."""
        return (await self.move_leases([params]))[0]

    async def archive(self, params: ArchiveParams) -> bool:
        """State archived with the error, with its follow-ups."""
        return (await self.move_leases([params]))[0]

    async def report_progress(self, params: ProgressParams) -> bool:
        """Store an attempt's progress and log lines, fenced by its token."""
        with self._store.lock:
            row = self._held(params.lease)
            if row is None:
                return False
            if params.progress is not None:
                row.progress = params.progress or None
            if params.lines:
                row.logs = append_lines(row.logs, params.lines)
        return True

    async def read_steps(self, lease: LeaseRef) -> str | None:
        """The stored steps of a task."""
        with self._store.lock:
            row = self._held(lease)
            return None if row is None else row.steps

    async def read_signals(self, lease: LeaseRef) -> str | None:
        """The signals stored on a leased task, as one JSON object's text."""
        with self._store.lock:
            row = self._held(lease)
            if row is None or not row.signals:
                return None
            return "{" + ",".join(f"{json.dumps(n)}:{v}" for n, v in row.signals.items()) + "}"

    async def signal(self, params: SignalParams) -> str:
        """Store a signal once; wake the task if it waits for it (see the contract)."""
        with self._store.lock:
            now = self._clock.now()
            row = self._store.get(params.queue, params.id, now)
            if row is None:
                raise TaskNotFoundError(f"no task {params.id!r} in queue {params.queue!r}")
            if params.name in row.signals:  # before "finished": a sender calling again
                return "duplicate"
            if row.state in (COMPLETED, ARCHIVED):
                return "finished"
            row.signals[params.name] = params.payload
            if row.state is not WAITING or row.awaits != params.name:
                return "kept"
            self._store.move(row, PENDING)
            row.next_process_at = now
        self._store.notify({params.queue})
        return "woken"

    async def free_unique(self, params: UniqueRelease) -> bool:
        """Free a twin's unique key while it is in one of ``params.states``."""
        with self._store.lock:
            row = self._store.get(params.queue, params.id, self._clock.now())
            if row is None or row.unique_key != params.key or row.state not in params.states:
                return False
            self._store.release_unique(row)
            return True

    async def replace_twin(self, params: TwinReplace) -> TaskInfo | None:
        """Change a waiting twin in place (see :class:`TwinReplace`)."""
        with self._store.lock:
            now = self._clock.now()
            row = self._store.get(params.queue, params.id, now)
            if row is None or row.unique_key != params.key:
                return None
            if row.state not in (PENDING, SCHEDULED, RETRY):
                return None
            row.payload = params.payload
            if row.state is SCHEDULED:
                if params.delay is not None:
                    due = now + params.delay
                    if params.within is not None:
                        due = min(due, row.enqueued_at + params.within)
                    row.next_process_at = due
                if params.priority is not None:
                    row.priority = params.priority
                    self._store.queues[row.queue].enter(row)  # W22: its place in line
            return row.info()

    async def read_snoozes(self, lease: LeaseRef) -> int | None:
        """How often a leased task was snoozed."""
        with self._store.lock:
            row = self._held(lease)
            return None if row is None else row.snoozes

    async def record_steps(self, params: StepsParams) -> bool:
        """Store an attempt's durable steps, fenced by its token."""
        with self._store.lock:
            row = self._held(params.lease)
            if row is None:
                return False
            row.steps = params.steps
        return True

    async def record_steps_many(self, items: Sequence[StepsParams]) -> list[bool]:
        """Several attempts' durable steps, in order, each fenced by its token."""
        return [await self.record_steps(p) for p in items]

    async def requeue(self, lease: LeaseRef, keep: bool = False) -> bool:
        """Back to pending, due now, without counting an attempt (W7); ``keep``: it keeps
        its sequences' keys (W25)."""
        store = self._store
        with store.lock:
            row = self._held(lease)
            if row is None:
                return False
            if row.limits:
                store.queues[row.queue].release(row, keep)
            store.move(row, PENDING)
            row.next_process_at = self._clock.now()
            row.end_lease()
        store.notify([lease.queue])
        return True

    # -- maintenance -----------------------------------------------------------------------------

    async def promote_due(self) -> int:
        """Move due scheduled/retry tasks (claim also takes them directly) and waits for a
        signal whose time ran out to pending."""
        store = self._store
        woken: set[str] = set()
        count = 0
        with store.lock:
            now = self._clock.now()
            for queue in store.queues.values():
                due = [*queue.waiting.values(), *queue.awaiting.values()]
                for row in due:
                    if row.state is not PENDING and row.next_process_at <= now:
                        store.move(row, PENDING)
                        woken.add(row.queue)
                        count += 1
        store.notify(woken)
        return count

    async def expired_leases(self, limit: int) -> list[Lease]:
        """Active tasks whose lease expired by now, oldest expiry first."""
        with self._store.lock:
            mono = self._clock.monotonic()
            expired = [row for row in self._store.tasks.values() if row.lease_expired(mono)]
            expired.sort(key=lambda row: row.lease_expires_at or 0.0)
            return [Lease(row.info(), row.lease_token or "") for row in expired[:limit]]

    async def delete_archived(self, retention: ArchivedRetention, limit: int) -> int:
        """Delete up to ``limit`` archived tasks past their queue's archived retention."""
        store = self._store
        with store.lock:
            now = self._clock.now()
            old = [
                row
                for row in store.tasks.values()
                if row.state is ARCHIVED
                and (keep := retention.of(row.queue)) is not None
                and row.expires_at is not None
                and row.expires_at <= now - keep
            ][:limit]
            for row in old:
                store.delete(row)
        return len(old)

    async def delete_expired(self, limit: int) -> int:
        """Delete up to ``limit`` completed tasks past their retention."""
        store = self._store
        with store.lock:
            now = self._clock.now()
            store.prune_minutes(now - MINUTE_COUNTS_KEEP)
            expired = [row for row in store.tasks.values() if row.gone(now)][:limit]
            for row in expired:
                store.delete(row)
            store.drop_expired_groups(now)
            store.drop_expired_workflows(now, limit)
        return len(expired)

    # -- wake-up ---------------------------------------------------------------------------------

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Wait for an enqueue into ``queues`` by any broker on this name, or ``timeout``.

        Level-triggered: work announced since this broker's last claim returns at once."""
        waiter = Waiter(asyncio.get_running_loop(), queues)
        self._mailbox.park(waiter)  # before looking: nothing slips between
        try:
            if self._mailbox.take(queues):
                return True
            try:
                async with asyncio.timeout(max(0.0, timeout)):
                    await waiter.event.wait()
            except TimeoutError:
                return False
            self._mailbox.take(queues)
            return True
        finally:
            self._mailbox.unpark(waiter)

    @asynccontextmanager
    async def watch_end(self, queue: str, task_id: str) -> AsyncIterator[EndWatch]:
        """Subscribe to the end of one task: woken by brokers of this process on the name."""
        async with self._store.watches().watching(end_key(queue, task_id)) as watch:
            yield watch

    # -- workers ---------------------------------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        """Insert or refresh the worker (its heartbeat); makes its queues known."""
        store = self._store
        with store.lock:
            now = self._clock.now()
            store.workers[info.id] = _replace_heartbeat(info, now)
            for queue in info.queues:
                store.queue(queue, now)
            forget = now - FORGET_WORKERS_AFTER
            for worker_id, worker in list(store.workers.items()):
                if worker.last_heartbeat < forget:
                    del store.workers[worker_id]

    async def unregister_worker(self, worker_id: str) -> None:
        """Forget the worker at shutdown."""
        with self._store.lock:
            self._store.workers.pop(worker_id, None)

    async def durability_warnings(self) -> list[str]:
        """Everything is lost with the process: by design, nothing to warn about."""
        return []


def _replace_heartbeat(info: WorkerInfo, now: float) -> WorkerInfo:
    return WorkerInfo(
        id=info.id,
        host=info.host,
        pid=info.pid,
        queues=dict(info.queues),
        concurrency=info.concurrency,
        started_at=info.started_at,
        last_heartbeat=now,
        active=info.active,
        strict=info.strict,
    )


def _ident(row: Row) -> str:
    return row.id


def _template(row: Row) -> str | None:
    return row.fair


def _turns(queue: Queue, now: float) -> Callable[[str], Iterator[Row]]:
    """W22: a fair template's claimable tasks (waiting, due, not held) in turn order."""

    def turns(name: str) -> Iterator[Row]:
        # Popped from a copy of the template's line as far as the claim reads: a claim of
        # one fair task sorted the whole queue's rows of the template before (1.77x the
        # instructions of a limited claim, 300 tasks waiting).
        line = list(queue.line(name))
        waiting = queue.waiting
        while line:
            entry = heapq.heappop(line)
            row = entry[3]
            if (
                row.line_entry is entry
                and waiting.get(row.id) is row
                and row.held is None
                and row.next_process_at <= now
            ):
                yield row

    return turns
