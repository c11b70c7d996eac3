"""The inspector: the admin facade that the CLI and the dashboard use.

It validates names and states at the edge; reads go through the broker's Admin seam, moves
through :mod:`durq.lifecycle`, which decides them and hands the broker fenced writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durq import lifecycle
from durq.brokers.base import QueueStats, WorkerInfo
from durq.errors import ValidationError
from durq.names import check_queue, check_task_id
from durq.states import TaskState
from durq.task import TaskInfo

if TYPE_CHECKING:
    from durq.app import App
    from durq.brokers.base import FullBroker


def parse_state(state: TaskState | str) -> TaskState:
    """A :class:`TaskState` from its name; ValidationError for anything else."""
    if isinstance(state, TaskState):
        return state
    try:
        return TaskState(str(state).lower())
    except ValueError:
        known = ", ".join(s.value for s in TaskState)
        raise ValidationError(f"unknown state {state!r} (one of: {known})") from None


class Inspector:
    """Look at and steer queues, tasks and workers."""

    def __init__(self, app: App) -> None:
        self._app = app

    async def _admin(self) -> FullBroker:
        return await self._app.broker()

    async def list_queues(self) -> list[QueueStats]:
        """Every known queue with sizes per state and counters."""
        return await (await self._admin()).list_queues()

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue; QueueNotFoundError if unknown."""
        return await (await self._admin()).queue_stats(check_queue(queue))

    async def list_tasks(
        self, queue: str, state: TaskState | str, *, limit: int = 50, offset: int = 0
    ) -> list[TaskInfo]:
        """Tasks of ``queue`` in ``state``, a page at a time."""
        if limit < 1 or limit > 1000 or offset < 0:
            raise ValidationError("limit must be 1..1000 and offset >= 0")
        admin = await self._admin()
        return await admin.list_tasks(
            check_queue(queue), parse_state(state), limit=limit, offset=offset
        )

    async def get_task_info(self, queue: str, task_id: str) -> TaskInfo:
        """One task by id; TaskNotFoundError if absent."""
        return await (await self._admin()).get_task(check_queue(queue), check_task_id(task_id))

    async def run_task(self, queue: str, task_id: str) -> TaskInfo:
        """Make a scheduled, retry or archived task pending now."""
        return await lifecycle.run_task(
            await self._admin(), check_queue(queue), check_task_id(task_id)
        )

    async def archive_task(self, queue: str, task_id: str) -> TaskInfo:
        """Archive a waiting task."""
        return await lifecycle.archive_task(
            await self._admin(), check_queue(queue), check_task_id(task_id)
        )

    async def delete_task(self, queue: str, task_id: str) -> None:
        """Delete a task that is not active."""
        await lifecycle.delete_task(await self._admin(), check_queue(queue), check_task_id(task_id))

    async def cancel_task(self, queue: str, task_id: str) -> TaskInfo:
        """Cancel a task: an active one's handler is cancelled by its worker."""
        return await lifecycle.cancel_task(
            await self._admin(), check_queue(queue), check_task_id(task_id)
        )

    async def run_all(self, queue: str, state: TaskState | str) -> int:
        """Run every scheduled, retry or archived task of a queue now."""
        return await lifecycle.run_all(await self._admin(), check_queue(queue), parse_state(state))

    async def delete_all(self, queue: str, state: TaskState | str) -> int:
        """Delete every task of a queue in a state other than active."""
        return await lifecycle.delete_all(
            await self._admin(), check_queue(queue), parse_state(state)
        )

    async def pause_queue(self, queue: str) -> None:
        """Pause a queue: workers take nothing from it; enqueue still works."""
        await (await self._admin()).pause_queue(check_queue(queue))

    async def unpause_queue(self, queue: str) -> None:
        """Resume a paused queue."""
        await (await self._admin()).unpause_queue(check_queue(queue))

    async def list_workers(self) -> list[WorkerInfo]:
        """Live worker processes."""
        return await (await self._admin()).list_workers()
