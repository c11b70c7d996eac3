"""Finishing an attempt (W4-W6): complete, retry, archive, their results and counters."""

from __future__ import annotations

from datetime import UTC, datetime

from brokerkit import LATER, C, R, X, claim, claim_ids, params, picture, snapshot

from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import ArchiveParams, CompleteParams, RetryParams
from durq.clock import FakeClock


async def test_W6_result_is_stored_while_retained(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    clock.advance(2)
    assert await broker.complete(CompleteParams(lease.ref, b'{"ok":true,"n":3}', retention=60))
    info = await broker.admin.get_task("default", "t")
    assert info.state is C
    assert info.result == {"ok": True, "n": 3}
    assert info.completed_at == datetime.fromtimestamp(clock.now(), tz=UTC)
    assert info.retention == 60
    assert await snapshot(broker) == picture(completed="t")


async def test_W6_complete_without_result(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    assert await broker.complete(CompleteParams(lease.ref, None, retention=60))
    info = await broker.admin.get_task("default", "t")
    assert info.raw_result is None and info.result is None


async def test_E5_complete_with_zero_retention_deletes(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    assert await broker.complete(CompleteParams(lease.ref, b'"x"', retention=0))
    assert await snapshot(broker) == {}


async def test_complete_many_in_one_call(broker: FullBroker, clock: FakeClock) -> None:
    for i in range(4):
        await broker.enqueue(params(f"t{i}"))
    leases = await claim(broker, limit=4)
    outcomes = await broker.complete_many(
        [
            CompleteParams(leases[0].ref, b"1", retention=60),
            CompleteParams(leases[1].ref),
            CompleteParams(leases[0].ref, b"again", retention=60),  # already done: False
            CompleteParams(leases[2].ref, b"2", retention=60),
        ]
    )
    assert outcomes == [True, True, False, True]
    assert await snapshot(broker) == picture(completed="t0 t2", active="t3")
    assert (await broker.admin.get_task("default", "t0")).result == 1
    assert await broker.complete_many([]) == []


async def test_W4_retry_waits_for_its_time(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t", max_retry=3))
    (lease,) = await claim(broker)
    assert await broker.retry(RetryParams(lease.ref, "boom: ValueError", 30))
    info = await broker.admin.get_task("default", "t")
    assert info.state is R
    assert info.retried == 1 and info.last_error == "boom: ValueError"
    assert info.next_process_at == datetime.fromtimestamp(clock.now() + 30, tz=UTC)
    assert await claim_ids(broker) == []
    clock.advance(30)
    (again,) = await claim(broker)
    assert again.task.id == "t" and again.task.retried == 1
    assert again.task.last_error == "boom: ValueError"


async def test_W4_archive_counts_the_attempt(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t", max_retry=0))
    (lease,) = await claim(broker)
    assert await broker.archive(ArchiveParams(lease.ref, "gave up"))
    info = await broker.admin.get_task("default", "t")
    assert info.state is X and info.retried == 1 and info.last_error == "gave up"
    assert await claim_ids(broker) == []


async def test_W12_archive_without_counting(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    assert await broker.archive(ArchiveParams(lease.ref, "cancelled", count_attempt=False))
    info = await broker.admin.get_task("default", "t")
    assert info.state is X and info.retried == 0 and info.last_error == "cancelled"


async def test_I1_counters_per_outcome(broker: FullBroker, clock: FakeClock) -> None:
    for i in range(6):
        await broker.enqueue(params(f"t{i}", max_retry=5))
    done, retried, archived, silent, lost, requeued = await claim(broker, limit=6)
    assert await broker.complete(CompleteParams(done.ref))  # processed
    assert await broker.retry(RetryParams(retried.ref, "e", LATER))  # both
    assert await broker.archive(ArchiveParams(archived.ref, "e"))  # both
    assert await broker.archive(ArchiveParams(silent.ref, "cancelled", count_attempt=False))
    assert await broker.requeue(requeued.ref)  # neither
    clock.advance(3600)
    assert [t.id for t in await lifecycle.rescue_expired(broker, 3)] == [lost.task.id]  # both
    stats = await broker.admin.queue_stats("default")
    assert (stats.processed_today, stats.failed_today) == (4, 3)
    assert (stats.processed_total, stats.failed_total) == (4, 3)
    (listed,) = [q for q in await broker.admin.list_queues() if q.name == "default"]
    assert listed.processed_total == 4


async def test_I1_today_counters_follow_the_utc_day(broker: FullBroker, clock: FakeClock) -> None:
    day = 86400
    clock.set((clock.now() // day) * day + day - 10)  # 10 s before midnight UTC
    for i in range(3):
        await broker.enqueue(params(f"t{i}", max_retry=5))
    a, b, c = await claim(broker, limit=3)
    assert await broker.complete(CompleteParams(a.ref))
    assert await broker.retry(RetryParams(b.ref, "e", LATER))
    clock.advance(20)  # the next UTC day
    assert await broker.complete(CompleteParams(c.ref))
    stats = await broker.admin.queue_stats("default")
    assert (stats.processed_today, stats.failed_today) == (1, 0)
    assert (stats.processed_total, stats.failed_total) == (3, 1)
