"""The inspector's seam (I1-I5) on PostgreSQL."""

from __future__ import annotations

from typing import Any

from durq import continuations
from durq.brokers.base import EnqueueParams, QueueStats, WorkerInfo
from durq.brokers.postgres.core import PostgresBase, utc_day
from durq.brokers.postgres.rows import Row, row_to_info
from durq.errors import InvalidStateError, QueueNotFoundError, TaskNotFoundError
from durq.states import TaskState
from durq.task import TaskInfo

#: A worker whose last heartbeat is older than this is not listed (I5).
WORKER_VISIBLE_SECONDS = 60.0

_RUNNABLE = frozenset({TaskState.SCHEDULED, TaskState.RETRY, TaskState.ARCHIVED})


class PostgresAdmin(PostgresBase):
    """List, inspect and steer tasks, queues and workers."""

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
        )

    async def _stats_rows(self, method: str, queue: str | None) -> list[QueueStats]:
        now = self._now()
        rows = await self._fetch(
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
        if await self._fetch_one(method, "queue_exists", {"queue": queue}) is None:
            raise QueueNotFoundError(f"no queue named {queue!r}")

    async def list_tasks(
        self, queue: str, state: TaskState, *, limit: int = 50, offset: int = 0
    ) -> list[TaskInfo]:
        """Tasks of one queue in one state, oldest first; QueueNotFoundError if unknown."""
        rows = await self._fetch(
            "list_tasks",
            "list_tasks",
            {
                "queue": queue,
                "state": TaskState(state).value,
                "now": self._now(),
                "limit": max(0, limit),
                "offset": max(0, offset),
            },
        )
        if not rows:
            await self._require_queue("list_tasks", queue)
        return [row_to_info(r) for r in rows]

    async def get_task(self, queue: str, task_id: str) -> TaskInfo:
        """One task; TaskNotFoundError if absent (or completed past its retention)."""
        row = await self._fetch_one(
            "get_task", "get_task", {"queue": queue, "id": task_id, "now": self._now()}
        )
        if row is None:
            raise TaskNotFoundError(f"no task {task_id!r} in queue {queue!r}")
        return row_to_info(row)

    async def _refuse(self, queue: str, task_id: str, action: str) -> InvalidStateError:
        # The conditional update matched nothing: say whether the task is missing or why not.
        info = await self.get_task(queue, task_id)
        return InvalidStateError(f"cannot {action} task {task_id!r}: it is {info.state.value}")

    async def _task_change(self, method: str, query: str, queue: str, task_id: str) -> Row | None:
        return await self._fetch_one(
            method,
            query,
            {"queue": queue, "id": task_id, "now": self._now(), "channel": self._channel},
        )

    async def _task_archive(self, method: str, query: str, queue: str, task_id: str) -> Row | None:
        """Archive a waiting task and create the follow-up it asks for, in one transaction."""
        params = {"queue": queue, "id": task_id, "now": self._now(), "channel": self._channel}
        rows = await self._write_with_follow_ups(method, query, params, _archived_follow_ups)
        return rows[0] if rows else None

    async def run_task(self, queue: str, task_id: str) -> TaskInfo:
        """scheduled/retry/archived -> pending now; InvalidStateError from other states."""
        row = await self._task_change("run_task", "run_task", queue, task_id)
        if row is None:
            raise await self._refuse(queue, task_id, "run")
        return row_to_info(row)

    async def archive_task(self, queue: str, task_id: str) -> TaskInfo:
        """pending/scheduled/retry -> archived; InvalidStateError from other states."""
        row = await self._task_archive("archive_task", "archive_task", queue, task_id)
        if row is None:
            raise await self._refuse(queue, task_id, "archive")
        return row_to_info(row)

    async def delete_task(self, queue: str, task_id: str) -> None:
        """Delete a task in any state but active (InvalidStateError: cancel it first)."""
        row = await self._task_change("delete_task", "delete_task", queue, task_id)
        if row is None:
            raise await self._refuse(queue, task_id, "delete (cancel it first)")

    async def cancel_task(self, queue: str, task_id: str) -> TaskInfo:
        """Active: flag it so its worker cancels the handler and archives it "cancelled".
        pending/scheduled/retry: archived "cancelled" at once. Finished: InvalidStateError."""
        row = await self._task_archive("cancel_task", "cancel_waiting_task", queue, task_id)
        if row is None:
            row = await self._task_change("cancel_task", "cancel_active_task", queue, task_id)
        if row is None:
            raise await self._refuse(queue, task_id, "cancel")
        return row_to_info(row)

    async def run_all(self, queue: str, state: TaskState) -> int:
        """Run every task of ``state`` (scheduled, retry, archived) now; returns how many."""
        state = TaskState(state)
        if state not in _RUNNABLE:
            raise InvalidStateError(f"cannot run {state.value} tasks")
        row = await self._fetch_one(
            "run_all",
            "run_all",
            {"queue": queue, "state": state.value, "now": self._now(), "channel": self._channel},
        )
        count = int(row["n"]) if row else 0
        if count == 0:
            await self._require_queue("run_all", queue)
        return count

    async def delete_all(self, queue: str, state: TaskState) -> int:
        """Delete every task of ``state`` (not active); returns how many."""
        state = TaskState(state)
        if state is TaskState.ACTIVE:
            raise InvalidStateError("cannot delete active tasks: cancel them first")
        count = await self._rowcount(
            "delete_all", "delete_all", {"queue": queue, "state": state.value, "now": self._now()}
        )
        if count == 0:
            await self._require_queue("delete_all", queue)
        return count

    async def _set_paused(self, method: str, queue: str, paused: bool) -> None:
        row = await self._fetch_one(
            method, "set_paused", {"queue": queue, "paused": paused, "channel": self._channel}
        )
        if row is None:
            raise QueueNotFoundError(f"no queue named {queue!r}")

    async def pause_queue(self, queue: str) -> None:
        """Stop handing out tasks of ``queue``; enqueue still works (W8)."""
        await self._set_paused("pause_queue", queue, True)

    async def unpause_queue(self, queue: str) -> None:
        """Resume handing out tasks of ``queue``."""
        await self._set_paused("unpause_queue", queue, False)

    async def list_workers(self) -> list[WorkerInfo]:
        """Worker processes that sent a heartbeat recently."""
        rows = await self._fetch(
            "list_workers", "list_workers", {"since": self._now() - WORKER_VISIBLE_SECONDS}
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


def _archived_follow_ups(rows: list[Row]) -> list[EnqueueParams]:
    """The continuations of the archived rows among ``rows`` (inspector archive/cancel)."""
    return [
        f
        for r in rows
        if r["state"] == TaskState.ARCHIVED.value
        for f in continuations.for_archived(row_to_info(r))
    ]
