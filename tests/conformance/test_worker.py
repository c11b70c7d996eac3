"""Worker behaviour on every broker: W1-W12, with a real clock and real handlers."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import durq
from conformance.apps import FAST, signal_on_marker, wait_for_state, wait_until, worker_process
from durq.states import TaskState
from durq.worker import executor

HERE = Path(__file__).parent


@dataclasses.dataclass
class Model:
    x: int


async def test_W1_killed_worker_task_runs_again_after_lease(
    app: durq.App, broker_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "marker.txt"
    with worker_process(broker_url, marker, lease=1.5) as proc:
        info = await app.enqueue("test:sleepy", {"seconds": 60}, queue="kill", retention=60)
        await signal_on_marker(proc, marker, "start", signal.SIGKILL)
    # The task stays active until its lease expires, then the rescuer of any worker retries it.
    ran = asyncio.Event()

    @app.task("test:sleepy", queue="kill", retention=60)
    async def sleepy(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        assert ctx.retried == 1
        ran.set()
        return "second life"

    async with app.worker(queues=["kill"], lease_seconds=2, **FAST):
        await asyncio.wait_for(ran.wait(), 20)
        done = await wait_for_state(app, "kill", info.id, TaskState.COMPLETED, timeout=10)
    assert done.retried == 1 and done.last_error == "lease expired"


async def _async(value: bool) -> bool:
    return value


async def test_W1_heartbeats_keep_a_long_task(app: durq.App) -> None:
    runs = Counter[str]()

    @app.task("slow:job", retention=60)
    async def slow(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        runs[ctx.id] += 1
        await asyncio.sleep(1.5)  # three times the lease
        return "done"

    async with app.worker(lease_seconds=0.5, heartbeat_interval=0.1, **FAST):
        info = await slow.enqueue({})
        done = await wait_for_state(app, "default", info.id, TaskState.COMPLETED, timeout=15)
    assert runs[info.id] == 1 and done.retried == 0 and done.result == "done"


async def test_W2_concurrency_and_sync_handlers_in_threads(app: durq.App) -> None:
    started: list[str] = []
    gate = threading.Event()

    @app.task("sync:block")
    def block(payload: dict[str, Any]) -> None:
        started.append(threading.current_thread().name)
        gate.wait(5)  # blocks its thread, never the loop

    async with app.worker(concurrency=4, **FAST):
        for _ in range(4):
            await block.enqueue({})
        deadline = time.monotonic() + 10
        while len(started) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        # All four block their threads now: the loop still turns, long before they end.
        turned = time.monotonic()
        await asyncio.sleep(0.01)
        turned = time.monotonic() - turned
        gate.set()
    assert len(started) == 4, "four sync handlers should run at once"
    assert all(name.startswith("durq-task") for name in started)
    assert turned < 2.5, f"the event loop was blocked for {turned:.1f} s"


async def test_W3_timeout_cancels_the_handler(app: durq.App) -> None:
    cancelled = asyncio.Event()

    @app.task("slow:timeout", timeout=0.3, max_retry=0)
    async def slow(payload: dict[str, Any]) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with app.worker(**FAST):
        info = await slow.enqueue({})
        archived = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED)
    assert cancelled.is_set()
    assert archived.last_error is not None and "timeout" in archived.last_error


async def test_W3_deadline_cancels_the_handler(app: durq.App) -> None:
    @app.task("slow:deadline")
    async def slow(payload: dict[str, Any]) -> None:
        await asyncio.sleep(30)

    async with app.worker(**FAST):
        info = await slow.enqueue({}, deadline=time.time() + 0.3)
        archived = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED)
    assert archived.last_error == "deadline exceeded"


async def test_W3_handler_own_timeout_error_is_an_ordinary_failure(app: durq.App) -> None:
    # A TimeoutError from the handler's own I/O (socket.timeout, asyncio.wait_for) is not the
    # task's timeout firing: it fails the attempt like any error, with its own message.
    @app.task("io:timeout", max_retry=0)
    async def flaky(payload: dict[str, Any]) -> None:
        raise TimeoutError("partner did not answer")

    @app.task("io:timeout_with_budget", max_retry=0, timeout=30)
    async def flaky2(payload: dict[str, Any]) -> None:
        raise TimeoutError("partner did not answer")

    async with app.worker(**FAST):
        one = await flaky.enqueue({})
        two = await flaky2.enqueue({})
        a = await wait_for_state(app, "default", one.id, TaskState.ARCHIVED, timeout=5)
        b = await wait_for_state(app, "default", two.id, TaskState.ARCHIVED, timeout=5)
    assert a.last_error == "TimeoutError: partner did not answer"
    assert b.last_error == "TimeoutError: partner did not answer"


async def test_W3_cancelled_error_raised_by_the_handler_is_an_ordinary_failure(
    app: durq.App,
) -> None:
    # Awaiting a future that something else cancelled raises CancelledError in the handler
    # although nobody cancelled the attempt: it fails like any error, it is not left active.
    @app.task("io:cancelled", max_retry=0)
    async def fragile(payload: dict[str, Any]) -> None:
        inner = asyncio.get_running_loop().create_future()
        inner.cancel()
        await inner

    async with app.worker(**FAST):
        info = await fragile.enqueue({})
        archived = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED, timeout=5)
    assert archived.last_error == "CancelledError"


async def test_W4_retries_with_backoff_then_archives_with_alert(
    app: durq.App, caplog: pytest.LogCaptureFixture
) -> None:
    delays: list[int] = []

    def policy(retried: int, exc: BaseException) -> float:
        delays.append(retried)
        return 0.05

    @app.task("flaky:call", max_retry=2, retry_delay=policy)
    async def flaky(payload: dict[str, Any]) -> None:
        raise ConnectionError("partner down")

    with caplog.at_level(logging.INFO, logger="durq"):
        async with app.worker(**FAST):
            info = await flaky.enqueue({})
            archived = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED)
    assert delays == [0, 1]
    assert archived.retried == 3 and archived.last_error == "ConnectionError: partner down"
    alerts = [r for r in caplog.records if r.levelno == logging.ERROR and "archived" in r.message]
    assert len(alerts) == 1
    alert = alerts[0]
    for text in (info.id, "flaky:call", "default", "attempts=3", "partner down"):
        assert text in alert.getMessage()


def test_W4_named_policies() -> None:
    assert [durq.capped_power_of_two(n) for n in (0, 1, 5, 8, 9, 50)] == [1, 2, 32, 256, 300, 300]
    for n in range(30):
        assert 0 < durq.exponential(n) <= 3600


async def test_W5_skip_retry_and_not_ready(app: durq.App, caplog: pytest.LogCaptureFixture) -> None:
    polls = Counter[str]()

    @app.task("partner:poll", max_retry=10, retry_delay=durq.fixed(0.05), retention=60)
    async def poll(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, str]:
        polls[ctx.id] += 1
        if polls[ctx.id] < 3:
            raise durq.NotReady("partner still processing")
        return {"policy": "P-1"}

    @app.task("partner:reject", max_retry=10)
    async def reject(payload: dict[str, Any]) -> None:
        raise durq.SkipRetry("partner rejected the order")

    with caplog.at_level(logging.INFO, logger="durq"):
        async with app.worker(**FAST):
            polled = await poll.enqueue({})
            rejected = await reject.enqueue({})
            done = await wait_for_state(app, "default", polled.id, TaskState.COMPLETED)
            skipped = await wait_for_state(app, "default", rejected.id, TaskState.ARCHIVED)
    assert done.retried == 2 and done.last_error == "partner still processing"
    assert done.result == {"policy": "P-1"}
    assert skipped.retried == 1 and skipped.last_error == "partner rejected the order"
    not_ready = [r for r in caplog.records if "partner still processing" in r.getMessage()]
    assert not_ready and all(r.levelno == logging.INFO for r in not_ready)


async def test_W6_result_is_stored_while_retained(app: durq.App) -> None:
    @app.task("calc:sum", retention=60)
    async def add(payload: dict[str, Any]) -> dict[str, int]:
        return {"sum": payload["a"] + payload["b"]}

    @app.task("calc:gone", retention=0)
    async def gone(payload: dict[str, Any]) -> int:
        return 1

    async with app.worker(**FAST):
        info = await add.enqueue({"a": 2, "b": 3})
        done = await wait_for_state(app, "default", info.id, TaskState.COMPLETED)
        other = await gone.enqueue({})

        async def deleted() -> bool:
            try:
                await app.inspector.get_task_info("default", other.id)
            except durq.TaskNotFoundError:
                return True
            return False

        await wait_until(deleted)
    assert done.result == {"sum": 5} and done.completed_at is not None


async def test_W7_graceful_shutdown_hands_back_unfinished_tasks(app: durq.App) -> None:
    started = asyncio.Event()

    @app.task("slow:long")
    async def long(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(60)

    @app.task("slow:short", retention=60)
    async def short(payload: dict[str, Any]) -> str:
        started.set()
        await asyncio.sleep(0.3)
        return "finished in grace"

    worker = app.worker(**FAST)
    await worker.start()
    info = await long.enqueue({})
    await asyncio.wait_for(started.wait(), 10)
    await worker.stop(timeout=0.2)
    back = await app.inspector.get_task_info("default", info.id)
    assert back.state is TaskState.PENDING and back.retried == 0

    await app.inspector.delete_task("default", info.id)
    started.clear()
    worker = app.worker(**FAST)
    await worker.start()
    info = await short.enqueue({})
    await asyncio.wait_for(started.wait(), 10)
    await worker.stop(timeout=10)
    done = await app.inspector.get_task_info("default", info.id)
    assert done.state is TaskState.COMPLETED and done.result == "finished in grace"


async def test_W7_sigterm_on_a_real_process(app: durq.App, broker_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "marker.txt"
    with worker_process(broker_url, marker) as proc:
        info = await app.enqueue("test:sleepy", {"seconds": 60}, queue="kill")
        assert await signal_on_marker(proc, marker, "start", signal.SIGTERM) == 0
    back = await app.inspector.get_task_info("kill", info.id)
    assert back.state is TaskState.PENDING and back.retried == 0


async def test_W8_strict_priority_empties_higher_queues_first(app: durq.App) -> None:
    order: list[str] = []

    @app.task("prio:job")
    async def job(payload: dict[str, Any]) -> None:
        order.append(payload["q"])

    for q in ("low", "critical", "default"):
        for _ in range(3):
            await job.enqueue({"q": q}, queue=q)
    async with app.worker(
        queues={"critical": 6, "default": 3, "low": 1}, strict=True, concurrency=1, **FAST
    ):
        await wait_until(lambda: _async(len(order) == 9))
    assert order == ["critical"] * 3 + ["default"] * 3 + ["low"] * 3


async def test_W8_weighted_priority_serves_every_queue(app: durq.App) -> None:
    order: list[str] = []

    @app.task("prio:job")
    async def job(payload: dict[str, Any]) -> None:
        order.append(payload["q"])

    await app.enqueue_many(
        [job.request({"q": q}, queue=q) for q in ("high", "low") for _ in range(40)]
    )
    async with app.worker(queues={"high": 3, "low": 1}, concurrency=1, **FAST):
        await wait_until(lambda: _async(len(order) == 80), timeout=30)
    first_half = Counter(order[:40])
    assert first_half["low"] > 0, "a weighted low queue is not starved"
    assert first_half["high"] > first_half["low"]


async def test_W8_paused_queue_gives_nothing_but_accepts_enqueue(app: durq.App) -> None:
    ran = asyncio.Event()

    @app.task("pause:job", queue="paused", retention=60)
    async def job(payload: dict[str, Any]) -> None:
        ran.set()

    await job.enqueue({})
    await app.inspector.pause_queue("paused")
    info = await job.enqueue({})
    async with app.worker(queues=["paused"], **FAST):
        await asyncio.sleep(0.6)
        assert not ran.is_set()
        assert (await app.inspector.queue_stats("paused")).paused
        await app.inspector.unpause_queue("paused")
        await wait_for_state(app, "paused", info.id, TaskState.COMPLETED)
    assert ran.is_set()


async def test_W9_unknown_type_is_retried_with_a_clear_error(app: durq.App) -> None:
    async with app.worker(queues=["default"], **FAST):
        info = await app.enqueue("not:deployed", {})
        retry = await wait_for_state(app, "default", info.id, TaskState.RETRY)
    assert retry.last_error == 'no handler for type "not:deployed"' and retry.retried == 1


async def test_W10_two_workers_never_run_a_task_twice(app: durq.App, broker_url: str) -> None:
    runs = Counter[str]()
    live: set[str] = set()
    overlaps: list[str] = []

    @app.task("fan:out")
    async def job(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        if ctx.id in live:
            overlaps.append(ctx.id)
        live.add(ctx.id)
        runs[ctx.id] += 1
        await asyncio.sleep(0.001)
        live.discard(ctx.id)

    outcomes = await app.enqueue_many([job.request({"n": i}) for i in range(300)])
    ids = {o.info.id for o in outcomes if o.info}
    second = durq.App(broker_url)
    second.tasks = app.tasks
    async with app.worker(concurrency=8, **FAST), second.worker(concurrency=8, **FAST):
        await wait_until(lambda: _async(set(runs) == ids), timeout=60)
    await second.close()
    assert not overlaps
    assert max(runs.values()) == 1


async def test_W11_idle_worker_wakes_on_enqueue(app: durq.App) -> None:
    picked = asyncio.Event()

    @app.task("wake:job")
    async def job(payload: dict[str, Any]) -> None:
        picked.set()

    # A poll interval of 30 s: only a wake-up can start the task in time.
    async with app.worker(poll_interval=30, promote_interval=30):
        await asyncio.sleep(0.3)  # let the fetcher go idle
        for _ in range(3):
            picked.clear()
            await job.enqueue({})
            await asyncio.wait_for(picked.wait(), 5)
            await asyncio.sleep(0.1)


async def test_W11_a_burst_wakes_every_idle_worker_it_needs(app: durq.App, broker_url: str) -> None:
    """Two idle workers of one slot each; two tasks come in one call. Each task waits for the
    other to run too, so both workers must be woken (a 30 s poll would be too late)."""
    together = asyncio.Event()
    running = 0

    @app.task("wake:pair")
    async def pair(payload: dict[str, Any]) -> None:
        nonlocal running
        running += 1
        if running == 2:
            together.set()
        await asyncio.wait_for(together.wait(), 20)

    second = durq.App(broker_url)
    second.tasks = app.tasks
    idle = {"concurrency": 1, "poll_interval": 30, "promote_interval": 30}
    async with app.worker(**idle), second.worker(**idle):  # type: ignore[arg-type]
        await asyncio.sleep(0.3)  # both idle
        await app.enqueue_many([pair.request({"n": 1}), pair.request({"n": 2})])
        await asyncio.wait_for(together.wait(), 10)
    await second.close()


async def test_W11_an_idle_worker_stops_at_once(app: durq.App) -> None:
    """Stopping does not wait out the idle worker's wait (a 30 s poll here)."""
    loop = asyncio.get_running_loop()
    async with app.worker(poll_interval=30, promote_interval=30, rescue_interval=30):
        await asyncio.sleep(0.3)  # let the fetcher go idle
        stopping = loop.time()
    assert loop.time() - stopping < 10


