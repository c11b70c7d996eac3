"""The one-machine brokers' clocks: leases on the monotonic clock (SQLite: of one boot), and
on SQLite delays that keep their length when the wall clock steps (FakeClock.step moves the
wall clock only). The same with real processes under libfaketime: tests/clocks."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durq.brokers.base import ClaimParams, EnqueueParams
from durq.brokers.sqlite import SQLiteBroker
from durq.brokers.sqlite.timeline import boot_id
from durq.clock import FakeClock
from durq.errors import TaskIDConflictError
from durq.states import TaskState


def task(task_id: str, queue: str = "q", **options: object) -> EnqueueParams:
    options.setdefault("payload", b"{}")
    return EnqueueParams(id=task_id, queue=queue, type="t", **options)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def connected(tmp_path: Path, clock: FakeClock) -> AsyncIterator[SQLiteBroker]:
    broker = SQLiteBroker(str(tmp_path / "d.sqlite3"), clock=clock)
    await broker.connect()
    try:
        yield broker
    finally:
        await broker.close()


async def claimed_ids(broker: SQLiteBroker) -> list[str]:
    return [lease.task.id for lease in await broker.claim(ClaimParams(["q"], 10, "w", 30))]


async def test_a_step_of_the_wall_clock_moves_delays_not_moments_and_expires_no_lease(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    async with connected(tmp_path, clock) as broker:
        t0 = clock.now()
        await broker.enqueue(task("held"))
        assert len(await broker.claim(ClaimParams(["q"], 1, "w", 30))) == 1
        await broker.enqueue(task("delay", process_in=60))
        await broker.enqueue(task("moment", process_at=t0 + 60))
        await broker.enqueue(task("unique", "u", unique_key="k", unique_ttl=60))

        clock.step(120)  # NTP puts the wall clock two minutes forward
        # The caller's moment has come; the delay still has its 60 s to go.
        assert await claimed_ids(broker) == ["moment"]
        assert await broker.expired_leases(10) == []
        delayed = await broker.admin.get_task("q", "delay")
        assert delayed and delayed.next_process_at
        assert delayed.next_process_at.timestamp() == t0 + 120 + 60
        with sqlite3.connect(tmp_path / "d.sqlite3") as db:
            (until,) = db.execute(
                "SELECT unique_until FROM durq_tasks WHERE id = 'unique'"
            ).fetchone()
        assert until == t0 + 120 + 60

        clock.advance(31)  # 30 s leases pass on the monotonic clock (both: held and moment)
        assert sorted(x.task.id for x in await broker.expired_leases(10)) == ["held", "moment"]
        clock.advance(30)
        assert await claimed_ids(broker) == ["delay"]


class _SteppingAfterTheNextRead(FakeClock):
    """A FakeClock whose wall clock steps right after its next reading: a moment read just
    before the machine's clock stepped."""

    def __init__(self) -> None:
        super().__init__()
        self._armed = 0.0

    def step_after_next_read(self, by: float) -> None:
        self._armed = by

    def now(self) -> float:
        now = super().now()
        if self._armed:
            by, self._armed = self._armed, 0.0
            self.step(by)
        return now


async def test_a_step_just_after_a_claim_looked_at_the_clock_runs_no_delay_early(
    tmp_path: Path,
) -> None:
    """The claim's own moment is read under the write lock, after the step is caught up
    with: a moment read before it would find the delays already moved back and due."""
    clock = _SteppingAfterTheNextRead()
    async with connected(tmp_path, clock) as broker:
        await broker.enqueue(task("ready"))
        await broker.enqueue(task("delay", process_in=4))
        clock.step_after_next_read(-120)  # the wall clock goes two minutes back
        assert await claimed_ids(broker) == ["ready"]
        clock.advance(3)
        assert await broker.claim(ClaimParams(["q"], 10, "w", 30)) == []
        clock.advance(1)
        assert await claimed_ids(broker) == ["delay"]


async def test_a_step_caught_up_with_in_a_rolled_back_transaction_is_caught_up_with_again(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    async with connected(tmp_path, clock) as broker:
        t0 = clock.now()
        await broker.enqueue(task("taken"))
        await broker.enqueue(task("delay", process_in=60))
        clock.step(120)
        # The first transaction to see the step fails: its shift of the delay is undone.
        with pytest.raises(TaskIDConflictError):
            await broker.enqueue(task("taken", payload=b'{"other": 1}'))
        # The next one shifts again: the delay still has its 60 s to go.
        assert await claimed_ids(broker) == ["taken"]
        delayed = await broker.admin.get_task("q", "delay")
        assert delayed.next_process_at and delayed.next_process_at.timestamp() == t0 + 180


async def test_an_enqueue_in_the_callers_transaction_catches_up_with_a_step(
    tmp_path: Path,
) -> None:
    """A web app that enqueues only in its own transactions moves the delays too, and its
    new task's delay counts from the stepped clock."""
    clock = FakeClock()
    path = tmp_path / "d.sqlite3"
    broker = SQLiteBroker(str(path), clock=clock)
    await broker.migrate()
    await broker.close()
    t0 = clock.now()
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("BEGIN IMMEDIATE")
        broker.enqueue_sync_in(task("before", process_in=60), db)
        db.execute("COMMIT")
        clock.step(-120)
        db.execute("BEGIN IMMEDIATE")
        broker.enqueue_sync_in(task("after", process_in=60), db)
        db.execute("COMMIT")
        due = dict(db.execute("SELECT id, next_process_at FROM durq_tasks").fetchall())
    assert due == {"before": t0 - 120 + 60, "after": t0 - 120 + 60}


async def test_a_lease_of_another_boot_has_expired(tmp_path: Path) -> None:
    clock = FakeClock()
    async with connected(tmp_path, clock) as broker:
        await broker.enqueue(task("held"))
        await broker.claim(ClaimParams(["q"], 1, "w", 300))
        with sqlite3.connect(tmp_path / "d.sqlite3") as db:
            db.execute("UPDATE durq_tasks SET lease_boot = 'a boot before this one'")
        (expired,) = await broker.expired_leases(10)
        assert expired.task.id == "held" and expired.task.state is TaskState.ACTIVE


def test_the_boot_id_is_read_from_the_kernel(tmp_path: Path) -> None:
    (tmp_path / "boot_id").write_text("2f7d\n")
    assert boot_id(tmp_path / "boot_id") == "2f7d"
    assert boot_id(tmp_path / "missing") is None


async def test_memory_leases_ignore_a_step_of_the_wall_clock_too() -> None:
    from durq.brokers.memory import MemoryBroker

    clock = FakeClock()
    broker = MemoryBroker("clock-step", clock=clock)
    await broker.connect()
    try:
        await broker.enqueue(task("held"))
        await broker.claim(ClaimParams(["q"], 1, "w", 30))
        clock.step(120)
        assert await broker.expired_leases(10) == []
        clock.advance(31)
        assert [x.task.id for x in await broker.expired_leases(10)] == ["held"]
    finally:
        await broker.close()
