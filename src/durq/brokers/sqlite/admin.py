"""The inspector's seam (I1-I5) for SQLite: queues, tasks, workers."""

from __future__ import annotations

import json
import sqlite3

from durq.brokers.base import QueueStats, WorkerInfo
from durq.brokers.sqlite.connection import Conn, SQLiteBase, row_to_info, utc_day
from durq.brokers.sqlite.queries import Q
from durq.errors import InvalidStateError, QueueNotFoundError, TaskNotFoundError
from durq.states import TaskState
from durq.task import TaskInfo

#: list_workers shows workers whose heartbeat is younger than this.
WORKER_TTL = 60.0

_RUNNABLE = frozenset({TaskState.SCHEDULED, TaskState.RETRY, TaskState.ARCHIVED})


class SQLiteAdmin(SQLiteBase):
    """Admin protocol: every method is one read snapshot or one immediate transaction."""

    # ------------------------------------------------------------------ queues

    def _require_queue(self, conn: Conn, queue: str) -> sqlite3.Row:
        row: sqlite3.Row | None = conn.execute(Q["get_queue"], {"queue": queue}).fetchone()
        if row is None:
            raise QueueNotFoundError(f"no queue named {queue!r}")
        return row

    def _stats(self, conn: Conn, name: str, paused: bool, now: float) -> QueueStats:
        sizes = dict.fromkeys(TaskState, 0)
        for row in conn.execute(Q["queue_sizes"], {"queue": name, "now": now}):
            sizes[TaskState(row["state"])] = row["n"]
        oldest = conn.execute(Q["oldest_ready"], {"queue": name, "now": now}).fetchone()[0]
        counters = conn.execute(
            Q["queue_counters"], {"queue": name, "day": utc_day(now)}
        ).fetchone()
        return QueueStats(
            name=name,
            paused=paused,
            sizes=sizes,
            oldest_pending_age=0.0 if oldest is None else max(0.0, now - oldest),
            processed_today=counters[0],
            failed_today=counters[1],
            processed_total=counters[2],
            failed_total=counters[3],
        )

    async def list_queues(self) -> list[QueueStats]:
        """Every known queue with its sizes and counters, by name."""
        now = self._clock.now()

        def run(conn: Conn) -> list[QueueStats]:
            return [
                self._stats(conn, row["name"], bool(row["paused"]), now)
                for row in conn.execute(Q["all_queues"]).fetchall()
            ]

        return await self._read("sqlite.list_queues", run)

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue; QueueNotFoundError if unknown."""
        now = self._clock.now()

        def run(conn: Conn) -> QueueStats:
            row = self._require_queue(conn, queue)
            return self._stats(conn, queue, bool(row["paused"]), now)

        return await self._read("sqlite.queue_stats", run)

    async def pause_queue(self, queue: str) -> None:
        """Stop handing out tasks of ``queue``; enqueue still works (W8)."""
        await self._set_paused(queue, True)

    async def unpause_queue(self, queue: str) -> None:
        """Resume handing out tasks of ``queue``."""
        await self._set_paused(queue, False)
        self._notify([queue])

    async def _set_paused(self, queue: str, paused: bool) -> None:
        def run(conn: Conn) -> None:
            if conn.execute(Q["set_paused"], {"queue": queue, "paused": int(paused)}).rowcount == 0:
                raise QueueNotFoundError(f"no queue named {queue!r}")

        await self._write("sqlite.pause_queue" if paused else "sqlite.unpause_queue", run)

    # ------------------------------------------------------------------ tasks

    async def list_tasks(
        self, queue: str, state: TaskState, *, limit: int = 50, offset: int = 0
    ) -> list[TaskInfo]:
        """Tasks of one queue in one state, by ``next_process_at`` then enqueue order."""
        now = self._clock.now()
        state = TaskState(state)

        def run(conn: Conn) -> list[TaskInfo]:
            self._require_queue(conn, queue)
            rows = conn.execute(
                Q["list_tasks"],
                {
                    "queue": queue,
                    "state": state.value,
                    "now": now,
                    "limit": limit,
                    "offset": offset,
                },
            ).fetchall()
            return [row_to_info(row) for row in rows]

        return await self._read("sqlite.list_tasks", run)

    async def get_task(self, queue: str, task_id: str) -> TaskInfo:
        """One task; TaskNotFoundError if absent (or completed past its retention)."""
        now = self._clock.now()

        def run(conn: Conn) -> TaskInfo:
            return row_to_info(self._existing(conn, queue, task_id, now))

        return await self._call("sqlite.get_task", run)

    def _existing(self, conn: Conn, queue: str, task_id: str, now: float) -> sqlite3.Row:
        row = self._get_row(conn, queue, task_id, now)
        if row is None:
            raise TaskNotFoundError(f"no task {task_id!r} in queue {queue!r}")
        return row

    def _refuse(self, row: sqlite3.Row, action: str) -> InvalidStateError:
        return InvalidStateError(f"cannot {action} task {row['id']!r}: it is {row['state']}")

    async def run_task(self, queue: str, task_id: str) -> TaskInfo:
        """scheduled/retry/archived -> pending now; InvalidStateError from other states."""
        now = self._clock.now()

        def body(conn: Conn) -> TaskInfo:
            row = conn.execute(
                Q["run_task"], {"queue": queue, "id": task_id, "now": now}
            ).fetchone()
            if row is None:
                raise self._refuse(self._existing(conn, queue, task_id, now), "run")
            return row_to_info(row)

        info = await self._write("sqlite.run_task", body)
        self._notify([queue])
        return info

    async def archive_task(self, queue: str, task_id: str) -> TaskInfo:
        """pending/scheduled/retry -> archived; InvalidStateError from other states."""
        return await self._archive_waiting(queue, task_id, None, "sqlite.archive_task", "archive")

    async def _archive_waiting(
        self, queue: str, task_id: str, error: str | None, operation: str, action: str
    ) -> TaskInfo:
        now = self._clock.now()

        def body(conn: Conn) -> TaskInfo:
            row = conn.execute(
                Q["archive_task"], {"queue": queue, "id": task_id, "error": error}
            ).fetchone()
            if row is None:
                raise self._refuse(self._existing(conn, queue, task_id, now), action)
            info = row_to_info(row)
            woken.update(self._archived_follow_ups(conn, info, now))
            return info

        woken: set[str] = set()
        info = await self._write(operation, body)
        if woken:
            self._notify(woken)
        return info

    async def delete_task(self, queue: str, task_id: str) -> None:
        """Delete a task in any state but active (InvalidStateError: cancel it first)."""
        now = self._clock.now()

        def body(conn: Conn) -> None:
            row = self._existing(conn, queue, task_id, now)
            if row["state"] == TaskState.ACTIVE.value:
                raise InvalidStateError(
                    f"cannot delete task {task_id!r}: it is active (cancel it first)"
                )
            conn.execute(Q["delete_task"], {"queue": queue, "id": task_id})

        await self._write("sqlite.delete_task", body)

    async def cancel_task(self, queue: str, task_id: str) -> TaskInfo:
        """Active: flag it for its worker (W12). Waiting: archived "cancelled" at once."""
        now = self._clock.now()

        def body(conn: Conn) -> TaskInfo:
            row = self._existing(conn, queue, task_id, now)
            state = TaskState(row["state"])
            params = {"queue": queue, "id": task_id, "error": "cancelled"}
            if state is TaskState.ACTIVE:
                return row_to_info(conn.execute(Q["request_cancel"], params).fetchone())
            if state in (TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY):
                info = row_to_info(conn.execute(Q["archive_task"], params).fetchone())
                woken.update(self._archived_follow_ups(conn, info, now))
                return info
            raise self._refuse(row, "cancel")

        woken: set[str] = set()
        info = await self._write("sqlite.cancel_task", body)
        if woken:
            self._notify(woken)
        return info

    async def run_all(self, queue: str, state: TaskState) -> int:
        """Run every task of ``state`` (scheduled, retry, archived) now; returns how many."""
        now = self._clock.now()
        state = TaskState(state)
        if state not in _RUNNABLE:
            raise InvalidStateError(f"cannot run {state.value} tasks")

        def body(conn: Conn) -> int:
            self._require_queue(conn, queue)
            cursor = conn.execute(Q["run_all"], {"queue": queue, "state": state.value, "now": now})
            return cursor.rowcount

        count = await self._write("sqlite.run_all", body)
        if count:
            self._notify([queue])
        return count

    async def delete_all(self, queue: str, state: TaskState) -> int:
        """Delete every task of ``state`` (not active); returns how many."""
        state = TaskState(state)
        if state is TaskState.ACTIVE:
            raise InvalidStateError("cannot delete active tasks: cancel them first")

        def body(conn: Conn) -> int:
            self._require_queue(conn, queue)
            return conn.execute(Q["delete_all"], {"queue": queue, "state": state.value}).rowcount

        return await self._write("sqlite.delete_all", body)

    # ------------------------------------------------------------------ workers

    async def list_workers(self) -> list[WorkerInfo]:
        """Workers whose last heartbeat is younger than 60 s."""
        since = self._clock.now() - WORKER_TTL

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
                for row in conn.execute(Q["live_workers"], {"since": since}).fetchall()
            ]

        return await self._call("sqlite.list_workers", run)
