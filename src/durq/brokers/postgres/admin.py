"""The inspector's seam on PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from durq.brokers import dependencies, limiter
from durq.brokers.limiter import stored
from durq.brokers.params import EnqueueOutcome, LimitOverride, TaskMove, TaskRewrite
from durq.brokers.postgres.rows import Row
from durq.brokers.postgres.storage import AsyncConn, PostgresStorage
from durq.brokers.search import ascii_lower, sql_pair
from durq.brokers.sqlfiles import (
    group_info,
    one_workflow,
    rewrite_params,
    schedule_record,
    schedule_row,
    workflow_page,
    workflow_query_params,
    workflow_records,
)
from durq.brokers.sqlrows import fair_depth_of, row_to_info, row_to_outcome, unique_holds_of
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
    UniqueHolds,
    WorkerInfo,
    WorkflowPage,
    WorkflowQuery,
    WorkflowRecord,
    first_counted_minute,
)
from durq.clock import utc_day
from durq.errors import (
    GroupNotFoundError,
    QueueNotFoundError,
    TaskNotFoundError,
)
from durq.states import TaskState
from durq.task import TaskInfo

_T = TypeVar("_T")  # what a read by ids converts each row to


class PostgresAdmin:
    """The Admin seam on a :class:`PostgresStorage`: list, inspect and move tasks, queues and
    workers."""

    def __init__(self, storage: PostgresStorage) -> None:
        self._storage = storage

    def _to_stats(self, row: Row, now: float) -> QueueStats:
        sizes: dict[str, Any] = row["sizes"] or {}
        ready = row["ready"]
        return QueueStats(
            name=row["name"],
            paused=row["paused"],
            sizes={state: int(sizes.get(state.value, 0)) for state in TaskState},
            oldest_pending_age=0.0 if ready is None else max(0.0, now - ready),
            processed_today=int(row["processed_today"]),
            failed_today=int(row["failed_today"]),
            processed_total=int(row["processed_total"]),
            failed_total=int(row["failed_total"]),
            unique_keys=int(row["unique_keys"]),
        )

    async def _stats_rows(self, method: str, queue: str | None) -> list[QueueStats]:
        now = self._storage.now()
        rows = await self._storage.fetch(
            method, "queue_stats", {"queue": queue, "now": now, "day": utc_day(now)}
        )
        return [self._to_stats(r, now) for r in rows]

    async def list_queues(self) -> list[QueueStats]:
        """Every known queue (enqueued into, served by a worker, or paused)."""
        return await self._stats_rows("list_queues", None)

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue; QueueNotFoundError if unknown."""
        found = await self._stats_rows("queue_stats", queue)
        if not found:
            raise QueueNotFoundError(f"no queue named {queue!r}")
        return found[0]

    async def _require_queue(self, method: str, queue: str) -> None:
        if await self._storage.fetch_one(method, "queue_exists", {"queue": queue}) is None:
            raise QueueNotFoundError(f"no queue named {queue!r}")

    async def list_tasks(
        self, queue: str, state: TaskState, *, limit: int = 50, offset: int = 0
    ) -> list[TaskInfo]:
        """Tasks of one queue in one state, oldest first; QueueNotFoundError if unknown."""
        rows = await self._storage.fetch(
            "list_tasks",
            "list_tasks",
            {
                "queue": queue,
                "state": TaskState(state).value,
                "now": self._storage.now(),
                "limit": max(0, limit),
                "offset": max(0, offset),
            },
        )
        if not rows:
            await self._require_queue("list_tasks", queue)
        return [row_to_info(r) for r in rows]

    async def search_tasks(self, search: TaskSearch) -> TaskSearchResult:
        """Tasks of one queue and state passing the filter, counted and paged in one query."""
        f = search.filter
        rows = await self._storage.fetch(
            "search_tasks",
            "search_tasks",
            {
                "queue": search.queue,
                "state": TaskState(search.state).value,
                "now": self._storage.now(),
                "type": f.type,
                "error": None if f.error is None else ascii_lower(f.error),
                "payload": json.dumps([sql_pair(path, text) for path, text in f.payload]),
                "limit": max(0, search.limit),
                "offset": max(0, search.offset),
            },
        )
        total = int(rows[0]["total_"]) if rows else 0
        if total == 0:
            await self._require_queue("search_tasks", search.queue)
        return TaskSearchResult([row_to_info(r) for r in rows if r["id"] is not None], total)

    async def minute_counts(self, queue: str | None, since: float) -> list[MinuteCounts]:
        """Per-minute counters from the minute of ``since`` on."""
        rows = await self._storage.fetch(
            "minute_counts",
            "minute_counts",
            {"queue": queue, "since": first_counted_minute(since, self._storage.now())},
        )
        return [MinuteCounts(int(r["minute"]), int(r["processed"]), int(r["failed"])) for r in rows]

    async def get_task(self, queue: str, task_id: str) -> TaskInfo:
        """One task; TaskNotFoundError if absent (or completed past its retention)."""
        row = await self._storage.fetch_one(
            "get_task", "get_task", {"queue": queue, "id": task_id, "now": self._storage.now()}
        )
        if row is None:
            raise TaskNotFoundError(f"no task {task_id!r} in queue {queue!r}")
        return row_to_info(row)

    async def get_tasks(self, queue: str, task_ids: Sequence[str]) -> list[TaskInfo | None]:
        """Several tasks of one queue in one query; ``None`` for one absent."""
        return await self._by_ids("get_tasks", row_to_info, queue, task_ids)

    async def get_outcomes(self, queue: str, task_ids: Sequence[str]) -> list[TaskOutcome | None]:
        """:meth:`get_tasks` narrowed to what a node reads of its dependencies."""
        return await self._by_ids("get_outcomes", row_to_outcome, queue, task_ids)

    async def _by_ids(
        self, name: str, convert: Callable[[Row], _T], queue: str, task_ids: Sequence[str]
    ) -> list[_T | None]:
        """Statement ``name`` over these ids of one queue, each row converted, in the ids'
        order; ``None`` for one absent."""
        if not task_ids:
            return []
        values = {"queue": queue, "ids": list(task_ids), "now": self._storage.now()}
        rows = await self._storage.fetch(name, name, values)
        found = {row["id"]: convert(row) for row in rows}
        return [found.get(task_id) for task_id in task_ids]

    async def move_task(self, move: TaskMove) -> TaskInfo | None:
        """Run, archive or delete one task if it is still in ``move.expect``, with the
        follow-ups, in one transaction."""
        params: dict[str, Any] = {
            "queue": move.queue,
            "id": move.id,
            "expect": move.expect.value,
            "now": self._storage.now(),
            "channel": self._storage.channel,
            "error": move.error,
        }
        query = f"{move.kind}_task"
        follow_ups = move.follow_ups

        released: set[str] = set()

        async def groups(conn: AsyncConn, rows: list[Row]) -> list[EnqueueOutcome]:
            if not rows:
                return []
            if move.to in (None, TaskState.ARCHIVED) and dependencies.unfinished(move.expect):
                # Archived, cancelled, or deleted before it finished: its dependents count it.
                released.update(
                    await self._storage.release_dependents(conn, [rows[0]["dependents"]])
                )
            if move.to is None:  # deleted: an unfinished group member finishes as deleted
                return await self._storage.forget(conn, move.queue, move.id, "")
            if move.group is not None:
                return await self._storage.finish_members(conn, [(move.queue, move.id, move.group)])
            return []

        rows = await self._storage.write_with_follow_ups(
            query, query, params, lambda rows: follow_ups if rows else (), groups
        )
        if not rows:
            return None
        if rows[0].get("wake"):
            released.add(move.queue)  # W25: a key it kept is free for a held task
        if released:
            self._storage.notifier.add(released)
        if move.to is not TaskState.PENDING:
            self._storage.ended([(move.queue, move.id)])
        return row_to_info(rows[0])

    async def get_group(self, queue: str, group_id: str) -> GroupInfo:
        """One group with its members; GroupNotFoundError if absent or expired."""
        key = {"queue": queue, "id": group_id, "now": self._storage.now()}
        async with self._storage.connection("get_group") as conn, conn.transaction():
            cur = await conn.execute(self._storage.statements["get_group"], key)
            g = await cur.fetchone()
            if g is None:
                raise GroupNotFoundError(f"no group {group_id!r} in queue {queue!r}")
            cur = await conn.execute(self._storage.statements["group_members"], key)
            members = await cur.fetchall()
        return group_info(g, members)

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord:
        """A workflow's record and its nodes' tasks in one snapshot; WorkflowNotFoundError
        if absent."""
        records = await self._workflows("get_workflow", {"id": workflow_id})
        return one_workflow(records, workflow_id)

    async def list_workflows(self, query: WorkflowQuery) -> WorkflowPage:
        """Workflow records newest first, in one snapshot."""
        return workflow_page(
            await self._workflows("list_workflows", workflow_query_params(query)), query
        )

    async def _workflows(self, query: str, params: dict[str, Any]) -> list[WorkflowRecord]:
        statements = self._storage.statements
        async with self._storage.connection(query) as conn, conn.transaction():
            # One snapshot for the records and their nodes' tasks.
            await conn.execute(b"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            heads = await (await conn.execute(statements[query], params)).fetchall()
            ids = [h["id"] for h in heads]
            cur = await conn.execute(
                statements["workflow_nodes"], {"ids": ids, "now": self._storage.sql_now()}
            )
            nodes = await cur.fetchall()
        return workflow_records(heads, nodes)

    async def request_cancel(self, queue: str, task_id: str) -> TaskInfo | None:
        """Flag an active task for its worker (W12)."""
        row = await self._storage.fetch_one(
            "request_cancel", "request_cancel", {"queue": queue, "id": task_id}
        )
        return None if row is None else row_to_info(row)

    async def rewrite_task(self, rewrite: TaskRewrite) -> bool:
        """New payload and result bytes, fenced (see :class:`TaskRewrite`)."""
        params = {**rewrite_params(rewrite), "now": self._storage.now()}
        return await self._storage.rowcount("rewrite_task", "rewrite_task", params) == 1

    async def move_all(self, queue: str, state: TaskState, to: TaskState | None) -> int:
        """Run (``to`` pending) or delete (``to`` None) every task of ``state``."""
        state = TaskState(state)
        params = {
            "queue": queue,
            "state": state.value,
            "now": self._storage.now(),
            "channel": self._storage.channel,
        }
        if to is TaskState.PENDING:
            row = await self._storage.fetch_one("run_all", "run_all", params)
            count = int(row["n"]) if row else 0
        else:
            async with self._storage.connection("delete_all") as conn, conn.transaction():
                # Unfinished group members among them finish as deleted, first.
                created = await self._storage.forget(conn, queue, None, state.value)
                released: set[str] = set()
                if dependencies.unfinished(state):
                    cur = await conn.execute(
                        self._storage.statements["dependents_in_state"], params
                    )
                    lists = [r["dependents"] for r in await cur.fetchall()]
                    released = await self._storage.release_dependents(conn, lists)
                cur = await conn.execute(self._storage.statements["delete_all"], params)
                row = await cur.fetchone()
                count = int(row["n"]) if row else 0
                if row and row["wake"]:
                    released.add(queue)  # W25: keys the deleted tasks kept are free
            self._storage.notify_created(created)
            if released:
                self._storage.notifier.add(released)
        if count == 0:
            await self._require_queue("move_all", queue)
        return count

    async def _set_paused(self, method: str, queue: str, paused: bool) -> None:
        row = await self._storage.fetch_one(
            method,
            "set_paused",
            {"queue": queue, "paused": paused, "channel": self._storage.channel},
        )
        if row is None:
            raise QueueNotFoundError(f"no queue named {queue!r}")

    async def pause_queue(self, queue: str) -> None:
        """Stop handing out tasks of ``queue``; enqueue still works (W8)."""
        await self._set_paused("pause_queue", queue, True)

    async def unpause_queue(self, queue: str) -> None:
        """Resume handing out tasks of ``queue``."""
        await self._set_paused("unpause_queue", queue, False)

    async def list_limits(self, queue: str | None = None) -> list[LimitStats]:
        """Flow-control keys by queue and key (W13)."""
        rows = await self._storage.fetch("list_limits", "list_limits", {"queue": queue})
        now = self._storage.now()
        return [stored(r).stats(r["queue"], r["key"], r["held_count"], now) for r in rows]

    async def set_limit(self, change: LimitOverride) -> None:
        """W23: override one key's limit; its queue's idle workers are woken."""
        row = await self._storage.fetch_one(
            "set_limit",
            "set_limit_override",
            {
                "queue": change.queue,
                "key": change.key,
                "refilled_at": limiter.unclaimed(self._storage.now()).refilled_at,
                "concurrency": change.concurrency,
                "rate": change.rate,
                "per": change.per,
                "channel": self._storage.channel,
            },
        )
        if row is None:
            raise QueueNotFoundError(f"no queue named {change.queue!r}")

    async def reset_limit(self, queue: str, key: str) -> bool:
        """W23: remove one key's override; whether there was one."""
        row = await self._storage.fetch_one(
            "reset_limit",
            "reset_limit_override",
            {"queue": queue, "key": key, "channel": self._storage.channel},
        )
        return row is not None

    async def fair_partitions(self, queue: str, top: int = 20) -> FairDepth:
        """The queue's fair limits (W22): templates and the ``top`` partitions."""
        await self._require_queue("fair_partitions", queue)
        rows = await self._storage.fetch(
            "fair_partitions", "fair_partitions", {"queue": queue, "top": top}
        )
        return fair_depth_of(queue, rows)

    async def list_unique(self, queue: str, limit: int = 50) -> UniqueHolds:
        """Unique keys held now, soonest due first, with their tasks (E4)."""
        await self._require_queue("list_unique", queue)
        rows = await self._storage.fetch(
            "list_unique",
            "list_unique",
            {"queue": queue, "limit": limit, "now": self._storage.sql_now()},
        )
        return unique_holds_of(rows)

    async def list_workers(self) -> list[WorkerInfo]:
        """Worker processes that sent a heartbeat recently."""
        rows = await self._storage.fetch(
            "list_workers", "list_workers", {"since": self._storage.now() - WORKER_VISIBLE_FOR}
        )
        return [
            WorkerInfo(
                id=r["id"],
                host=r["host"],
                pid=r["pid"],
                queues={str(k): int(v) for k, v in dict(r["queues"]).items()},
                concurrency=r["concurrency"],
                started_at=r["started_at"],
                last_heartbeat=r["last_heartbeat"],
                active=r["active"],
                strict=r["strict"],
            )
            for r in rows
        ]

    # ------------------------------------------------------------------ schedules

    async def list_schedules(self) -> list[ScheduleRecord]:
        """Every stored schedule, by name."""
        rows = await self._storage.fetch("list_schedules", "list_schedules", {})
        return [schedule_record(r) for r in rows]

    async def get_schedule(self, name: str) -> ScheduleRecord | None:
        """One stored schedule, or ``None``."""
        row = await self._storage.fetch_one("get_schedule", "get_schedule", {"name": name})
        return None if row is None else schedule_record(row)

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord | None:
        """Create (version 0) or update, fenced by ``record.version``."""
        query = "update_schedule" if record.version else "create_schedule"
        row = await self._storage.fetch_one(
            "put_schedule", query, schedule_row(record, self._storage.sql_now())
        )
        return None if row is None else schedule_record(row)

    async def delete_schedule(self, name: str) -> bool:
        """Delete one stored schedule; whether there was one."""
        return (
            await self._storage.rowcount("delete_schedule", "delete_schedule", {"name": name}) > 0
        )
