"""The in-memory broker (``memory://`` or ``memory://name``): tasks live in this process.

For tests (see ``durq.testing``), notebooks and scripts: nothing to install or start, no
thread, no file. Brokers of one process on the same name share the tasks; another process
sees none of them, and they are gone once no broker on the name is left. Every operation is
atomic (one lock), fenced by lease tokens like the other brokers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Self
from urllib.parse import urlsplit

from durq import continuations
from durq.brokers.base import (
    CAP_ATOMIC_FOLLOW_UPS,
    CAP_CROSS_QUEUE_FOLLOW_UPS,
    ArchiveParams,
    ClaimParams,
    CompleteParams,
    EnqueueOutcome,
    EnqueueParams,
    Lease,
    LeaseRef,
    LeaseReport,
    QueueStats,
    RetryParams,
    WorkerInfo,
)
from durq.brokers.memory.store import WAITING, A, C, P, R, Row, Store, X, store_for, utc_day
from durq.brokers.sqlite.wakeup import Waiter
from durq.clock import SYSTEM_CLOCK, Clock
from durq.errors import (
    ConfigurationError,
    DuplicateTaskError,
    InvalidStateError,
    QueueNotFoundError,
    TaskIDConflictError,
    TaskNotFoundError,
)
from durq.states import TaskState
from durq.task import TaskInfo

#: list_workers shows workers whose heartbeat is younger than this.
WORKER_TTL = 60.0
#: Worker rows silent for this long are forgotten when another worker registers.
FORGET_WORKERS_AFTER = 24 * 3600.0
RESCUE_BATCH = 500
_RUNNABLE = frozenset({TaskState.SCHEDULED, TaskState.RETRY, TaskState.ARCHIVED})


class MemoryBroker:
    """Broker and Admin on a :class:`~durq.brokers.memory.store.Store` of this process."""

    name = "memory"
    capabilities: frozenset[str] = frozenset({CAP_ATOMIC_FOLLOW_UPS, CAP_CROSS_QUEUE_FOLLOW_UPS})

    def __init__(self, name: str = "", *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.url = f"memory://{name}"
        self._store: Store = store_for(name)
        self._clock = clock
        self._mailbox = self._store.mailbox()

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
        leases: list[Lease] = []
        with store.lock:
            now = self._clock.now()
            for name in queues:
                queue = store.queues.get(name)
                if queue is None or queue.paused:
                    continue
                due = [row for row in queue.waiting.values() if row.next_process_at <= now]
                due.sort(key=lambda row: (row.next_process_at, row.seq))
                for row in due[: params.limit - len(leases)]:
                    token = store.lease(row, now, params.lease_seconds, params.worker_id)
                    leases.append(Lease(row.info(), token))
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
            now = self._clock.now()
            for ref in leases:
                row = self._held(ref)
                if row is None:
                    lost.add(ref.id)
                    continue
                row.lease_expires_at = now + lease_seconds
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
        if p.retention > 0:
            store.move(row, C)
            row.completed_at = now
            row.result = p.result
            row.retention = p.retention
            row.expires_at = now + p.retention
            row.end_lease()
        else:
            store.delete(row)
        store.bump(row.queue, now, failed=False)
        woken |= store.insert_follow_ups(p.follow_ups, now)
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
        return done

    def _end_attempt(
        self, lease: LeaseRef, state: TaskState, error: str, count: bool
    ) -> Row | None:
        """Fenced: the held row leaves active for ``state`` with ``error``; ``count`` adds the
        attempt (``retried`` and the failed counters). ``None`` if the lease is not held."""
        row = self._held(lease)
        if row is None:
            return None
        self._store.move(row, state)
        row.retried += int(count)
        row.last_error = error
        row.end_lease()
        if count:
            self._store.bump(row.queue, self._clock.now(), failed=True)
        return row

    async def retry(self, params: RetryParams) -> bool:
        """State retry until ``next_process_at``, ``retried`` + 1."""
        with self._store.lock:
            row = self._end_attempt(params.lease, R, params.error, True)
            if row is None:
                return False
            row.next_process_at = params.next_process_at
            due = params.next_process_at <= self._clock.now()
        if due:
            self._store.notify([row.queue])
        return True

    async def archive(self, params: ArchiveParams) -> bool:
        """State archived with the error, with its follow-ups."""
        store = self._store
        with store.lock:
            row = self._end_attempt(params.lease, X, params.error, params.count_attempt)
            if row is None:
                return False
            woken = store.insert_follow_ups(params.follow_ups, self._clock.now())
        store.notify(woken)
        return True

    async def requeue(self, lease: LeaseRef) -> bool:
        """Back to pending, due now, without counting an attempt (W7)."""
        store = self._store
        with store.lock:
            row = self._held(lease)
            if row is None:
                return False
            store.move(row, P)
            row.next_process_at = self._clock.now()
            row.end_lease()
        store.notify([lease.queue])
        return True

    # -- maintenance -----------------------------------------------------------------------------

    async def promote_due(self) -> int:
        """Move due scheduled/retry tasks to pending (claim also takes them directly)."""
        store = self._store
        woken: set[str] = set()
        count = 0
        with store.lock:
            now = self._clock.now()
            for queue in store.queues.values():
                for row in list(queue.waiting.values()):
                    if row.state is not P and row.next_process_at <= now:
                        store.move(row, P)
                        woken.add(row.queue)
                        count += 1
        store.notify(woken)
        return count

    async def rescue_expired(self, max_lost: int) -> list[TaskInfo]:
        """Expired leases -> retry due now ("lease expired"), or archived when the worker was
        lost ``max_lost`` times ("worker lost") or the retries are used up."""
        store = self._store
        rescued: list[TaskInfo] = []
        woken: set[str] = set()
        with store.lock:
            now = self._clock.now()
            expired = [
                row
                for row in store.tasks.values()
                if row.state is A and row.lease_expires_at is not None
                if row.lease_expires_at <= now
            ]
            expired.sort(key=lambda row: row.lease_expires_at or 0.0)
            for row in expired[:RESCUE_BATCH]:
                row.retried += 1
                row.lost += 1
                row.end_lease()
                store.bump(row.queue, now, failed=True)
                if row.lost >= max_lost or row.retried > row.max_retry:
                    row.last_error = "worker lost" if row.lost >= max_lost else "lease expired"
                    store.move(row, X)
                    info = row.info()
                    woken |= store.insert_follow_ups(continuations.for_archived(info), now)
                else:
                    row.last_error = "lease expired"
                    row.next_process_at = now
                    store.move(row, R)
                    info = row.info()
                woken.add(row.queue)
                rescued.append(info)
        store.notify(woken)
        return rescued

    async def delete_expired(self, limit: int) -> int:
        """Delete up to ``limit`` completed tasks past their retention."""
        store = self._store
        with store.lock:
            now = self._clock.now()
            expired = [row for row in store.tasks.values() if row.gone(now)][:limit]
            for row in expired:
                store.delete(row)
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

    # -- workers ---------------------------------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        """Insert or refresh the worker (its heartbeat); makes its queues known."""
        store = self._store
        with store.lock:
            now = self._clock.now()
            store.workers[info.id] = _replace_heartbeat(info, now)
            for queue in info.queues:
                store.queue(queue, now)
            forget = now - max(WORKER_TTL, FORGET_WORKERS_AFTER)
            for worker_id, worker in list(store.workers.items()):
                if worker.last_heartbeat < forget:
                    del store.workers[worker_id]

    async def unregister_worker(self, worker_id: str) -> None:
        """Forget the worker at shutdown."""
        with self._store.lock:
            self._store.workers.pop(worker_id, None)

    async def list_workers(self) -> list[WorkerInfo]:
        """Workers whose last heartbeat is younger than 60 s."""
        with self._store.lock:
            since = self._clock.now() - WORKER_TTL
            live = [w for w in self._store.workers.values() if w.last_heartbeat > since]
        return sorted(live, key=lambda w: (w.started_at, w.id))

    # -- the inspector: queues -------------------------------------------------------------------

    def _stats(self, name: str, now: float) -> QueueStats:
        store = self._store
        queue = store.queues[name]
        sizes = dict.fromkeys(TaskState, 0)
        for row in store.rows(name):
            if not row.gone(now):
                sizes[row.state] += 1
        ready = [row.next_process_at for row in queue.waiting.values() if row.due(now)]
        today = store.stats.get((name, utc_day(now)), [0, 0])
        totals = [0, 0]
        for (q, _), counters in store.stats.items():
            if q == name:
                totals[0] += counters[0]
                totals[1] += counters[1]
        return QueueStats(
            name=name,
            paused=queue.paused,
            sizes=sizes,
            oldest_pending_age=max(0.0, now - min(ready)) if ready else 0.0,
            processed_today=today[0],
            failed_today=today[1],
            processed_total=totals[0],
            failed_total=totals[1],
        )

    async def list_queues(self) -> list[QueueStats]:
        """Every known queue with its sizes and counters, by name."""
        with self._store.lock:
            now = self._clock.now()
            return [self._stats(name, now) for name in sorted(self._store.queues)]

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue; QueueNotFoundError if unknown."""
        with self._store.lock:
            self._require_queue(queue)
            return self._stats(queue, self._clock.now())

    def _require_queue(self, queue: str) -> None:
        if queue not in self._store.queues:
            raise QueueNotFoundError(f"no queue named {queue!r}")

    async def pause_queue(self, queue: str) -> None:
        """Stop handing out tasks of ``queue``; enqueue still works (W8)."""
        with self._store.lock:
            self._require_queue(queue)
            self._store.queues[queue].paused = True

    async def unpause_queue(self, queue: str) -> None:
        """Resume handing out tasks of ``queue``."""
        with self._store.lock:
            self._require_queue(queue)
            self._store.queues[queue].paused = False
        self._store.notify([queue])

    # -- the inspector: tasks --------------------------------------------------------------------

    async def list_tasks(
        self, queue: str, state: TaskState, *, limit: int = 50, offset: int = 0
    ) -> list[TaskInfo]:
        """Tasks of one queue in one state, by ``next_process_at`` then enqueue order."""
        state = TaskState(state)
        with self._store.lock:
            now = self._clock.now()
            self._require_queue(queue)
            rows = [r for r in self._store.rows(queue) if r.state is state and not r.gone(now)]
            rows.sort(key=lambda r: (r.next_process_at, r.seq))
            return [row.info() for row in rows[offset : offset + limit]]

    async def get_task(self, queue: str, task_id: str) -> TaskInfo:
        """One task; TaskNotFoundError if absent (or completed past its retention)."""
        with self._store.lock:
            return self._existing(queue, task_id, self._clock.now()).info()

    def _existing(self, queue: str, task_id: str, now: float) -> Row:
        row = self._store.get(queue, task_id, now)
        if row is None:
            raise TaskNotFoundError(f"no task {task_id!r} in queue {queue!r}")
        return row

    @staticmethod
    def _refuse(row: Row, action: str) -> InvalidStateError:
        return InvalidStateError(f"cannot {action} task {row.id!r}: it is {row.state.value}")

    def _run(self, row: Row, now: float) -> None:
        self._store.move(row, P)
        row.next_process_at = now
        row.lost = 0
        row.cancel_requested = False

    async def run_task(self, queue: str, task_id: str) -> TaskInfo:
        """scheduled/retry/archived -> pending now; InvalidStateError from other states."""
        with self._store.lock:
            now = self._clock.now()
            row = self._existing(queue, task_id, now)
            if row.state not in _RUNNABLE:
                raise self._refuse(row, "run")
            self._run(row, now)
            info = row.info()
        self._store.notify([queue])
        return info

    def _archive_waiting(
        self, row: Row, error: str | None, now: float
    ) -> tuple[TaskInfo, set[str]]:
        self._store.move(row, X)
        if error is not None:
            row.last_error = error
        info = row.info()
        return info, self._store.insert_follow_ups(continuations.for_archived(info), now)

    async def archive_task(self, queue: str, task_id: str) -> TaskInfo:
        """pending/scheduled/retry -> archived; InvalidStateError from other states."""
        with self._store.lock:
            now = self._clock.now()
            row = self._existing(queue, task_id, now)
            if row.state not in WAITING:
                raise self._refuse(row, "archive")
            info, woken = self._archive_waiting(row, None, now)
        self._store.notify(woken)
        return info

    async def delete_task(self, queue: str, task_id: str) -> None:
        """Delete a task in any state but active (InvalidStateError: cancel it first)."""
        with self._store.lock:
            row = self._existing(queue, task_id, self._clock.now())
            if row.state is A:
                raise InvalidStateError(
                    f"cannot delete task {task_id!r}: it is active (cancel it first)"
                )
            self._store.delete(row)

    async def cancel_task(self, queue: str, task_id: str) -> TaskInfo:
        """Active: flag it for its worker (W12). Waiting: archived "cancelled" at once."""
        woken: set[str] = set()
        with self._store.lock:
            now = self._clock.now()
            row = self._existing(queue, task_id, now)
            if row.state is A:
                row.cancel_requested = True
                return row.info()
            if row.state not in WAITING:
                raise self._refuse(row, "cancel")
            info, woken = self._archive_waiting(row, "cancelled", now)
        self._store.notify(woken)
        return info

    async def run_all(self, queue: str, state: TaskState) -> int:
        """Run every task of ``state`` (scheduled, retry, archived) now; returns how many."""
        state = TaskState(state)
        if state not in _RUNNABLE:
            raise InvalidStateError(f"cannot run {state.value} tasks")
        with self._store.lock:
            now = self._clock.now()
            self._require_queue(queue)
            rows = [row for row in self._store.rows(queue) if row.state is state]
            for row in rows:
                self._run(row, now)
        if rows:
            self._store.notify([queue])
        return len(rows)

    async def delete_all(self, queue: str, state: TaskState) -> int:
        """Delete every task of ``state`` (not active); returns how many."""
        state = TaskState(state)
        if state is A:
            raise InvalidStateError("cannot delete active tasks: cancel them first")
        with self._store.lock:
            self._require_queue(queue)
            rows = [row for row in self._store.rows(queue) if row.state is state]
            for row in rows:
                self._store.delete(row)
        return len(rows)


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
