"""The one-machine brokers' clocks: leases on the monotonic clock (SQLite: of one boot), and
on SQLite delays that keep their length when the wall clock steps (FakeClock.step moves the
wall clock only). The same with real processes under libfaketime: tests/clocks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from durq.brokers.base import ClaimParams, EnqueueParams
from durq.brokers.sqlite import SQLiteBroker
from durq.brokers.sqlite.timeline import boot_id
from durq.clock import FakeClock
from durq.states import TaskState


def task(task_id: str, queue: str = "q", **options: object) -> EnqueueParams:
    return EnqueueParams(id=task_id, queue=queue, type="t", payload=b"{}", **options)  # type: ignore[arg-type]


async def test_a_step_of_the_wall_clock_moves_delays_not_moments_and_expires_no_lease(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    broker = SQLiteBroker(str(tmp_path / "d.sqlite3"), clock=clock)
    await broker.connect()
    try:
        t0 = clock.now()
        await broker.enqueue(task("held"))
        assert len(await broker.claim(ClaimParams(["q"], 1, "w", 30))) == 1
        await broker.enqueue(task("delay", process_in=60))
        await broker.enqueue(task("moment", process_at=t0 + 60))
        await broker.enqueue(task("unique", "u", unique_key="k", unique_ttl=60))

        clock.step(120)  # NTP puts the wall clock two minutes forward
        claimed = await broker.claim(ClaimParams(["q"], 10, "w", 30))
        # The caller's moment has come; the delay still has its 60 s to go.
        assert [lease.task.id for lease in claimed] == ["moment"]
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
        assert [x.task.id for x in await broker.claim(ClaimParams(["q"], 10, "w", 30))] == ["delay"]
    finally:
        await broker.close()


async def test_a_lease_of_another_boot_has_expired(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = SQLiteBroker(str(tmp_path / "d.sqlite3"), clock=clock)
    await broker.connect()
    try:
        await broker.enqueue(task("held"))
        await broker.claim(ClaimParams(["q"], 1, "w", 300))
        with sqlite3.connect(tmp_path / "d.sqlite3") as db:
            db.execute("UPDATE durq_tasks SET lease_boot = 'a boot before this one'")
        (expired,) = await broker.expired_leases(10)
        assert expired.task.id == "held" and expired.task.state is TaskState.ACTIVE
    finally:
        await broker.close()


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
