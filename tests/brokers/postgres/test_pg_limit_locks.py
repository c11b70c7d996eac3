"""Concurrent claims of limited tasks on PostgreSQL never wait for each other's counters, so
they cannot deadlock: a claim skips a counter another transaction holds and leaves the tasks
that need it pending for the next claim."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from durq.brokers.base import ClaimParams, CompleteParams, EnqueueParams
from durq.brokers.postgres import PostgresBroker
from durq.brokers.postgres import broker as pg_broker
from durq.clock import FakeClock
from durq.task import LimitSpec


def limited(task_id: str, *limits: LimitSpec) -> EnqueueParams:
    return EnqueueParams(id=task_id, queue="default", type="t", payload=b"{}", limits=limits)


def claim_params(limit: int = 1, worker: str = "w") -> ClaimParams:
    return ClaimParams(["default"], limit, worker, 30)


A = LimitSpec("a", concurrency=5)
W = LimitSpec("w", concurrency=1)


async def test_a_claim_skips_a_counter_another_claim_holds(
    make_pg, pg_url: str, clock: FakeClock, monkeypatch, caplog
) -> None:
    """Claim one locks the counter of key w (it has a held task and room), then, before it
    locks key a (another key of that held task), claim two starts on a task due on a and w.
    Locking a and waiting for w, claim two would close a cycle with claim one (a deadlock,
    one of them rolled back after a second). It skips w instead, leaves its task pending and
    finishes at once; claim one then takes the held task."""
    caplog.set_level(logging.DEBUG, logger="durq.brokers.postgres")
    broker = await make_pg()
    await broker.enqueue_many([limited("first", A, W), limited("held", A, W)])
    (first,) = await broker.claim(claim_params(2))
    assert (await broker.admin.get_task("default", "held")).held_by == "w"
    assert await broker.complete(CompleteParams(first.ref))  # w: room, a task held on it

    other: dict[str, object] = {}

    def claim_two() -> None:
        async def run() -> None:
            two = PostgresBroker.from_url(pg_url, clock=clock)
            await two.connect()
            try:
                await two.enqueue_many([limited("late", A, W)])
                started = time.monotonic()
                other["leases"] = await two.claim(claim_params(worker="two"))
                other["seconds"] = time.monotonic() - started
            finally:
                await two.close()

        asyncio.run(run())

    missing = pg_broker._Admission.missing
    calls: list[threading.Thread] = []

    def between_steps(self: pg_broker._Admission) -> list[tuple[str, str]]:
        # Claim one, between its two round trips (w locked, a not yet): claim two runs.
        if not calls and threading.current_thread() is threading.main_thread():
            thread = threading.Thread(target=claim_two)
            calls.append(thread)
            thread.start()
            thread.join(3.0)
        return missing(self)

    monkeypatch.setattr(pg_broker._Admission, "missing", between_steps)
    leases = await broker.claim(claim_params(worker="one"))
    calls[0].join(10.0)
    assert not calls[0].is_alive()
    deadlocks = [r for r in caplog.records if "deadlock" in r.getMessage()]
    assert deadlocks == []
    assert other["leases"] == []  # its task needs w, which claim one held
    # It never waited (waiting, it would have stood still as long as claim one: 3 s).
    assert isinstance(other["seconds"], float) and other["seconds"] < 2.0
    assert [lease.task.id for lease in leases] == ["held"]
    late = await broker.admin.get_task("default", "late")
    assert late.state == "pending" and late.held_by is None  # left for the next claim
    assert await broker.claim(claim_params()) == []  # w is full now: late is held on it
    assert (await broker.admin.get_task("default", "late")).held_by == "w"
