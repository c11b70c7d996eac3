"""The inspector's seam on the in-memory store."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from durq.brokers import limiter
from durq.brokers.memory.storage import ACTIVE, ARCHIVED, CLAIMABLE, PENDING, Row, Store
from durq.brokers.params import LimitOverride, TaskMove, TaskRewrite
from durq.brokers.views import (
    WORKER_VISIBLE_FOR,
    FairDepth,
    GroupInfo,
    LimitStats,
    MinuteCounts,
    QueueStats,
    ScheduleRecord,
    TaskOutcome,
    TaskSearch,
    TaskSearchResult,
    UniqueHold,
    UniqueHolds,
    WorkerInfo,
    WorkflowPage,
    WorkflowQuery,
    WorkflowRecord,
    fair_depth,
    first_counted_minute,
    in_page,
    next_cursor,
)
from durq.clock import Clock, utc_day
from durq.errors import (
    GroupNotFoundError,
    QueueNotFoundError,
    TaskNotFoundError,
    WorkflowNotFoundError,
)
from durq.states import TaskState
from durq.task import TaskInfo


class MemoryAdmin:
    """The Admin seam on a :class:`Store`: every method is one step under its lock."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def list_workers(self) -> list[WorkerInfo]:
        """Workers whose last heartbeat is younger than ``WORKER_VISIBLE_FOR``."""
        with self._store.lock:
            since = self._clock.now() - WORKER_VISIBLE_FOR
            live = [w for w in self._store.workers.values() if w.last_heartbeat > since]
        return sorted(live, key=lambda w: (w.started_at, w.id))

    async def list_limits(self, queue: str | None = None) -> list[LimitStats]:
        """Flow-control keys by queue and key."""
        with self._store.lock:
            now = self._clock.now()
            names = sorted(self._store.queues) if queue is None else [queue]
            return [
                stats
                for name in names
                if name in self._store.queues
                for stats in self._store.queues[name].limit_stats(now)
            ]

    async def set_limit(self, change: LimitOverride) -> None:
        """W23: override one key's limit (under the store's lock, as claims count)."""
        with self._store.lock:
            self._require_queue(change.queue)
            counters = self._store.queues[change.queue].counters
            counter = counters.get(change.key)
            if counter is None:
                counter = counters[change.key] = limiter.unclaimed(self._clock.now())
            counter.override_concurrency = change.concurrency
            counter.override_rate, counter.override_per = change.rate, change.per
        self._store.notify([change.queue])

    async def reset_limit(self, queue: str, key: str) -> bool:
        """W23: remove one key's override; whether there was one."""
        with self._store.lock:
            known = self._store.queues.get(queue)
            counter = None if known is None else known.counters.get(key)
            if counter is None or (
                counter.override_concurrency is None and counter.override_rate is None
            ):
                return False
            counter.override_concurrency = counter.override_rate = counter.override_per = None
        self._store.notify([queue])
        return True

    async def fair_partitions(self, queue: str, top: int = 20) -> FairDepth:
        """The queue's fair limits (W22): templates and the ``top`` partitions."""
        counts: dict[tuple[str, str], list[int]] = {}
        with self._store.lock:
            self._require_queue(queue)
            for row in self._store.rows(queue):
                fair = row.limits[0].fair if row.limits else None
                if fair is not None and row.state in (PENDING, ACTIVE):
                    counts.setdefault((fair, row.limits[0].key), [0, 0])[row.state is ACTIVE] += 1
        return fair_depth(queue, counts, top)

    async def list_unique(self, queue: str, limit: int = 50) -> UniqueHolds:
        """Unique keys held now, soonest due first, with their tasks (E4)."""
        with self._store.lock:
            now = self._clock.now()
            self._require_queue(queue)
            rows = [
                row
                for row in self._store.unique.values()
                if row.queue == queue and (row.unique_until is None or row.unique_until > now)
            ]
            rows.sort(key=lambda r: (r.next_process_at, r.id))
            holds = tuple(UniqueHold(str(r.unique_key), r.info()) for r in rows[:limit])
        return UniqueHolds(holds, len(rows))

    def _stats(self, name: str, now: float) -> QueueStats:
        store = self._store
        queue = store.queues[name]
        sizes = dict.fromkeys(TaskState, 0)
        for row in store.rows(name):
            if not row.gone(now):
                sizes[row.state] += 1
        ready = [row.next_process_at for row in queue.waiting.values() if row.due(now)]
        today = store.stats.get((name, utc_day(now).isoformat()), [0, 0])
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
            unique_keys=sum(
                1
                for row in store.unique.values()
                if row.queue == name and (row.unique_until is None or row.unique_until > now)
            ),
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

    async def search_tasks(self, search: TaskSearch) -> TaskSearchResult:
        """Tasks of one queue and state passing the filter (tested in Python)."""
        state = TaskState(search.state)
        with self._store.lock:
            now = self._clock.now()
            self._require_queue(search.queue)
            rows = [
                r for r in self._store.rows(search.queue) if r.state is state and not r.gone(now)
            ]
            rows.sort(key=lambda r: (r.next_process_at, r.seq))
            hits = [info for info in (r.info() for r in rows) if search.filter.matches(info)]
        return TaskSearchResult(hits[search.offset : search.offset + search.limit], len(hits))

    async def minute_counts(self, queue: str | None, since: float) -> list[MinuteCounts]:
        """Per-minute counters from the minute of ``since`` on."""
        start = first_counted_minute(since, self._clock.now())
        sums: dict[int, list[int]] = {}
        with self._store.lock:
            for (q, minute), (processed, failed) in self._store.minutes.items():
                if minute >= start and (queue is None or q == queue):
                    counters = sums.setdefault(minute, [0, 0])
                    counters[0] += processed
                    counters[1] += failed
        return [MinuteCounts(m, p, f) for m, (p, f) in sorted(sums.items())]

    async def get_task(self, queue: str, task_id: str) -> TaskInfo:
        """One task; TaskNotFoundError if absent (or completed past its retention)."""
        with self._store.lock:
            return self._existing(queue, task_id, self._clock.now()).info()

    async def get_tasks(self, queue: str, task_ids: Sequence[str]) -> list[TaskInfo | None]:
        """Several tasks of one queue; ``None`` for one absent."""
        with self._store.lock:
            now = self._clock.now()
            rows = [self._store.get(queue, task_id, now) for task_id in task_ids]
            return [None if row is None else row.info() for row in rows]

    async def get_outcomes(self, queue: str, task_ids: Sequence[str]) -> list[TaskOutcome | None]:
        """:meth:`get_tasks` narrowed to what a node reads of its dependencies."""
        with self._store.lock:
            now = self._clock.now()
            rows = [self._store.get(queue, task_id, now) for task_id in task_ids]
            return [
                None
                if row is None
                else TaskOutcome(row.id, row.state, row.result, row.last_error, dict(row.headers))
                for row in rows
            ]

    def _existing(self, queue: str, task_id: str, now: float) -> Row:
        row = self._store.get(queue, task_id, now)
        if row is None:
            raise TaskNotFoundError(f"no task {task_id!r} in queue {queue!r}")
        return row

    def _run(self, row: Row, now: float) -> None:
        self._store.move(row, PENDING)
        row.next_process_at = now
        row.lost = 0
        row.cancel_requested = False

    async def move_task(self, move: TaskMove) -> TaskInfo | None:
        """Run, archive or delete one task if it is still in ``move.expect``, with the
        follow-ups."""
        store = self._store
        woken: set[str] = set()
        with store.lock:
            now = self._clock.now()
            row = store.get(move.queue, move.id, now)
            if row is None or row.state is not move.expect or row.state is ACTIVE:
                return None
            kind = move.kind
            if kind != "run" and store.queues[row.queue].give_back_kept(row):
                woken.add(row.queue)  # W25: the key it kept is free for a held task
            if kind == "delete":
                info = row.info()
                woken |= store.forget(row, now)
                store.delete(row)
            elif kind == "run":
                self._run(row, now)
                woken.add(row.queue)
                info = row.info()
            else:
                if row.state not in CLAIMABLE and row.state is not TaskState.WAITING:
                    return None
                store.move(row, ARCHIVED)
                woken |= store.release_dependents(row, now)
                row.expires_at = now  # the moment it was archived (archived retention)
                if move.error is not None:
                    row.last_error = move.error
                woken |= store.insert_follow_ups(move.follow_ups, now)
                if move.group is not None:
                    woken |= store.finish_member(
                        row.queue, row.id, move.group.state, move.group.entry, now
                    )
                info = row.info()
        store.notify(woken)
        if kind != "run":
            store.ended([(move.queue, move.id)])
        return info

    async def get_group(self, queue: str, group_id: str) -> GroupInfo:
        """One group; GroupNotFoundError if absent or expired."""
        with self._store.lock:
            now = self._clock.now()
            group = self._store.groups.get((queue, group_id))
            done = None if group is None else group.finished_at
            if group is None or (done is not None and done + group.params.retention <= now):
                raise GroupNotFoundError(f"no group {group_id!r} in queue {queue!r}")
            return group.info(self._store.tasks, now)

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord:
        """A workflow's record; WorkflowNotFoundError if absent."""
        with self._store.lock:
            record = self._store.workflow(workflow_id, self._clock.now())
        if record is None:
            raise WorkflowNotFoundError(f"no workflow {workflow_id!r}")
        return record

    async def list_workflows(self, query: WorkflowQuery) -> WorkflowPage:
        """Workflow records newest first."""
        with self._store.lock:
            now = self._clock.now()
            keys = sorted(
                (
                    (created_at, wf_id)
                    for wf_id, (_, created_at) in self._store.workflows.items()
                    if in_page(created_at, wf_id, query)
                ),
                reverse=True,
            )[: query.limit]
            records = [self._store.workflow(wf_id, now) for _, wf_id in keys]
        page = tuple(r for r in records if r is not None)
        return WorkflowPage(page, next_cursor(page, query.limit))

    async def request_cancel(self, queue: str, task_id: str) -> TaskInfo | None:
        """Flag an active task for its worker (W12)."""
        with self._store.lock:
            row = self._store.get(queue, task_id, self._clock.now())
            if row is None or row.state is not ACTIVE:
                return None
            row.cancel_requested = True
            return row.info()

    async def rewrite_task(self, rewrite: TaskRewrite) -> bool:
        """New payload and result bytes, fenced (see :class:`TaskRewrite`)."""
        with self._store.lock:
            row = self._store.get(rewrite.queue, rewrite.id, self._clock.now())
            if (
                row is None
                or row.state is ACTIVE
                or row.state is not TaskState(rewrite.expect)
                or row.payload != rewrite.payload
                or row.result != rewrite.result
            ):
                return False
            row.payload, row.result = rewrite.new_payload, rewrite.new_result
            return True

    async def move_all(self, queue: str, state: TaskState, to: TaskState | None) -> int:
        """Run (``to`` pending) or delete (``to`` None) every task of ``state``."""
        state = TaskState(state)
        with self._store.lock:
            now = self._clock.now()
            self._require_queue(queue)
            rows = [row for row in self._store.rows(queue) if row.state is state]
            woken: set[str] = set()
            for row in rows:
                if to is PENDING:
                    self._run(row, now)
                else:
                    if self._store.queues[queue].give_back_kept(row):
                        woken.add(queue)  # W25
                    woken |= self._store.forget(row, now)
                    self._store.delete(row)
        if rows and to is PENDING:
            woken.add(queue)
        self._store.notify(woken)
        return len(rows)

    async def list_schedules(self) -> list[ScheduleRecord]:
        """Every stored schedule, by name."""
        with self._store.lock:
            return sorted(self._store.schedules.values(), key=lambda r: r.name)

    async def get_schedule(self, name: str) -> ScheduleRecord | None:
        """One stored schedule, or ``None``."""
        with self._store.lock:
            return self._store.schedules.get(name)

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord | None:
        """Create (version 0) or update, fenced by ``record.version``."""
        with self._store.lock:
            current = self._store.schedules.get(record.name)
            if (current.version if current else 0) != record.version:
                return None
            stored = replace(record, version=record.version + 1, updated_at=self._clock.now())
            self._store.schedules[record.name] = stored
            return stored

    async def delete_schedule(self, name: str) -> bool:
        """Delete one stored schedule; whether there was one."""
        with self._store.lock:
            return self._store.schedules.pop(name, None) is not None
