"""A busy database: every write waits for the write lock within the broker's budget, and an
exhausted budget is a typed BrokerUnavailableError with nothing written.

Only SQLite has one database-wide write lock that another connection can hold (PostgreSQL
locks rows, Redis runs one script at a time), so the other brokers are skipped by name."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from brokerkit import LATER, LEASE, P, claim, params, picture, put, snapshot

from durq.brokers import FullBroker, open_broker
from durq.brokers.base import (
    Claimed,
    ClaimParams,
    CompleteParams,
    LeaseRef,
    RetryParams,
    WorkerInfo,
)
from durq.clock import FakeClock
from durq.errors import BrokerUnavailableError, TaskNotFoundError
from durq.states import TaskState
from durq.task import LimitSpec

#: The writes of every path that touches the file: enqueue, claim, acknowledge, the
#: rescuer, the janitor, the promoter, the heartbeat and the inspector's admin calls.
WRITES: dict[str, Callable[[FullBroker], Awaitable[Any]]] = {
    "enqueue": lambda b: b.enqueue(params("new")),
    "enqueue_many": lambda b: b.enqueue_many([params("new1"), params("new2")]),
    "claim": lambda b: b.claim(ClaimParams(["default"], 1, "w-1", LEASE)),
    # The rescuer's write (its read of expired leases takes no lock).
    "move_leases": lambda b: b.move_leases([RetryParams(LeaseRef("default", "p1", "x"), "e", 0)]),
    "delete_expired": lambda b: b.delete_expired(100),
    "promote_due": lambda b: b.promote_due(),
    "register_worker": lambda b: b.register_worker(
        WorkerInfo("w-1", "host", 1, {"default": 1}, 1, 0.0)
    ),
    "pause_queue": lambda b: b.admin.pause_queue("default"),
    "move_all": lambda b: b.admin.move_all("default", TaskState.PENDING, None),
}


def sqlite_path(broker_url: str) -> str:
    if not broker_url.startswith("sqlite:"):
        pytest.skip("only SQLite has a database-wide write lock another connection can hold")
    return broker_url.removeprefix("sqlite:///")


@contextmanager
def write_lock_held(path: str) -> Iterator[Callable[[], None]]:
    """Another connection holds the write lock until the returned ``release`` is called."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    released = threading.Lock()

    def release() -> None:
        with released:
            if other.in_transaction:
                other.execute("ROLLBACK")

    try:
        yield release
    finally:
        release()
        other.close()


@contextlib.asynccontextmanager
async def with_budget(broker_url: str, clock: FakeClock, seconds: float) -> AsyncIterator[Any]:
    """Another broker on the same file whose writes wait ``seconds`` for the lock."""
    other = open_broker(f"{broker_url}?busy_timeout={seconds}", clock=clock)
    await other.connect()
    try:
        yield other
    finally:
        await other.close()


@contextmanager
def released_soon(path: str) -> Iterator[None]:
    """Another connection holds the write lock and releases it 0.2 s later."""
    with write_lock_held(path) as release:
        timer = threading.Timer(0.2, release)
        timer.start()
        try:
            yield
        finally:
            timer.join()


@pytest.fixture
async def path(broker: FullBroker, broker_url: str, clock: FakeClock) -> str:
    """The SQLite file, holding one pending task ``p1``."""
    file = sqlite_path(broker_url)
    await put(broker, clock, {"p1": P})
    return file


@pytest.mark.parametrize("operation", sorted(WRITES))
async def test_write_beyond_the_budget_is_broker_unavailable_and_writes_nothing(
    broker: FullBroker, broker_url: str, clock: FakeClock, path: str, operation: str
) -> None:
    async with with_budget(broker_url, clock, 0.2) as impatient:
        with write_lock_held(path), pytest.raises(BrokerUnavailableError) as caught:
            await WRITES[operation](impatient)
    assert caught.value.operation is not None and "sqlite" in caught.value.operation
    assert "write lock" in str(caught.value)
    assert await snapshot(broker) == picture(pending="p1")


