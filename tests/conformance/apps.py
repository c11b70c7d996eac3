"""Apps and helpers for the worker-level conformance tests (real clock, real broker)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import durq
from durq.states import TaskState

#: Short intervals so tests wait on real events, not on tickers.
FAST = {
    "poll_interval": 0.2,
    "promote_interval": 0.1,
    "rescue_interval": 0.2,
    "janitor_interval": 0.2,
    "shutdown_timeout": 5.0,
}


async def wait_for_state(
    app: durq.App, queue: str, task_id: str, state: TaskState, timeout: float = 10.0
) -> durq.TaskInfo:
    """Poll the inspector until the task reaches ``state`` (fails with the last seen state)."""
    deadline = time.monotonic() + timeout
    info = None
    while time.monotonic() < deadline:
        try:
            info = await app.inspector.get_task_info(queue, task_id)
            if info.state is state:
                return info
        except durq.TaskNotFoundError:
            info = None
        await asyncio.sleep(0.02)
    raise AssertionError(f"task {task_id} did not reach {state}; last seen: {info}")


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def noop(payload: dict[str, Any]) -> None:
    return None
