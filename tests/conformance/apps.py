"""Apps and helpers for the worker-level conformance tests (real clock, real broker)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import durq
from conformance.conftest import requires
from durq.brokers import open_broker
from durq.brokers.base import CAP_MULTI_PROCESS
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


WORKER_PROCESS = Path(__file__).parent / "worker_process.py"


@contextlib.contextmanager
def worker_process(
    broker_url: str, marker: Path, lease: float = 30.0
) -> Iterator[subprocess.Popen[bytes]]:
    """A real worker process (``worker_process.py``) that writes ``marker``; killed at exit.

    Skips the test on a broker whose tasks another process cannot see (``memory://``)."""
    requires(open_broker(broker_url), CAP_MULTI_PROCESS)
    proc = subprocess.Popen(
        [sys.executable, str(WORKER_PROCESS), broker_url, str(marker), str(lease)],
        env={**os.environ, "PYTHONPATH": str(WORKER_PROCESS.parent.parent.parent / "src")},
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def marker_lines(marker: Path) -> list[list[str]]:
    """The marker's lines, split into words (``start <id> <pid> <retried>``, ``return …``)."""
    if not marker.exists():
        return []
    return [line.split() for line in marker.read_text().splitlines() if line.strip()]


async def signal_on_marker(
    proc: subprocess.Popen[bytes], marker: Path, word: str, sig: int, timeout: float = 20.0
) -> int:
    """Send ``sig`` the moment a marker line starts with ``word``; the process's exit code."""
    deadline = time.monotonic() + timeout
    while not any(line[0] == word for line in marker_lines(marker)):
        assert time.monotonic() < deadline, f"the worker never wrote {word!r}"
        await asyncio.sleep(0.002)
    proc.send_signal(sig)
    return proc.wait(timeout=20)


async def exists(app: durq.App, queue: str, task_id: str) -> bool:
    try:
        await app.inspector.get_task_info(queue, task_id)
        return True
    except durq.TaskNotFoundError:
        return False
