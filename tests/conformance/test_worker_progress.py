"""``ctx.progress`` and ``ctx.log`` in real handlers on every broker: visible while the
attempt runs, the last report flushed when it ends, logs kept across attempts."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import durq
from conformance.apps import FAST, wait_for_state, wait_until
from durq.brokers.base import ProgressParams
from durq.brokers.memory.broker import MemoryBroker
from durq.clock import SYSTEM_CLOCK
from durq.errors import BrokerUnavailableError
from durq.progress import MAX_LOG_LINES
from durq.states import TaskState
from durq.worker.reports import AttemptReports, LazyReports


async def test_W14_progress_shows_while_an_async_handler_runs(app: durq.App) -> None:
    release = asyncio.Event()

    @app.task("report:async", retention=60)
    async def job(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        ctx.log("started")
        ctx.progress(0.4, "rows 400/1000")
        await release.wait()
        ctx.progress(1.0, "rows 1000/1000")
        ctx.log("done", level="warning")
        return "ok"

    info = await app.enqueue("report:async", {})
    async with app.worker(**FAST):

        async def reported() -> bool:
            seen = await app.inspector.get_task_info("default", info.id)
            return seen.progress is not None and seen.state is TaskState.ACTIVE

        await wait_until(reported)
        running = await app.inspector.get_task_info("default", info.id)
        assert running.progress is not None
        assert (running.progress.fraction, running.progress.message) == (0.4, "rows 400/1000")
        assert [line.message for line in running.logs] == ["started"]
        release.set()
        done = await wait_for_state(app, "default", info.id, TaskState.COMPLETED)
    # The last report, made just before returning, is written before the completion.
    assert done.progress is not None and done.progress.message == "rows 1000/1000"
    assert [(x.level, x.message) for x in done.logs] == [("info", "started"), ("warning", "done")]


async def test_W14_a_sync_handler_reports_from_its_thread_and_logs_are_bounded(
    app: durq.App,
) -> None:
    @app.task("report:sync", retention=60)
    def job(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        assert threading.current_thread() is not threading.main_thread()
        for i in range(80):
            ctx.log(f"row {i}")
            ctx.progress((i + 1) / 80)

    info = await app.enqueue("report:sync", {})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.COMPLETED)
    assert done.progress is not None and done.progress.fraction == 1.0
    assert [x.message for x in done.logs] == [f"row {i}" for i in range(80 - MAX_LOG_LINES, 80)]


async def test_W14_logs_are_kept_across_attempts(app: durq.App) -> None:
    @app.task("report:flaky", retention=60, max_retry=2, retry_delay=lambda n, e: 0.0)
    async def job(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        ctx.log(f"attempt {ctx.attempt}")
        if ctx.attempt == 1:
            ctx.progress(0.8, "almost")
            raise RuntimeError("first attempt fails")
        return "ok"

    info = await app.enqueue("report:flaky", {})
    async with app.worker(**FAST):
        done = await wait_for_state(app, "default", info.id, TaskState.COMPLETED)
    assert [(x.attempt, x.message) for x in done.logs] == [(1, "attempt 1"), (2, "attempt 2")]
    # The second attempt reported no progress: its first write cleared the first one's.
    assert done.progress is None


def test_W14_bad_reports_are_refused_in_the_handler() -> None:
    ctx = durq.TaskContext("t", "q", "x", 0, 0, None, {}, "w")
    for bad in (-0.1, 1.5, float("nan"), "half", True):
        with pytest.raises(ValueError, match="progress"):
            ctx.progress(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="log level"):
        ctx.log("x", level="loud")
    ctx.progress(0.5)  # outside a worker: accepted and dropped
    ctx.log("x")


class CountingBroker(MemoryBroker):
    """A real memory broker that counts progress writes."""

    writes = 0

    async def report_progress(self, params: ProgressParams) -> bool:
        self.writes += 1
        return await super().report_progress(params)


async def test_W14_reports_are_coalesced_into_few_writes() -> None:
    from brokerkit import claim, params

    broker = CountingBroker("coalesce-test")
    await broker.connect()
    try:
        await broker.enqueue(params("t"))
        (lease,) = await claim(broker)
        reports = AttemptReports(broker, lease.ref, 1, SYSTEM_CLOCK, asyncio.get_running_loop())
        for i in range(500):  # a tight loop: no await, so no write can happen meanwhile
            reports.log("info", f"line {i}")
            reports.progress(i / 500, None)
        await reports.close()
        assert broker.writes == 1
        info = await broker.admin.get_task("default", "t")
        assert len(info.logs) == MAX_LOG_LINES and info.logs[-1].message == "line 499"
        # Closed: later reports (a sync handler still running after a timeout) are dropped.
        reports.log("info", "too late")
        await asyncio.sleep(0)
        assert broker.writes == 1
    finally:
        await broker.close()


class FlakyBroker(CountingBroker):
    """Unreachable for the next ``failures`` progress writes."""

    failures = 1

    async def report_progress(self, params: ProgressParams) -> bool:
        if self.failures:
            self.failures -= 1
            self.writes += 1
            raise BrokerUnavailableError("down for a moment", operation="memory.progress")
        return await super().report_progress(params)


async def test_W14_reports_are_written_again_after_an_outage() -> None:
    from brokerkit import claim, params

    broker = FlakyBroker("flaky-progress-test")
    await broker.connect()
    try:
        await broker.enqueue(params("t"))
        (lease,) = await claim(broker)
        loop = asyncio.get_running_loop()
        reports = AttemptReports(broker, lease.ref, 1, SYSTEM_CLOCK, loop, interval=0.01)
        reports.log("info", "kept through the outage")
        reports.progress(0.5, None)

        async def stored() -> bool:
            return len((await broker.admin.get_task("default", "t")).logs) == 1

        # Written by the coalescing loop itself, not only at the attempt's end.
        await wait_until(stored)
        assert broker.writes == 2
        await reports.close()
        info = await broker.admin.get_task("default", "t")
        assert [x.message for x in info.logs] == ["kept through the outage"]
        assert info.progress is not None and info.progress.fraction == 0.5
    finally:
        await broker.close()


async def test_W14_a_context_that_never_reports_builds_no_writer() -> None:
    """The writer (its locks, event and task) is built on the first report only; a report
    after the attempt ended is dropped, whether the writer was built or not."""
    from brokerkit import claim, params

    broker = CountingBroker("lazy-reports-test")
    await broker.connect()
    try:
        await broker.enqueue(params("t"))
        (lease,) = await claim(broker)
        loop = asyncio.get_running_loop()
        built: list[AttemptReports] = []

        def build() -> AttemptReports:
            built.append(AttemptReports(broker, lease.ref, 1, SYSTEM_CLOCK, loop))
            return built[-1]

        silent = LazyReports(build)
        await silent.close()
        silent.progress(0.5, None)
        assert built == [] and broker.writes == 0

        reports = LazyReports(build)
        await asyncio.to_thread(reports.log, "info", "from a handler's thread")
        reports.progress(0.25, None)
        await reports.close()
        reports.log("info", "too late")
        await asyncio.sleep(0)
        assert len(built) == 1 and broker.writes in (1, 2)  # the writer may run meanwhile
        info = await broker.admin.get_task("default", "t")
        assert [x.message for x in info.logs] == ["from a handler's thread"]
        assert info.progress is not None and info.progress.fraction == 0.25
    finally:
        await broker.close()
