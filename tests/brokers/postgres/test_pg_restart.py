"""Resilience: a real PostgreSQL stop/start while brokers are connected.

Opt-in (DURQ_TEST_PG_RESTART=1): it takes the shared local server down for a few seconds,
which would break any other test running at the same time."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import pytest

from durq import lifecycle
from durq.brokers.base import ClaimParams, EnqueueParams
from durq.errors import BrokerUnavailableError, TaskNotFoundError
from durq.states import TaskState

pytestmark = pytest.mark.skipif(
    os.environ.get("DURQ_TEST_PG_RESTART") != "1",
    reason="restarts the shared PostgreSQL server: set DURQ_TEST_PG_RESTART=1 to run",
)


def pg_ctl(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True,
        timeout=60,
    )


def task(task_id: str) -> EnqueueParams:
    return EnqueueParams(id=task_id, queue="default", type="t", payload=b"{}")


async def until_ok(call, seconds: float = 20.0):
    """Retry ``call`` while the broker is unavailable (what a worker's loop does)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await call()
        except BrokerUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_restart_costs_no_task(make_pg, clock) -> None:
    worker, client = await make_pg(), await make_pg()
    await client.enqueue(task("running"))
    (_running,) = await worker.claim(ClaimParams(["default"], 1, "w1", 30))
    await client.enqueue(task("queued"))
    assert await worker.wait_for_work(["default"], 5)  # the listener is up

    pg_ctl("stop")
    try:
        start = time.monotonic()
        with pytest.raises(BrokerUnavailableError) as caught:
            await client.enqueue(task("during"))
        assert caught.value.operation == "postgres.enqueue"
        with pytest.raises(BrokerUnavailableError):
            await worker.claim(ClaimParams(["default"], 1, "w1", 30))
        # A waiting worker is not hurt: its wait is bounded.
        assert isinstance(await worker.wait_for_work(["default"], 0.5), bool)
        outage_errors = time.monotonic() - start
        # A longer outage: every call still answers within the connect timeout.
        slowest = 0.0
        while time.monotonic() - start < 12:
            t0 = time.monotonic()
            with pytest.raises(BrokerUnavailableError):
                await client.enqueue(task("during"))
            slowest = max(slowest, time.monotonic() - t0)
            await asyncio.sleep(0.5)
    finally:
        pg_ctl("start")

    assert outage_errors < 15
    assert slowest < 7  # connect_timeout (5 s) plus slack
    # Both brokers reconnect on their own; nothing half-written from the outage.
    start = time.monotonic()
    await until_ok(lambda: client.enqueue(task("after")))
    print(
        f"first errors took {outage_errors:.2f}s, slowest error {slowest:.2f}s; "
        f"first enqueue after start: {time.monotonic() - start:.2f}s"
    )
    with pytest.raises(TaskNotFoundError):
        await client.admin.get_task("default", "during")

    # The lease of the task that was active recovers normally once it expires.
    clock.advance(31)
    rescued = await until_ok(lambda: lifecycle.rescue_expired(worker, 3))
    assert [t.id for t in rescued] == ["running"]
    assert rescued[0].state is TaskState.RETRY and rescued[0].last_error == "lease expired"
    leases = await until_ok(lambda: worker.claim(ClaimParams(["default"], 10, "w1", 30)))
    assert sorted(x.task.id for x in leases) == ["after", "queued", "running"]

    # The LISTEN connection came back too: a new enqueue wakes the worker promptly.
    deadline = time.monotonic() + 20
    while not worker._listener or not worker._listener.listening:
        assert time.monotonic() < deadline, "listener did not reconnect"
        await asyncio.sleep(0.1)
    await worker.claim(ClaimParams(["default"], 10, "w1", 30))
    wait = asyncio.create_task(worker.wait_for_work(["default"], 10))
    await asyncio.sleep(0.05)
    start = time.monotonic()
    await client.enqueue(task("woken"))
    assert await asyncio.wait_for(wait, 5)
    assert time.monotonic() - start < 1


async def test_restart_command_while_idle(make_pg) -> None:
    """``pg_ctlcluster … restart`` under a connected broker: the next calls recover."""
    broker = await make_pg()
    await broker.enqueue(task("a"))
    pg_ctl("restart")
    # The first call may see a dead pooled connection; the pool then replaces them.
    await until_ok(lambda: broker.enqueue(task("b")))
    assert (await broker.admin.get_task("default", "b")).state is TaskState.PENDING
    await broker.ping()