@pytest.mark.parametrize("operation", sorted(WRITES))
async def test_write_below_the_budget_waits_for_the_lock(
    broker_url: str, clock: FakeClock, path: str, operation: str
) -> None:
    async with with_budget(broker_url, clock, 30.0) as patient:
        with released_soon(path):
            await WRITES[operation](patient)  # waits, then succeeds


async def test_acknowledge_waits_for_the_lock_and_beyond_the_budget_keeps_the_lease(
    broker: FullBroker, broker_url: str, clock: FakeClock
) -> None:
    path = sqlite_path(broker_url)
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    done = CompleteParams(lease.ref, b'"ok"', LATER)
    async with with_budget(broker_url, clock, 0.2) as impatient:
        with write_lock_held(path), pytest.raises(BrokerUnavailableError):
            await impatient.complete(done)
    assert await snapshot(broker) == picture(active="t")
    async with with_budget(broker_url, clock, 30.0) as patient:
        with released_soon(path):
            assert await patient.complete(done)
    assert await snapshot(broker) == picture(completed="t")


@pytest.mark.parametrize("budget", [0.2, 30.0])
async def test_enqueue_on_the_callers_connection_waits_within_the_callers_budget(
    broker: FullBroker, broker_url: str, budget: float
) -> None:
    path = sqlite_path(broker_url)
    caller = sqlite3.connect(path, timeout=budget, isolation_level=None, check_same_thread=False)
    try:
        if budget < 1:
            with write_lock_held(path):
                caller.execute("BEGIN")  # deferred: the insert asks for the write lock
                with pytest.raises(BrokerUnavailableError):
                    await broker.enqueue(params("joined"), connection=caller)
                caller.execute("ROLLBACK")
        else:
            with released_soon(path):
                caller.execute("BEGIN")
                await broker.enqueue(params("joined"), connection=caller)  # waits
                caller.execute("COMMIT")
    finally:
        caller.close()
    if budget < 1:
        with pytest.raises(TaskNotFoundError):
            await broker.admin.get_task("default", "joined")
    else:
        assert (await broker.admin.get_task("default", "joined")).state is P


async def test_a_claim_with_only_tasks_held_on_full_keys_takes_no_write_lock(
    broker: FullBroker, broker_url: str, clock: FakeClock
) -> None:
    """Idle workers poll while tasks wait on a full key: they read the counters and leave
    the write lock to the writers, until an attempt ends and a slot is free."""
    path = sqlite_path(broker_url)
    for task_id, limit in (
        ("k0", LimitSpec("k", concurrency=1)),
        ("k1", LimitSpec("k", concurrency=1)),
        ("r0", LimitSpec("r", rate=1, per=10.0)),
        ("r1", LimitSpec("r", rate=1, per=10.0)),
    ):
        await broker.enqueue(params(task_id, limits=(limit,)))
        clock.advance(0.001)
    first = await claim(broker, limit=10)
    assert sorted(lease.task.id for lease in first) == ["k0", "r0"]
    async with with_budget(broker_url, clock, 0.2) as impatient:
        with write_lock_held(path):
            polled = await impatient.claim(ClaimParams(["default"], 10, "w-2", LEASE))
        assert polled == []
        # The rate-limited key says when its next token comes.
        assert isinstance(polled, Claimed) and polled.wake_at is not None
        assert clock.now() < polled.wake_at <= clock.now() + 10
        k0 = next(lease for lease in first if lease.task.id == "k0")
        assert await broker.complete(CompleteParams(k0.ref))
        with write_lock_held(path), pytest.raises(BrokerUnavailableError):
            # A free slot: the claim must write to let k1 back.
            await impatient.claim(ClaimParams(["default"], 10, "w-2", LEASE))
        assert [lease.task.id for lease in await claim(impatient, limit=10)] == ["k1"]
