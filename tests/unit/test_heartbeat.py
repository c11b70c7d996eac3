"""A heartbeat's answer is about the leases it sent, not about later claims of the same task."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import durq
from durq.brokers.base import Lease, LeaseRef, LeaseReport, WorkerInfo
from durq.states import TaskState
from durq.task import TaskInfo
from durq.worker.executor import Executor
from durq.worker.heartbeat import Heartbeat


def _lease(token: str) -> Lease:
    task = TaskInfo("t1", "default", "t:wait", b"{}", TaskState.ACTIVE, max_retry=3)
    return Lease(task, token)


class _Broker:
    """Answers the heartbeat as a broker would after the first attempt ended and the task was
    claimed again by this worker while the heartbeat's round trip was in flight."""

    def __init__(self) -> None:
        self.on_extend: Any = None

    async def extend_leases(self, leases: list[LeaseRef], seconds: float) -> LeaseReport:
        await self.on_extend()
        ids = frozenset(ref.id for ref in leases)
        return LeaseReport(lost=ids, cancel=ids)

    async def register_worker(self, info: WorkerInfo) -> None:
        pass


async def test_a_new_claim_of_the_same_task_is_not_cancelled_as_lost(tmp_path: Path) -> None:
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    release = asyncio.Event()
    cancelled: list[str] = []

    @app.task("t:wait")
    async def wait(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(ctx.id)
            raise

    broker = _Broker()
    executor = Executor(app, broker, concurrency=2, worker_id="w", hooks=[])  # type: ignore[arg-type]
    first = _lease("token-1")
    executor.submit(first)
    await asyncio.sleep(0)

    async def first_attempt_ends_and_task_is_claimed_again() -> None:
        (running,) = executor.running.values()
        running.task.cancel()  # the first attempt ends (how does not matter here)
        await asyncio.wait([running.task])
        await asyncio.sleep(0)
        assert not executor.running
        executor.submit(_lease("token-2"))
        await asyncio.sleep(0)

    broker.on_extend = first_attempt_ends_and_task_is_claimed_again
    heartbeat = Heartbeat(
        broker,  # type: ignore[arg-type]
        executor,
        interval=1,
        lease_seconds=30,
        worker_info=lambda: None,  # type: ignore[arg-type,return-value]
    )
    await heartbeat.tick()
    (second,) = executor.running.values()
    assert second.lease.token == "token-2"
    assert second.reason is None and not second.task.cancelled()
    release.set()
    await executor.drain(5)
    await executor.close()


class _AckBroker:
    async def complete_many(self, params: list[Any]) -> list[bool]:
        return [True for _ in params]


async def test_an_ended_attempt_does_not_untrack_a_new_claim_of_its_task(tmp_path: Path) -> None:
    # The task is claimed again in the same loop turn its first attempt ends: the old
    # attempt's release must not drop the new one (unheartbeated, undrained at shutdown).
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    release = asyncio.Event()

    @app.task("t:wait")
    async def wait(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        if ctx.retried:
            await release.wait()

    loop = asyncio.get_running_loop()
    second = Lease(_lease("token-2").task.replace(retried=1), "token-2")

    class ClaimsAgain(durq.WorkerHooks):
        def task_finished(self, task: TaskInfo, outcome: str, duration: float) -> None:
            if task.retried == 0:
                loop.call_soon(executor.submit, second)

    executor = Executor(
        app,
        _AckBroker(),  # type: ignore[arg-type]
        concurrency=2,
        worker_id="w",
        hooks=[ClaimsAgain()],
    )
    executor.submit(_lease("token-1"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert [r.lease.token for r in executor.running.values()] == ["token-2"]
    assert executor.free_slots == 1  # the first attempt's slot came back
    release.set()
    assert await executor.drain(5)
    await executor.close()
