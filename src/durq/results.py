"""Waiting for a task's result: :meth:`durq.App.wait` and its twins.

A wait subscribes to the end of its task through the broker's wake-up channel
(:meth:`~durq.brokers.contract.Broker.watch_end`), then reads the task, so an end that happens
between the read and the wait is still heard. It reads the task again when notified, and
every :data:`RECHECK` seconds without a notification: a slow safety net for notifications
lost while a connection was down, not the way a wait learns of the end.

A task that does not exist yet (a continuation ``then:<id>`` before its task ended, a
workflow node, any id a producer has yet to enqueue) is waited for: no broker announces the
creation of a task, so the wait reads it again on a short backoff (:data:`ABSENT_FIRST`
doubling up to :data:`ABSENT_MAX` seconds) until it appears, then waits for its end as
above. Only a task seen and then gone (deleted, or completed with retention 0 before its
end was read) raises :class:`~durq.TaskNotFoundError`; an id that is not a valid task id
raises :class:`~durq.InvalidNameError` at once, since no task can ever have it.
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
from durq.names import check_task_id
from durq.states import TaskState
from durq.task import TaskInfo

#: Seconds between two reads of a waited task when no notification came (the safety net).
RECHECK = 5.0
#: First and longest pause between two reads of a task that does not exist yet: no broker
#: announces a creation, so this backoff is how such a wait learns of it.
ABSENT_FIRST = 0.05
ABSENT_MAX = 1.0


async def wait_for_end(
    broker: FullBroker, queue: str, task_id: str, timeout: float | None
) -> TaskInfo:
    """The completed task; raises :class:`TaskArchivedError` (or
    :class:`TaskCancelledError`), :class:`WaitTimeoutError` after ``timeout`` s (``None``:
    no limit), or :class:`TaskNotFoundError` when the task was seen and then deleted before
    its end was read (``retention=0`` deletes a completed task at once). A task that does
    not exist yet is waited for (see the module's docstring)."""
    check_task_id(task_id)
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + max(0.0, timeout)
    seen = False
    pause = ABSENT_FIRST
    while True:
        # Subscribed before reading: an end after this read is always notified.
        async with broker.watch_end(queue, task_id) as watch:
            info = await _read(broker, queue, task_id, seen)
            if info is None:  # not created yet
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    raise WaitTimeoutError(
                        f"task {task_id!r} in queue {queue!r} did not end within "
                        f"{timeout:g}s (it does not exist yet)",
                        info=None,
                    )
                # Watched too: a task created and ended within one pause is still heard
                # where the broker announces ends by id.
                await watch.wait(pause if remaining is None else min(remaining, pause))
                pause = min(pause * 2, ABSENT_MAX)
                continue
            seen = True
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


async def _read(broker: FullBroker, queue: str, task_id: str, seen: bool) -> TaskInfo | None:
    """The task; ``None`` while it was never seen (it may be created later)."""
    try:
        return await broker.admin.get_task(queue, task_id)
    except TaskNotFoundError:
        if not seen:
            return None
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
