"""Leases and fencing (W1, W12): heartbeats, lost leases, stale tokens changing nothing."""

from __future__ import annotations

from brokerkit import LEASE, A, P, claim, claim_ids, params, picture, snapshot

from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import ArchiveParams, CompleteParams, LeaseRef, RetryParams
from durq.clock import FakeClock


async def test_W1_extend_leases_keeps_a_long_task(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("long"))
    (lease,) = await claim(broker, lease=LEASE)
    for _ in range(4):  # 4 x 20 s: well past the original 30 s lease
        clock.advance(20)
        report = await broker.extend_leases([lease.ref], LEASE)
        assert report.lost == frozenset() and report.cancel == frozenset()
        assert await lifecycle.rescue_expired(broker, 3) == []
    assert await snapshot(broker) == picture(active="long")
    assert await broker.complete(CompleteParams(lease.ref))
    assert await snapshot(broker) == {}


async def test_W1_extend_leases_reports_lost_leases(broker: FullBroker, clock: FakeClock) -> None:
    for i in range(3):
        await broker.enqueue(params(f"t{i}"))
    held, gone, finished = await claim(broker, limit=3)
    clock.advance(LEASE - 10)
    await broker.extend_leases([held.ref], LEASE)  # only this one keeps heartbeating
    clock.advance(11)
    rescued = await lifecycle.rescue_expired(broker, 3)
    assert sorted(t.id for t in rescued) == ["t1", "t2"]
    report = await broker.extend_leases(
        [held.ref, gone.ref, finished.ref, LeaseRef("default", "nope", "x")], LEASE
    )
    assert report.lost == {"t1", "t2", "nope"}
    assert report.cancel == frozenset()


async def test_W1_extend_leases_with_a_wrong_token_is_lost(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("t"))
    await claim(broker)
    report = await broker.extend_leases([LeaseRef("default", "t", "not-the-token")], LEASE)
    assert report.lost == {"t"}
    clock.advance(LEASE + 1)  # the wrong token did not extend the real lease
    assert [t.id for t in await lifecycle.rescue_expired(broker, 3)] == ["t"]


async def test_W12_extend_leases_reports_cancel(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("a"))
    await broker.enqueue(params("b"))
    a, b = await claim(broker, limit=2)
    info = await lifecycle.cancel_task(broker.admin, "default", "a")
    assert info.state is A and info.cancel_requested
    report = await broker.extend_leases([a.ref, b.ref], LEASE)
    assert report.cancel == {"a"} and report.lost == frozenset()


async def test_W1_fencing_stale_token_changes_nothing(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t", max_retry=5))
    (first,) = await claim(broker, worker="zombie")
    clock.advance(LEASE + 1)
    (rescued,) = await lifecycle.rescue_expired(broker, 3)
    assert rescued.state.value == "retry"
    (second,) = await claim(broker, worker="healthy")
    assert second.task.id == "t" and second.token != first.token
    stale = first.ref
    assert not await broker.complete(CompleteParams(stale, b'"zombie"', retention=60))
    assert not await broker.retry(RetryParams(stale, "zombie failed", 10))
    assert not await broker.archive(ArchiveParams(stale, "zombie gave up"))
    assert not await broker.requeue(stale)
    assert (await broker.complete_many([CompleteParams(stale)])) == [False]
    now = await broker.admin.get_task("default", "t")
    assert now.state is A and now.worker_id == "healthy"
    assert now.retried == 1 and now.last_error == "lease expired"
    assert await snapshot(broker) == picture(active="t")
    assert await broker.complete(CompleteParams(second.ref, b'"ok"', retention=60))
    assert (await broker.admin.get_task("default", "t")).result == "ok"


async def test_W1_fencing_after_finish(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    assert await broker.complete(CompleteParams(lease.ref, retention=60))
    assert not await broker.complete(CompleteParams(lease.ref, retention=60))
    assert not await broker.retry(RetryParams(lease.ref, "late", 0))
    assert not await broker.archive(ArchiveParams(lease.ref, "late"))
    assert (await broker.admin.get_task("default", "t")).state.value == "completed"


async def test_W1_fencing_needs_the_right_queue(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t", "q1"))
    await broker.enqueue(params("t", "q2"))
    (lease,) = await claim(broker, "q1")
    wrong = LeaseRef("q2", "t", lease.token)
    assert not await broker.complete(CompleteParams(wrong))
    assert await snapshot(broker, "q2") == picture(pending="t")


async def test_W7_requeue_hands_back_without_counting(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t", max_retry=3))
    (lease,) = await claim(broker)
    assert await broker.retry(RetryParams(lease.ref, "first failure", 0))
    (lease,) = await claim(broker)
    assert lease.task.retried == 1
    assert await broker.requeue(lease.ref)
    info = await broker.admin.get_task("default", "t")
    assert info.state is P and info.retried == 1
    assert await claim_ids(broker) == ["t"]


async def test_W7_requeued_task_is_claimable_at_once(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t"))
    clock.advance(5)
    await broker.enqueue(params("u"))
    (t,) = await claim(broker, limit=1)
    assert await broker.requeue(t.ref)
    assert set(await claim_ids(broker, limit=5)) == {"t", "u"}
