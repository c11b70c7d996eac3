"""A worker inside a web process gives way to the requests: while the event loop it shares is
late, it starts nothing new, and a hold never lasts past its bound.

The "requests" here are a coroutine that keeps the loop busy (blocking 30 ms at a time, as a
burst of CPU-bound request handling does); the broker is a real SQLite file."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette

import durq
from durq.errors import ConfigurationError
from durq.web.asgi import STATE_WORKER, durq_lifespan
from durq.worker.courtesy import LoopCourtesy

TASKS = 5


async def busy_loop(seconds: float) -> float:
    """Keep the loop late for ``seconds`` (other tasks run only between 30 ms blocks);
    the monotonic time it ended."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.03)
        await asyncio.sleep(0)
    return time.monotonic()


def make_app(tmp_path: Path, started: list[float]) -> durq.App:
    app = durq.App(f"sqlite:///{tmp_path / 'q.sqlite3'}")

    @app.task("work:note")
    async def note(payload: dict[str, Any]) -> None:
        started.append(time.monotonic())

    return app


async def run_during_a_burst(tmp_path: Path, yield_to_requests: bool | float) -> list[float]:
    """Enqueue while the loop is busy: how long after the burst's end each task started
    (negative: during it)."""
    started: list[float] = []
    app = make_app(tmp_path, started)
    async with app:
        worker = app.worker(poll_interval=0.05, yield_to_requests=yield_to_requests)
        await worker.start()
        try:
            burst = asyncio.create_task(busy_loop(1.5))
            await asyncio.sleep(0.2)  # the loop is late by now
            for i in range(TASKS):
                await app.enqueue("work:note", {"i": i})
            ended = await burst
            for _ in range(600):
                if len(started) == TASKS:
                    break
                await asyncio.sleep(0.05)
        finally:
            await worker.stop()
    assert len(started) == TASKS, "every task still runs"
    return [at - ended for at in started]


async def test_a_worker_that_yields_starts_nothing_while_the_loop_is_late(
    tmp_path: Path,
) -> None:
    after_burst = await run_during_a_burst(tmp_path, yield_to_requests=0.005)
    assert min(after_burst) >= 0, after_burst


async def test_without_yielding_tasks_start_during_the_burst(tmp_path: Path) -> None:
    """The other side of the test above: the same burst, a worker that does not yield."""
    after_burst = await run_during_a_burst(tmp_path, yield_to_requests=False)
    assert min(after_burst) < 0, after_burst


async def calm_again(courtesy: LoopCourtesy) -> None:
    """Wait (up to 5 s) for the courtesy to let claims go again."""
    for _ in range(100):
        if not courtesy.busy:
            break
        await asyncio.sleep(0.05)
    assert not courtesy.busy


async def test_a_hold_ends_after_max_pause_even_if_the_loop_stays_late() -> None:
    """A server that is never idle still runs its tasks."""
    courtesy = LoopCourtesy(0.005, max_pause=0.3)
    courtesy.start()
    try:
        burst = asyncio.create_task(busy_loop(2.0))
        await asyncio.sleep(0.2)
        assert courtesy.busy
        await courtesy.wait(asyncio.Event())
        returned = time.monotonic()
        ended = await burst
        assert returned < ended
        assert courtesy.holds == 1 and courtesy.held_seconds > 0
        await calm_again(courtesy)  # on time again a few samples after the burst
    finally:
        await courtesy.stop()


async def test_a_loop_kept_busy_by_short_steps_holds_claims_though_it_is_never_late() -> None:
    """Many short requests keep the loop busy without making any one wake-up late: the share
    of the time the loop's thread runs (or waits for a core) says so. The lag bound here is
    far out of reach, so only that share can hold the claims."""
    courtesy = LoopCourtesy(0.5)
    courtesy.start()
    try:
        end = time.monotonic() + 1.0
        seen_busy = False
        while time.monotonic() < end and not seen_busy:
            step = time.monotonic() + 0.001
            while time.monotonic() < step:  # a millisecond of a request's CPU
                pass
            await asyncio.sleep(0)
            seen_busy = courtesy.busy
        assert seen_busy, f"busy share {courtesy.busy_share:.2f}, lag {courtesy.last_lag:.3f}"
        await calm_again(courtesy)  # idle: claims resume
    finally:
        await courtesy.stop()


async def test_the_web_lifespan_turns_it_on_unless_told_otherwise(tmp_path: Path) -> None:
    for worker, lag in (
        (True, 0.010),
        ({"concurrency": 2}, 0.010),
        ({"yield_to_requests": 0.05}, 0.05),
        ({"yield_to_requests": False}, None),
    ):
        app = make_app(tmp_path, [])
        web = Starlette()
        async with durq_lifespan(app, worker=worker)(web):
            assert getattr(web.state, STATE_WORKER).yield_lag == lag


@pytest.mark.parametrize("value", [0, -1, "soon", 5, "2s"])
def test_a_bad_lag_is_a_configuration_error(tmp_path: Path, value: object) -> None:
    app = make_app(tmp_path, [])
    with pytest.raises(ConfigurationError):
        app.worker(yield_to_requests=value)  # type: ignore[arg-type]
