"""Apps and helpers for the worker-level conformance tests (real clock, real broker)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import durq
from conformance.conftest import requires
from durq import lifecycle
from durq.brokers import open_broker
from durq.brokers.base import CAP_MULTI_PROCESS, ClaimParams
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


@contextlib.asynccontextmanager
async def hang_report(seconds: float) -> AsyncIterator[None]:
    """Fail with every asyncio task's stack when the block takes over ``seconds``: a test
    that hangs then says where, instead of a bare timeout of the whole run."""
    loop = asyncio.get_running_loop()
    report: list[str] = []

    def dump() -> None:
        out = io.StringIO()
        for task in asyncio.all_tasks(loop):
            print(task, file=out)
            task.print_stack(file=out)
        report.append(out.getvalue())

    timer = loop.call_later(seconds, dump)
    try:
        async with asyncio.timeout(seconds + 1):
            yield
    except TimeoutError:
        raise AssertionError(f"hung for {seconds}s; tasks:\n{''.join(report)}") from None
    finally:
        timer.cancel()


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


async def check_group_made_before_upgrade(
    broker: Any, downgrade: Callable[[str], Awaitable[None]]
) -> None:
    """A group recorded before a group's follow-up was created waiting (``downgrade(group
    id)`` takes the flag off its record, once the waiting follow-up is deleted) still gets
    its follow-up from the last member's step, once, with every member's outcome."""
    app = durq.App(broker)
    group = await app.enqueue_group(
        [durq.EnqueueRequest("m:x", {"i": i}) for i in range(2)], then="m:done"
    )
    assert group.then_id is not None
    await app.inspector.delete_task(group.queue, group.then_id)
    await downgrade(group.id)
    leases = await broker.claim(ClaimParams([group.queue], 10, "w", 60))
    assert len(leases) == 2
    for lease in leases:
        assert await broker.complete(lifecycle.completed(lease, b"5", now=broker.clock.now()))
    (follow,) = await broker.claim(ClaimParams([group.queue], 10, "w", 60))
    assert follow.task.id == group.then_id
    members = json.loads(follow.task.raw_payload)["members"]
    assert [m["result"] for m in members] == [5, 5]
