"""The state machine is enforced: every move the lifecycle decides is looked up in
``states.TRANSITIONS``, and a move the table lacks raises a typed error before any write."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from durq import lifecycle, states
from durq.brokers.base import ClaimParams, EnqueueParams, Lease
from durq.brokers.sqlite import SQLiteBroker
from durq.clock import FakeClock
from durq.errors import IllegalTransitionError, InvalidStateError
from durq.states import TaskState
from durq.task import TaskInfo

EVENTS = sorted({event for _, event in states.TRANSITIONS})


@pytest.mark.parametrize("state", list(TaskState))
@pytest.mark.parametrize("event", EVENTS)
def test_move_follows_the_table_and_refuses_the_rest(state: TaskState, event: str) -> None:
    if (state, event) in states.TRANSITIONS:
        assert states.move(state, event) == states.TRANSITIONS[(state, event)]
        return
    with pytest.raises(IllegalTransitionError) as caught:
        states.move(state, event, task_id="t")
    assert isinstance(caught.value, InvalidStateError)  # what callers already catch
    assert caught.value.state is state and caught.value.event == event
    assert f"it is {state.value}" in str(caught.value)


def lease_in(state: TaskState) -> Lease:
    now = datetime.now(UTC)
    task = TaskInfo(
        id="t",
        queue="default",
        type="x",
        raw_payload=b"{}",
        state=state,
        max_retry=3,
        enqueued_at=now,
        next_process_at=now,
    )
    return Lease(task, "token")


@pytest.mark.parametrize("state", [s for s in TaskState if s is not TaskState.ACTIVE])
def test_worker_outcomes_of_a_task_that_is_not_active_are_refused(state: TaskState) -> None:
    lease = lease_in(state)
    with pytest.raises(IllegalTransitionError):
        lifecycle.completed(lease, None, now=0.0)
    with pytest.raises(IllegalTransitionError):
        lifecycle.gave_up(lease, "boom", now=0.0)
    with pytest.raises(IllegalTransitionError):
        lifecycle.failed(lease, "boom", now=0.0, delay=lambda: 1.0)
    with pytest.raises(IllegalTransitionError):
        lifecycle.lease_expired(lease, now=0.0, max_lost=3)
    with pytest.raises(IllegalTransitionError):
        lifecycle.handed_back(lease)


def test_every_row_of_the_table_is_asked_by_the_lifecycle() -> None:
    # The functions that ask states.move (the lifecycle's, and states.released, which the
    # brokers ask when they release a waiting task) name each event; a row whose event none
    # names describes a move nobody decides (a broker's own, below the seam): not a row.
    named: set[str] = set()
    for module in (lifecycle, states):
        source = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
        for function in ast.walk(source):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            calls = [n for n in ast.walk(function) if isinstance(n, ast.Call)]
            if module is states and not any(getattr(c.func, "id", None) == "move" for c in calls):
                continue
            named.update(
                node.value
                for node in ast.walk(function)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
            )
    assert set(EVENTS) <= named, sorted(set(EVENTS) - named)


def test_a_task_handed_back_at_shutdown_is_asked_to_the_table() -> None:
    lease = lease_in(TaskState.ACTIVE)
    assert lifecycle.handed_back(lease) == lease.ref


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[SQLiteBroker]:
    b = SQLiteBroker(str(tmp_path / "q.db"), clock=FakeClock())
    yield b
    await b.close()


async def test_an_illegal_inspector_move_raises_and_writes_nothing(broker: SQLiteBroker) -> None:
    await broker.enqueue(EnqueueParams(id="t", queue="default", type="x", payload=b"{}"))
    (lease,) = await broker.claim(ClaimParams(["default"], 1, "w", 30))
    for move in (lifecycle.run_task, lifecycle.archive_task, lifecycle.delete_task):
        with pytest.raises(IllegalTransitionError):
            await move(broker.admin, "default", "t")
    after = await broker.admin.get_task("default", "t")
    assert after.state is TaskState.ACTIVE and not after.cancel_requested
    assert await broker.complete(
        lifecycle.completed(lease, None, now=broker.clock.now())
    )  # the lease is untouched
