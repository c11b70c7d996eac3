"""The testing kit: the app's real worker, driven from a test, with a clock the test moves.

::

    async with durq.testing.worker(app) as w:
        info = await app.enqueue("email:send", {"to": "a@b.c"}, process_in="10m")
        assert await w.drain() == []      # not due yet
        w.clock.advance("10m")
        ran = await w.drain()             # runs it, and anything it creates
        assert ran.outcomes == [("email:send", "completed")]

Nothing bypasses the broker: payloads round-trip through the codec, task options (retries,
timeouts, uniqueness, continuations) are honoured, and outcomes are decided by the worker's
own executor. What is gone is the waiting. The pytest plugin (``durq_app``, ``durq_worker``
fixtures) is :mod:`durq.testing.pytest_plugin`; see ``docs/testing.md``.
"""

from durq.clock import FakeClock
from durq.testing.driver import (
    Attempt,
    Drained,
    DrainLimitError,
    SyncTestWorker,
    TaskFailedError,
    TestWorker,
    drain_sync,
    in_memory,
    worker,
    worker_sync,
)

__all__ = [
    "Attempt",
    "DrainLimitError",
    "Drained",
    "FakeClock",
    "SyncTestWorker",
    "TaskFailedError",
    "TestWorker",
    "drain_sync",
    "in_memory",
    "worker",
    "worker_sync",
]
