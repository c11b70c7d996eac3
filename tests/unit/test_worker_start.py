"""A worker started before its broker is reachable waits for it (``wait_for_broker``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import durq


async def test_worker_waits_for_the_broker_then_runs(tmp_path: Path) -> None:
    home = tmp_path / "not-yet"
    app = durq.App(f"sqlite:///{home / 'durq.sqlite3'}")
    ran = asyncio.Event()

    @app.task("t:job")
    async def job(payload: dict[str, int]) -> None:
        ran.set()

    worker = app.worker(poll_interval=0.05)
    running = asyncio.create_task(worker.run(install_signal_handlers=False, wait_for_broker=30))
    await asyncio.sleep(0.8)  # at least one failed attempt
    assert not running.done()
    home.mkdir()  # the broker becomes reachable
    await job.enqueue({})
    await asyncio.wait_for(ran.wait(), 15)
    await worker.stop()
    await running
    await app.close()


async def test_worker_without_patience_fails_at_once(tmp_path: Path) -> None:
    app = durq.App(f"sqlite:///{tmp_path / 'missing' / 'durq.sqlite3'}")
    worker = app.worker()
    with pytest.raises(durq.BrokerUnavailableError):
        await asyncio.wait_for(worker.run(install_signal_handlers=False), 10)


async def test_a_second_stop_waits_for_the_first(tmp_path: Path) -> None:
    # A lifespan exit racing a signal's stop: each caller returns once the worker is stopped.
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    started, finish = asyncio.Event(), asyncio.Event()

    @app.task("t:slow")
    async def slow(payload: dict[str, int]) -> None:
        started.set()
        await finish.wait()

    worker = app.worker(poll_interval=0.05, shutdown_timeout=5)
    await worker.start()
    await slow.enqueue({})
    await asyncio.wait_for(started.wait(), 10)
    first = asyncio.create_task(worker.stop())
    await asyncio.sleep(0.05)
    second = asyncio.create_task(worker.stop())
    await asyncio.sleep(0.1)
    assert not second.done(), "stop() returned while the first stop was still draining"
    finish.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    await app.close()


async def test_sigterm_while_starting_stops_the_worker_once_started(tmp_path: Path) -> None:
    import os
    import signal

    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    worker = app.worker(poll_interval=0.05)
    start = worker.start

    async def start_while_signalled() -> None:
        # run() has installed its handlers by now; the signal lands while start() connects.
        os.kill(os.getpid(), signal.SIGTERM)
        await start()

    worker.start = start_while_signalled  # type: ignore[method-assign]
    await asyncio.wait_for(worker.run(), 10)
    assert worker._stopped.is_set()
    assert all(not t.get_name().startswith("durq-") for t in asyncio.all_tasks() if not t.done()), (
        "no worker service may outlive run()"
    )
    await app.close()


def test_a_worker_listens_to_its_tasks_queues_not_to_durq_s_own(tmp_path: Path) -> None:
    """Every app registers the node that ends a ``ctx.run_workflow`` wait (in the waiting
    task's queue): a worker without ``queues=`` still listens to its own tasks' queues only."""
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")

    @app.task("mail:send", queue="emails")
    async def send(payload: dict[str, int]) -> None: ...

    assert list(app.worker().queues) == ["emails"]
    assert list(durq.App(f"sqlite:///{tmp_path / 'b.sqlite3'}").worker().queues) == ["default"]
