"""Extension points around task execution, used by metrics, tracing and user code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from durq.task import TaskInfo

#: Outcomes reported to :meth:`WorkerHooks.task_finished`.
OUTCOMES = ("completed", "retry", "snoozed", "slept", "archived", "requeued", "lost")


class WorkerHooks:
    """Subclass and override what you need; every method defaults to doing nothing.

    Hooks run on the worker's event loop and must not block."""

    def task_started(self, task: TaskInfo) -> None:
        """A claimed task is about to run."""

    def task_finished(self, task: TaskInfo, outcome: str, duration: float) -> None:
        """An attempt ended with one of :data:`OUTCOMES`."""

    @contextlib.contextmanager
    def around(self, task: TaskInfo) -> Iterator[None]:
        """Wraps the handler call (e.g. a trace span whose parent comes from the headers)."""
        yield

    def busy_changed(self, busy: int, concurrency: int) -> None:
        """The number of busy slots changed."""

    async def drain(self) -> None:
        """Finish work the hook started (e.g. enqueues) before the worker closes its broker."""
