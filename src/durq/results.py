"""Waiting for a task's result: :meth:`durq.App.wait` and its twins.

A wait subscribes to the end of its task through the broker's wake-up channel
(:meth:`~durq.brokers.contract.Broker.watch_end`), then reads the task, so an end that happens
between the read and the wait is still heard. It reads the task again when notified, and
every :data:`RECHECK` seconds without a notification: a slow safety net for notifications
lost while a connection was down, not the way a wait learns of the end.
"""

from __future__ import annotations

import asyncio

from durq.brokers.contract import FullBroker
from durq.errors import (
    TaskArchivedError,
    TaskCancelledError,
    TaskNotFoundError,
    WaitTimeoutError,
)
from durq.lifecycle import CANCELLED
from durq.states import TaskState
from durq.task import TaskInfo

#: Seconds between two reads of a waited task when no notification came (the safety net).
RECHECK = 5.0


async def wait_for_end(
    broker: FullBroker, queue: str, task_id: str, timeout: float | None
) -> TaskInfo:
    """The completed task; raises :class:`TaskArchivedError` (or
    :class:`TaskCancelledError`), :class:`WaitTimeoutError` after ``timeout`` s (``None``:
    no limit), or :class:`TaskNotFoundError` when there is no such task or it was deleted
    before its end was read (``retention=0`` deletes a completed task at once)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + max(0.0, timeout)
    first = True
    while True:
        # Subscribed before reading: an end after this read is always notified.
        async with broker.watch_end(queue, task_id) as watch:
            info = await _read(broker, queue, task_id, first)
            first = False
            if info.state is TaskState.COMPLETED:
                return info
            if info.state is TaskState.ARCHIVED:
                raise _archived(info)
            remaining = RECHECK if deadline is None else deadline - loop.time()
            if remaining <= 0:
                raise WaitTimeoutError(
                    f"task {task_id!r} in queue {queue!r} did not end within {timeout:g}s "
                    f"(it is {info.state.value})",
                    info=info,
                )
            await watch.wait(min(remaining, RECHECK))


async def _read(broker: FullBroker, queue: str, task_id: str, first: bool) -> TaskInfo:
    try:
        return await broker.admin.get_task(queue, task_id)
    except TaskNotFoundError:
        if first:
            raise
        raise TaskNotFoundError(
            f"task {task_id!r} in queue {queue!r} is gone: deleted, or completed with "
            "retention 0 (its result is not kept)"
        ) from None


def _archived(info: TaskInfo) -> TaskArchivedError:
    if info.last_error == CANCELLED:
        return TaskCancelledError(f"task {info.id!r} was cancelled", info=info)
    return TaskArchivedError(
        f"task {info.id!r} was archived after {info.attempts_label} attempts: "
        f"{info.last_error or 'no error recorded'}",
        info=info,
    )
