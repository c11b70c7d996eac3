"""Attempts share slot tasks, yet each runs as it would in a task of its own: a cancel aimed
at one attempt and the context variables its handler set never reach the next attempt, and a
lease cancelled before any attempt started is still settled by its reason."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import durq
from durq.brokers.base import CompleteParams, Lease, RetryParams
from durq.states import TaskState
from durq.task import TaskInfo
from durq.worker.executor import LOST, SHUTDOWN, Executor

_seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


def _lease(task_id: str, task_type: str) -> Lease:
    task = TaskInfo(task_id, "default", task_type, b"{}", TaskState.ACTIVE, max_retry=3)
    return Lease(task, f"token-{task_id}")


class _Broker:
    """Stores what the executor reports."""

    def __init__(self) -> None:
        self.completed: list[str] = []
        self.retried: list[tuple[str, str]] = []
        self.requeued: list[str] = []

    async def complete_many(self, params: Sequence[CompleteParams]) -> list[bool]:
        self.completed.extend(p.lease.id for p in params)
        return [True for _ in params]

    async def retry(self, params: RetryParams) -> bool:
        self.retried.append((params.lease.id, params.error))
        return True

    async def requeue(self, params: Any, keep: bool = False) -> bool:
        self.requeued.append(params.id)
        return True


class _Outcomes(durq.WorkerHooks):
    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}

    def task_finished(self, task: TaskInfo, outcome: str, duration: float) -> None:
        self.outcomes[task.id] = outcome


def _executor(app: durq.App, broker: _Broker, hooks: _Outcomes) -> Executor:
    return Executor(app, broker, concurrency=1, worker_id="w", hooks=[hooks])  # type: ignore[arg-type]


def _submit_when_stored(executor: Executor, lease: Lease) -> None:
    """Submit ``lease`` as the fetcher does (from its own task's context): when the first
    attempt's completion is stored, before that attempt has ended (its slot is free; its
    slot task still runs it)."""
    stored = executor.acker.on_stored
    fetchers = contextvars.copy_context()

    def then_submit(acks: Sequence[CompleteParams]) -> None:
        stored(acks)
        executor.acker.on_stored = stored
        fetchers.run(executor.submit, lease)

    executor.acker.on_stored = then_submit


async def test_a_cancel_the_handler_swallowed_does_not_reach_the_next_attempt(
    tmp_path: Path,
) -> None:
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    started = asyncio.Event()

    @app.task("t:swallow")
    async def swallow(payload: dict[str, Any]) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass  # returns as if nothing happened

    @app.task("t:raises")
    async def raises(payload: dict[str, Any]) -> None:
        raise asyncio.CancelledError  # its own: an ordinary failure, retried

    broker, hooks = _Broker(), _Outcomes()
    executor = _executor(app, broker, hooks)
    _submit_when_stored(executor, _lease("t2", "t:raises"))
    executor.submit(_lease("t1", "t:swallow"))
    await started.wait()
    assert executor.cancel("t1", LOST)
    for _ in range(50):
        if "t2" in hooks.outcomes:
            break
        await asyncio.sleep(0.01)
    assert await executor.drain(5)
    assert hooks.outcomes == {"t1": "completed", "t2": "retry"}
    assert broker.retried == [("t2", "CancelledError")]
    await executor.close()


async def test_context_variables_a_handler_set_do_not_reach_the_next_attempt(
    tmp_path: Path,
) -> None:
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    seen: list[str] = []

    @app.task("t:sets")
    async def sets(payload: dict[str, Any]) -> None:
        seen.append(_seen.get())
        _seen.set("set by t1")

    broker, hooks = _Broker(), _Outcomes()
    executor = _executor(app, broker, hooks)
    _submit_when_stored(executor, _lease("t2", "t:sets"))
    executor.submit(_lease("t1", "t:sets"))
    for _ in range(50):
        if len(seen) == 2:
            break
        await asyncio.sleep(0.01)
    assert await executor.drain(5)
    assert seen == ["unset", "unset"]
    assert broker.completed == ["t1", "t2"]
    await executor.close()


async def test_a_lease_cancelled_before_its_attempt_started_is_handed_back(
    tmp_path: Path,
) -> None:
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    ran: list[str] = []

    @app.task("t:run")
    async def run(payload: dict[str, Any]) -> None:
        ran.append("ran")

    broker, hooks = _Broker(), _Outcomes()
    executor = _executor(app, broker, hooks)
    executor.submit(_lease("t1", "t:run"))
    executor.cancel_all(SHUTDOWN)  # in the same loop turn: no attempt has started
    assert await executor.drain(5)
    assert ran == []
    assert broker.requeued == ["t1"]
    assert hooks.outcomes == {"t1": "requeued"}
    assert not executor.running
    await executor.close()