async def test_W12_cancel_an_active_task(app: durq.App) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @app.task("slow:cancel")
    async def slow(payload: dict[str, Any]) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with app.worker(heartbeat_interval=0.1, **FAST):
        info = await slow.enqueue({})
        await asyncio.wait_for(started.wait(), 10)
        await app.inspector.cancel_task("default", info.id)
        archived = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED)
    assert cancelled.is_set() and archived.last_error == "cancelled"


async def test_hostile_payload_is_archived_and_the_queue_goes_on(app: durq.App) -> None:
    """A payload that does not fit the handler's model is archived, never retried blindly."""
    done = Counter[str]()

    @app.task("typed:job")
    async def typed(payload: Model) -> None:
        done["ok"] += 1

    # Bypass enqueue validation by using an untyped app on the same storage.
    raw = durq.App(app.broker_url)
    bad = await raw.enqueue("typed:job", {"y": "not a Model"})
    await raw.close()
    good = [await typed.enqueue(Model(x=i)) for i in range(5)]
    async with app.worker(**FAST):
        archived = await wait_for_state(app, "default", bad.id, TaskState.ARCHIVED)
        await wait_until(lambda: _async(done["ok"] == 5))
    assert archived.last_error is not None and "decode" in archived.last_error
    assert len(good) == 5


