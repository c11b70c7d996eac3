"""A real durq worker run in this process for Django tasks, until given tasks finish."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable

from durq import WorkerHooks
from durq.contrib.django import DurqBackend, registry
from durq.contrib.django.execution import register
from durq.task import TaskInfo
from servers import require_server

FINAL = {"completed", "archived", "retry"}


class _Watch(WorkerHooks):
    def __init__(self, ids: set[str]) -> None:
        self.ids = ids
        self.done = threading.Event()
        self.outcomes: dict[str, str] = {}

    def task_finished(self, task: TaskInfo, outcome: str, duration: float) -> None:
        if task.id in self.ids and outcome in FINAL:
            self.outcomes[task.id] = outcome
            if set(self.outcomes) >= self.ids:
                self.done.set()


def run_until_finished(
    backend: DurqBackend,
    ids: Iterable[str],
    *,
    queues: Iterable[str] = ("default",),
    concurrency: int = 4,
) -> dict[str, str]:
    """Run a worker (in a thread of its own, with its own event loop) until every task of
    ``ids`` has ended an attempt (completed, archived or waiting for a retry)."""
    watch = _Watch(set(ids))
    app = backend.app
    register(app, registry.discover(backend.task_modules), backend.alias)

    async def main() -> None:
        worker = app.worker(
            queues=list(queues), concurrency=concurrency, hooks=[watch], scheduler=False
        )
        async with worker:
            await asyncio.to_thread(watch.done.wait, 60)
        await app.close()

    thread = threading.Thread(target=asyncio.run, args=(main(),))
    thread.start()
    thread.join()
    assert watch.done.is_set(), f"tasks did not finish: {set(watch.ids) - set(watch.outcomes)}"
    return watch.outcomes


def require_pg() -> None:
    """Skip (fail under CI) without PostgreSQL; conftest made the ``pg`` database then."""
    require_server("postgres")
