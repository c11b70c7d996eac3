"""App.wait on every broker: the result, the typed errors, and the notification that wakes it.

The safety re-check (``durq.results.RECHECK``) is set far beyond each test's limit, so a wait
that returns in time was woken by the broker's notification of the task's end."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import durq
from conformance.apps import FAST, wait_for_state, worker_process
from conformance.brokerkit import claim, params
from conformance.conftest import requires
from durq import results
from durq.brokers import FullBroker
from durq.brokers.base import CAP_CROSS_PROCESS_NOTIFY, CAP_MULTI_PROCESS, CompleteParams
from durq.states import TaskState

#: Far longer than any wait below: only a notification can end those waits in time.
NO_RECHECK = 600.0
#: Generous bound for a notified wait on a loaded machine.
LIMIT = 30.0


@pytest.fixture(autouse=True)
def no_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "RECHECK", NO_RECHECK)


def skip_unless_notified(broker: FullBroker) -> None:
    """A multi-process broker that cannot notify (PgBouncer without listen_url) learns of the
    end by the re-check only; these tests would wait for it."""
    if CAP_MULTI_PROCESS in broker.capabilities:
        requires(broker, CAP_CROSS_PROCESS_NOTIFY)


@dataclasses.dataclass
class Order:
    user_id: int


@dataclasses.dataclass
class Receipt:
    total: int


async def test_wait_returns_the_result_typed(app: durq.App) -> None:
    skip_unless_notified(await app.broker())

    release = asyncio.Event()

    @app.task("wait:price", retention=600)
    async def price(payload: Order) -> Receipt:
        await release.wait()  # ends once the wait below is (very likely) parked
        return Receipt(total=payload.user_id * 10)

    async with app.worker(**FAST):
        info = await price.enqueue(Order(user_id=4))
        waiting = asyncio.create_task(app.wait(info, timeout=LIMIT))
        await asyncio.sleep(0.5)
        release.set()
        assert await waiting == {"total": 40}
        receipt = await price.wait(info.id, timeout=LIMIT)
    assert receipt == Receipt(total=40)


async def test_wait_on_an_archived_task_raises_with_its_traceback(app: durq.App) -> None:
    skip_unless_notified(await app.broker())

    @app.task("wait:broken", max_retry=0)
    async def broken(payload: dict[str, Any]) -> None:
        await asyncio.sleep(0.2)
        raise ValueError("the partner said no")

    async with app.worker(**FAST):
        info = await broken.enqueue({})
        with pytest.raises(durq.TaskArchivedError) as caught:
            await app.wait(info, timeout=LIMIT)
    assert not isinstance(caught.value, durq.TaskCancelledError)
    assert caught.value.last_error is not None and "the partner said no" in caught.value.last_error
    assert caught.value.traceback is not None and "ValueError" in caught.value.traceback
    assert caught.value.info is not None and caught.value.info.state is TaskState.ARCHIVED


async def test_wait_on_a_cancelled_task_raises_cancelled(app: durq.App) -> None:
    skip_unless_notified(await app.broker())
    started = asyncio.Event()

    @app.task("wait:slow")
    async def slow(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(60)

    async with app.worker(heartbeat_interval=0.1, **FAST):
        running = await slow.enqueue({})
        waiting = asyncio.create_task(app.wait(running, timeout=LIMIT))
        await asyncio.wait_for(started.wait(), LIMIT)
        await app.inspector.cancel_task("default", running.id)
        with pytest.raises(durq.TaskCancelledError):
            await waiting
    # A task that never ran, cancelled by the inspector: its wait ends too.
    queued = await slow.enqueue({}, process_in=3600)
    waiting = asyncio.create_task(app.wait(queued, timeout=LIMIT))
    await asyncio.sleep(0.2)
    await app.inspector.cancel_task("default", queued.id)
    with pytest.raises(durq.TaskCancelledError):
        await waiting


async def test_wait_times_out_and_the_task_goes_on(app: durq.App) -> None:
    @app.task("wait:never")
    async def never(payload: dict[str, Any]) -> None:
        return None

    info = await never.enqueue({})
    with pytest.raises(durq.WaitTimeoutError) as caught:
        await app.wait(info, timeout=0.3)
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.info is not None and caught.value.info.state is TaskState.PENDING
    still = await app.inspector.get_task_info("default", info.id)
    assert still.state is TaskState.PENDING


async def test_wait_for_a_task_that_does_not_exist_yet_times_out(app: durq.App) -> None:
    with pytest.raises(durq.WaitTimeoutError, match="does not exist yet") as caught:
        await app.wait("no-such-task", timeout=0.3)
    assert caught.value.info is None


async def test_wait_for_an_impossible_id_raises_at_once(app: durq.App) -> None:
    with pytest.raises(durq.InvalidNameError):
        await app.wait("no such task", timeout=LIMIT)


async def test_wait_for_a_task_enqueued_later_returns_its_result(app: durq.App) -> None:
    skip_unless_notified(await app.broker())

    @app.task("wait:later", retention=600)
    async def later(payload: dict[str, int]) -> int:
        return payload["n"] + 1

    async with app.worker(**FAST):
        waiting = asyncio.create_task(app.wait("made-later", timeout=LIMIT))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await later.enqueue({"n": 1}, task_id="made-later")
        assert await waiting == 2


async def test_wait_for_a_continuation_before_its_task_ended(app: durq.App) -> None:
    skip_unless_notified(await app.broker())
    release = asyncio.Event()

    @app.task("wait:first", retention=600)
    async def first(payload: dict[str, Any]) -> int:
        await release.wait()
        return 1

    @app.task("wait:then", retention=600)
    async def then(payload: dict[str, Any]) -> str:
        return "then ran"

    async with app.worker(**FAST):
        info = await first.enqueue({}, then="wait:then")
        waiting = asyncio.create_task(app.wait(f"then:{info.id}", timeout=LIMIT))
        await asyncio.sleep(0.3)
        release.set()
        assert await waiting == "then ran"


async def test_wait_on_a_deleted_task_raises_not_found(app: durq.App) -> None:
    skip_unless_notified(await app.broker())
    info = await app.enqueue("wait:nobody", {}, process_in=3600)
    waiting = asyncio.create_task(app.wait(info, timeout=LIMIT))
    await asyncio.sleep(0.2)
    await app.inspector.delete_task("default", info.id)
    with pytest.raises(durq.TaskNotFoundError, match="gone"):
        await waiting


async def test_wait_sync_returns_the_result(broker_url: str, app: durq.App) -> None:
    requires(await app.broker(), CAP_MULTI_PROCESS)  # the sync face opens its own broker
    skip_unless_notified(await app.broker())

    @app.task("wait:sync", retention=600)
    def double(payload: dict[str, int]) -> int:
        return payload["n"] * 2

    async with app.worker(**FAST):
        info = await double.enqueue({"n": 21})
        result = await asyncio.to_thread(app.wait_sync, info, timeout=LIMIT)
        typed = await asyncio.to_thread(double.wait_sync, info, timeout=LIMIT)
    assert result == typed == 42


async def test_watch_hears_an_end_between_the_read_and_the_wait(
    broker: FullBroker, make_broker: Callable[..., Awaitable[FullBroker]]
) -> None:
    """The race a wait must survive: subscribed, the task is read (active), then it ends
    before the waiter waits. The notification is kept, so the wait returns."""
    skip_unless_notified(broker)
    other = await make_broker()  # the worker's broker, another connection
    await broker.enqueue(params("t1"))
    (lease,) = await claim(other)
    async with broker.watch_end("default", "t1") as watch:
        assert (await broker.admin.get_task("default", "t1")).state is TaskState.ACTIVE
        assert await other.complete(CompleteParams(lease.ref, b"1", retention=60))
        assert await watch.wait(LIMIT)


async def test_wait_across_processes(app: durq.App, broker_url: str, tmp_path: Path) -> None:
    """A worker in another process completes the task; the wait here is woken by the broker."""
    skip_unless_notified(await app.broker())
    with worker_process(broker_url, tmp_path / "marker"):
        info = await app.enqueue("test:answer", {"n": 7}, queue="kill", retention=600)
        assert await app.wait(info, timeout=LIMIT) == {"answer": 7}
        # A task enqueued into a process that is already waiting on another end.
        second = await app.enqueue("test:answer", {"n": 8}, queue="kill", retention=600)
        assert await app.wait(second.id, queue="kill", timeout=LIMIT) == {"answer": 8}
    done = await wait_for_state(app, "kill", info.id, TaskState.COMPLETED)
    assert done.result == {"answer": 7}