async def test_W4_huge_error_messages_are_clipped(app: durq.App) -> None:
    @app.task("flaky:huge", max_retry=0)
    async def huge(payload: dict[str, Any]) -> None:
        raise RuntimeError("x" * 100_000)

    async with app.worker(**FAST):
        info = await huge.enqueue({})
        archived = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED)
    assert archived.last_error is not None
    assert archived.last_error.startswith("RuntimeError: xxx")
    assert len(archived.last_error) <= 4096 and "100014 characters" in archived.last_error


async def test_W4_stored_traceback_starts_at_the_handler_not_in_durqs_executor(
    app: durq.App,
) -> None:
    """The executor, its thread pool and asyncio add frames above every handler; an operator
    reading the stored traceback wants the handler's own frames only."""

    def check(total: int) -> None:
        if total < 0:
            raise ValueError("negative total")

    @app.task("tb:sync", max_retry=0)
    def sync_handler(payload: dict[str, Any]) -> None:
        check(-1)

    @app.task("tb:async", max_retry=0)
    async def async_handler(payload: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        check(-1)

    async with app.worker(**FAST):
        ids = [(await sync_handler.enqueue({})).id, (await async_handler.enqueue({})).id]
        ended = [await wait_for_state(app, "default", i, TaskState.ARCHIVED) for i in ids]
    for info in ended:
        assert info.last_error == "ValueError: negative total"
        tb = info.traceback
        assert tb is not None and tb.rstrip().endswith("ValueError: negative total")
        files = [line.split('"')[1] for line in tb.splitlines() if line.startswith('  File "')]
        # The handler and the function it called, in this file, and nothing of durq's.
        assert files == [__file__, __file__], tb


async def test_W4_failed_attempts_store_a_bounded_traceback_with_its_chain(
    app: durq.App, caplog: pytest.LogCaptureFixture
) -> None:
    def policy(retried: int, exc: BaseException) -> float:
        return 0.05

    def parse_reply(body: str) -> None:
        raise KeyError("total")

    @app.task("chain:call", max_retry=2, retry_delay=policy)
    async def call(payload: dict[str, Any]) -> None:
        try:
            parse_reply("{}")
        except KeyError as exc:
            raise RuntimeError("partner reply unusable") from exc

    @app.task("chain:deep", max_retry=0)
    async def deep(payload: dict[str, Any]) -> None:
        def down(n: int) -> None:
            if n == 0:
                raise ValueError("x" * 50_000)
            down(n - 1)

        down(200)

    with caplog.at_level(logging.INFO, logger="durq"):
        async with app.worker(**FAST):
            info = await call.enqueue({})
            big = await deep.enqueue({})
            archived = await wait_for_state(app, "default", info.id, TaskState.ARCHIVED)
            huge = await wait_for_state(app, "default", big.id, TaskState.ARCHIVED)
    assert archived.last_error == "RuntimeError: partner reply unusable"
    tb = archived.traceback
    assert tb is not None
    assert "parse_reply" in tb and "KeyError: 'total'" in tb
    assert "direct cause of the following exception" in tb
    assert tb.rstrip().endswith("RuntimeError: partner reply unusable")
    # Bounded: the start and the end (the raising frame and the message) are kept.
    assert huge.traceback is not None
    assert len(huge.traceback) <= executor.MAX_TRACEBACK + 100
    assert "characters cut" in huge.traceback and huge.traceback.rstrip().endswith("x" * 100)
    # Logged with the traceback at the first failure and at the final one, not in between.
    retries = [r for r in caplog.records if "will retry" in r.getMessage()]
    assert [r.exc_info is not None for r in retries if info.id in r.getMessage()] == [True, False]
    (alert,) = [
        r for r in caplog.records if r.levelno == logging.ERROR and info.id in r.getMessage()
    ]
    assert alert.exc_info is not None
