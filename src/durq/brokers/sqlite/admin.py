"""The inspector's seam (I1-I5) for SQLite: queues, tasks, workers."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from durq.brokers import dependencies, limiter
from durq.brokers.params import LimitOverride, TaskMove, TaskRewrite
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
from durq.brokers.sqlite.storage import STATEMENTS, Conn, SQLiteStorage, snapshot
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

#: The SQL function ``search_tasks`` calls: a search's error and payload conditions
#: (``TaskFilter.matches_content``), registered on the connection for each search.
SEARCH_FUNCTION = "durq_search_match"


class SQLiteAdmin:
    """The Admin seam on a :class:`SQLiteStorage`: every method is one read snapshot or one
    immediate transaction."""

    def __init__(self, storage: SQLiteStorage) -> None:
        self._storage = storage

    # ------------------------------------------------------------------ queues

    def _require_queue(self, conn: Conn, queue: str) -> sqlite3.Row:
        row: sqlite3.Row | None = conn.execute(STATEMENTS["get_queue"], {"queue": queue}).fetchone()
        if row is None:
            raise QueueNotFoundError(f"no queue named {queue!r}")
        return row

    def _stats(self, conn: Conn, name: str, paused: bool, now: float) -> QueueStats:
        sizes = dict.fromkeys(TaskState, 0)
        for row in conn.execute(STATEMENTS["queue_sizes"], {"queue": name, "now": now}):
            sizes[TaskState(row["state"])] = row["n"]
        oldest = conn.execute(STATEMENTS["oldest_ready"], {"queue": name, "now": now}).fetchone()[0]
        counters = conn.execute(
            STATEMENTS["queue_counters"], {"queue": name, "day": utc_day(now).isoformat()}
        ).fetchone()
        unique_keys = conn.execute(
            STATEMENTS["queue_unique_keys"], {"queue": name, "now": now}
        ).fetchone()[0]
        return QueueStats(
            name=name,
            paused=paused,
            sizes=sizes,
            oldest_pending_age=0.0 if oldest is None else max(0.0, now - oldest),
            processed_today=counters[0],
            failed_today=counters[1],
            processed_total=counters[2],
            failed_total=counters[3],
            unique_keys=unique_keys,
        )

    async def list_limits(self, queue: str | None = None) -> list[LimitStats]:
        """Flow-control keys by queue and key (W13)."""
        now = self._storage.clock.now()

        def run(conn: Conn) -> list[LimitStats]:
            return [
                limiter.stored(row).stats(row["queue"], row["key"], row["held_count"], now)
                for row in conn.execute(STATEMENTS["list_limits"], {"queue": queue}).fetchall()
            ]

        return await self._storage.read("sqlite.list_limits", run)

    async def set_limit(self, change: LimitOverride) -> None:
        """W23: override one key's limit in a write transaction (claims count in theirs)."""

        def run(conn: Conn, now: float) -> None:
            self._require_queue(conn, change.queue)
            conn.execute(
                STATEMENTS["set_limit_override"],
                {
                    "queue": change.queue,
                    "key": change.key,
                    "refilled_at": limiter.unclaimed(now).refilled_at,
                    "concurrency": change.concurrency,
                    "rate": change.rate,
                    "per": change.per,
                },
            )

        await self._storage.write("sqlite.set_limit", run)
        self._storage.notify([change.queue])

    async def reset_limit(self, queue: str, key: str) -> bool:
        """W23: remove one key's override; whether there was one."""

        def run(conn: Conn, _: float) -> bool:
            cursor = conn.execute(STATEMENTS["reset_limit_override"], {"queue": queue, "key": key})
            return cursor.rowcount > 0

        found = await self._storage.write("sqlite.reset_limit", run)
        if found:
            self._storage.notify([queue])
        return found

    async def fair_partitions(self, queue: str, top: int = 20) -> FairDepth:
        """The queue's fair limits (W22): templates and the ``top`` partitions."""

        def run(conn: Conn) -> FairDepth:
            self._require_queue(conn, queue)
            rows = conn.execute(STATEMENTS["fair_partitions"], {"queue": queue, "top": top})
            return fair_depth_of(queue, rows.fetchall())

        return await self._storage.read("sqlite.fair_partitions", run)

    async def list_unique(self, queue: str, limit: int = 50) -> UniqueHolds:
        """Unique keys held now, soonest due first, with their tasks (E4)."""
        now = self._storage.clock.now()

        def run(conn: Conn) -> UniqueHolds:
            self._require_queue(conn, queue)
            params = {"queue": queue, "now": now, "limit": limit}
            return unique_holds_of(conn.execute(STATEMENTS["list_unique"], params).fetchall())

        return await self._storage.read("sqlite.list_unique", run)

    async def list_queues(self) -> list[QueueStats]:
        """Every known queue with its sizes and counters, by name."""
        now = self._storage.clock.now()

        def run(conn: Conn) -> list[QueueStats]:
            return [
                self._stats(conn, row["name"], bool(row["paused"]), now)
                for row in conn.execute(STATEMENTS["all_queues"]).fetchall()
            ]

        return await self._storage.read("sqlite.list_queues", run)

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue; QueueNotFoundError if unknown."""
        now = self._storage.clock.now()

        def run(conn: Conn) -> QueueStats:
            row = self._require_queue(conn, queue)
            return self._stats(conn, queue, bool(row["paused"]), now)

        return await self._storage.read("sqlite.queue_stats", run)

    async def pause_queue(self, queue: str) -> None:
        """Stop handing out tasks of ``queue``; enqueue still works (W8)."""
        await self._set_paused(queue, True)

    async def unpause_queue(self, queue: str) -> None:
        """Resume handing out tasks of ``queue``."""
        await self._set_paused(queue, False)
        self._storage.notify([queue])

    async def _set_paused(self, queue: str, paused: bool) -> None:
        def run(conn: Conn, _: float) -> None:
            if (
                conn.execute(
                    STATEMENTS["set_paused"], {"queue": queue, "paused": int(paused)}
                ).rowcount
                == 0
            ):
                raise QueueNotFoundError(f"no queue named {queue!r}")

        await self._storage.write("sqlite.pause_queue" if paused else "sqlite.unpause_queue", run)

    # ------------------------------------------------------------------ tasks

    async def list_tasks(
        self, queue: str, state: TaskState, *, limit: int = 50, offset: int = 0
    ) -> list[TaskInfo]:
        """Tasks of one queue in one state, by ``next_process_at`` then enqueue order."""
        now = self._storage.clock.now()
        state = TaskState(state)

        def run(conn: Conn) -> list[TaskInfo]:
            self._require_queue(conn, queue)
            rows = conn.execute(
                STATEMENTS["list_tasks"],
                {
                    "queue": queue,
                    "state": state.value,
                    "now": now,
                    "limit": limit,
                    "offset": offset,
                },
            ).fetchall()
            return [row_to_info(row) for row in rows]

        return await self._storage.read("sqlite.list_tasks", run)

    async def search_tasks(self, search: TaskSearch) -> TaskSearchResult:
        """Tasks of one queue and state passing the filter, counted and paged in one query."""
        now = self._storage.clock.now()
        f = search.filter
        params = {
            "queue": search.queue,
            "state": TaskState(search.state).value,
            "now": now,
            "type": f.type,
            "content": f.error is not None or bool(f.payload),
            "limit": search.limit,
            "offset": search.offset,
        }

        def run(conn: Conn) -> TaskSearchResult:
            self._require_queue(conn, search.queue)
            # The error and payload conditions are tested by the same Python as on Redis:
            # SQLite's lower() and number parsing differ from it (durq.brokers.search).
            conn.create_function(SEARCH_FUNCTION, 2, f.matches_content, deterministic=True)
            rows = conn.execute(STATEMENTS["search_tasks"], params).fetchall()
            tasks = [row_to_info(row) for row in rows if row["id"] is not None]
            return TaskSearchResult(tasks, rows[0]["total_"] if rows else 0)

        return await self._storage.read("sqlite.search_tasks", run)

    async def minute_counts(self, queue: str | None, since: float) -> list[MinuteCounts]:
        """Per-minute counters from the minute of ``since`` on (one read)."""
        params = {"queue": queue, "since": first_counted_minute(since, self._storage.clock.now())}

        def run(conn: Conn) -> list[MinuteCounts]:
            rows = conn.execute(STATEMENTS["minute_counts"], params).fetchall()
            return [MinuteCounts(r["minute"], r["processed"], r["failed"]) for r in rows]

        return await self._storage.read("sqlite.minute_counts", run)

    async def get_task(self, queue: str, task_id: str) -> TaskInfo:
        """One task; TaskNotFoundError if absent (or completed past its retention)."""
        now = self._storage.clock.now()

        def run(conn: Conn) -> TaskInfo:
            return row_to_info(self._existing(conn, queue, task_id, now))

        return await self._storage.call("sqlite.get_task", run)

    async def get_tasks(self, queue: str, task_ids: Sequence[str]) -> list[TaskInfo | None]:
        """Several tasks of one queue in one query; ``None`` for one absent."""
        return await self._by_ids("get_tasks", row_to_info, queue, task_ids)

    async def get_outcomes(self, queue: str, task_ids: Sequence[str]) -> list[TaskOutcome | None]:
        """:meth:`get_tasks` narrowed to what a node reads of its dependencies."""
        return await self._by_ids("get_outcomes", row_to_outcome, queue, task_ids)

    async def _by_ids(
        self,
        name: str,
        convert: Callable[[sqlite3.Row], _T],
        queue: str,
        task_ids: Sequence[str],
    ) -> list[_T | None]:
        """Statement ``name`` over these ids of one queue, each row converted, in the ids'
        order; ``None`` for one absent."""
        if not task_ids:
            return []
        params = {
            "queue": queue,
            "ids": json.dumps(list(task_ids)),
            "now": self._storage.clock.now(),
        }

        def run(conn: Conn) -> list[_T | None]:
            rows = conn.execute(STATEMENTS[name], params).fetchall()
            found = {row["id"]: convert(row) for row in rows}
            return [found.get(task_id) for task_id in task_ids]

        return await self._storage.call(f"sqlite.{name}", run)

    def _existing(self, conn: Conn, queue: str, task_id: str, now: float) -> sqlite3.Row:
        row = self._storage.get_row(conn, queue, task_id, now)
        if row is None:
            raise TaskNotFoundError(f"no task {task_id!r} in queue {queue!r}")
        return row

    async def move_task(self, move: TaskMove) -> TaskInfo | None:
        """Run, archive or delete one task if it is still in ``move.expect``, with the
        follow-ups, in one transaction."""
        params: dict[str, Any] = {
            "queue": move.queue,
            "id": move.id,
            "expect": move.expect.value,
            "error": move.error,
        }
        query = f"{move.kind}_task"

        def body(conn: Conn, now: float, woken: set[str]) -> TaskInfo | None:
            # W25: read before the move (the write lock is held), given back once it holds.
            kept = []
            if move.to is not TaskState.PENDING:
                kept = self._storage.kept_limits(conn, move.queue, move.id, move.expect.value)
            row = conn.execute(STATEMENTS[query], {**params, "now": now}).fetchone()
            if row is None:
                return None
            if self._storage.give_back_kept(conn, move.queue, kept):
                woken.add(move.queue)
            if move.to is None:
                woken.update(self._storage.forget(conn, move.queue, move.id, "", now))
            if (move.to is None or move.to is TaskState.ARCHIVED) and row["dependents"]:
                # Archived, cancelled, or deleted before it finished; a finished task
                # released its dependents when it finished.
                if dependencies.unfinished(move.expect):
                    woken.update(self._storage.release_dependents(conn, [row["dependents"]], now))
            if move.follow_ups:
                woken.update(self._storage.insert_follow_ups(conn, move.follow_ups, now))
            if move.group is not None:
                woken.update(
                    self._storage.finish_member(conn, move.queue, move.id, move.group, now)
                )
            if move.to is TaskState.PENDING:
                woken.add(move.queue)
            return row_to_info(row)

        info = await self._storage.write_waking(f"sqlite.{query}", body)
        if info is not None and move.to is not TaskState.PENDING:
            self._storage.ended([(move.queue, move.id)])
        return info

    async def get_group(self, queue: str, group_id: str) -> GroupInfo:
        """One group with its members; GroupNotFoundError if absent or expired."""
        now = self._storage.clock.now()
        key = {"queue": queue, "id": group_id, "now": now}

        def run(conn: Conn) -> GroupInfo:
            g = conn.execute(STATEMENTS["get_group"], key).fetchone()
            if g is None:
                raise GroupNotFoundError(f"no group {group_id!r} in queue {queue!r}")
            members = conn.execute(STATEMENTS["group_members"], key).fetchall()
            return group_info(g, members)

        return await self._storage.call("sqlite.get_group", lambda c: snapshot(c, run))

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
        now = self._storage.clock.now()

        def run(conn: Conn) -> list[WorkflowRecord]:
            heads = conn.execute(STATEMENTS[query], params).fetchall()
            ids = json.dumps([h["id"] for h in heads])
            nodes = conn.execute(STATEMENTS["workflow_nodes"], {"ids": ids, "now": now})
            return workflow_records(heads, nodes.fetchall())

        return await self._storage.call(f"sqlite.{query}", lambda c: snapshot(c, run))

    async def request_cancel(self, queue: str, task_id: str) -> TaskInfo | None:
        """Flag an active task for its worker (W12)."""

        def body(conn: Conn, _: float) -> TaskInfo | None:
            row = conn.execute(
                STATEMENTS["request_cancel"], {"queue": queue, "id": task_id}
            ).fetchone()
            return None if row is None else row_to_info(row)

        return await self._storage.write("sqlite.request_cancel", body)

    async def rewrite_task(self, rewrite: TaskRewrite) -> bool:
        """New payload and result bytes, fenced (see :class:`TaskRewrite`)."""

        def body(conn: Conn, now: float) -> bool:
            params = {**rewrite_params(rewrite), "now": now}
            return bool(conn.execute(STATEMENTS["rewrite_task"], params).rowcount == 1)

        return await self._storage.write("sqlite.rewrite_task", body)

    async def move_all(self, queue: str, state: TaskState, to: TaskState | None) -> int:
        """Run (``to`` pending) or delete (``to`` None) every task of ``state``."""
        state = TaskState(state)
        query = "run_all" if to is TaskState.PENDING else "delete_all"

        def body(conn: Conn, now: float, woken: set[str]) -> int:
            self._require_queue(conn, queue)
            if to is None:
                woken.update(self._storage.forget(conn, queue, None, state.value, now))
                kept = self._storage.kept_limits(conn, queue, None, state.value)
                if self._storage.give_back_kept(conn, queue, kept):
                    woken.add(queue)  # W25: the keys they kept are free for held tasks
            if to is None and dependencies.unfinished(state):
                lists = conn.execute(
                    STATEMENTS["dependents_in_state"], {"queue": queue, "state": state.value}
                )
                woken.update(self._storage.release_dependents(conn, [r[0] for r in lists], now))
            count: int = conn.execute(
                STATEMENTS[query], {"queue": queue, "state": state.value, "now": now}
            ).rowcount
            if count and to is TaskState.PENDING:
                woken.add(queue)
            return count

        return await self._storage.write_waking(f"sqlite.{query}", body)

    # ------------------------------------------------------------------ workers

    async def list_workers(self) -> list[WorkerInfo]:
        """Workers whose last heartbeat is younger than ``WORKER_VISIBLE_FOR``."""
        since = self._storage.clock.now() - WORKER_VISIBLE_FOR

        def run(conn: Conn) -> list[WorkerInfo]:
            return [
                WorkerInfo(
                    id=row["id"],
                    host=row["host"],
                    pid=row["pid"],
                    queues={str(k): int(v) for k, v in json.loads(row["queues"]).items()},
                    concurrency=row["concurrency"],
                    started_at=row["started_at"],
                    last_heartbeat=row["last_heartbeat"],
                    active=row["active"],
                    strict=bool(row["strict"]),
                )
                for row in conn.execute(STATEMENTS["live_workers"], {"since": since}).fetchall()
            ]

        return await self._storage.call("sqlite.list_workers", run)

    # ------------------------------------------------------------------ schedules

    async def list_schedules(self) -> list[ScheduleRecord]:
        """Every stored schedule, by name."""

        def run(conn: Conn) -> list[ScheduleRecord]:
            return [schedule_record(r) for r in conn.execute(STATEMENTS["list_schedules"])]

        return await self._storage.read("sqlite.list_schedules", run)

    async def get_schedule(self, name: str) -> ScheduleRecord | None:
        """One stored schedule, or ``None``."""

        def run(conn: Conn) -> ScheduleRecord | None:
            row = conn.execute(STATEMENTS["get_schedule"], {"name": name}).fetchone()
            return None if row is None else schedule_record(row)

        return await self._storage.read("sqlite.get_schedule", run)

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord | None:
        """Create (version 0) or update, fenced by ``record.version``."""
        query = "update_schedule" if record.version else "create_schedule"

        def run(conn: Conn, now: float) -> ScheduleRecord | None:
            row = conn.execute(STATEMENTS[query], schedule_row(record, now)).fetchone()
            return None if row is None else schedule_record(row)

        return await self._storage.write("sqlite.put_schedule", run)

    async def delete_schedule(self, name: str) -> bool:
        """Delete one stored schedule; whether there was one."""

        def run(conn: Conn, _: float) -> bool:
            return conn.execute(STATEMENTS["delete_schedule"], {"name": name}).rowcount > 0

        return await self._storage.write("sqlite.delete_schedule", run)
