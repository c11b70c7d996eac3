"""Flow control (W13): per-key concurrency and rate limits, counted by the broker in the
claim; held tasks never block other keys; every way an attempt ends gives its slot back."""

from __future__ import annotations

import asyncio
import time

import pytest
from brokerkit import LEASE, A, P, claim, claim_ids, params, snapshot

from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import (
    ArchiveParams,
    Claimed,
    CompleteParams,
    Lease,
    RetryParams,
)
from durq.clock import FakeClock
from durq.task import LimitSpec


def conc(key: str, n: int) -> LimitSpec:
    return LimitSpec(key, concurrency=n)


def rate(key: str, n: int, per: float) -> LimitSpec:
    return LimitSpec(key, rate=n, per=per)


async def enqueue(broker: FullBroker, clock: FakeClock, task_id: str, *limits: LimitSpec) -> None:
    await broker.enqueue(params(task_id, limits=tuple(limits)))
    clock.advance(0.001)  # a strict enqueue order on every broker


async def limits_of(broker: FullBroker) -> dict[str, tuple[int, int]]:
    """``{key: (running, waiting)}`` of the default queue, as the inspector shows it."""
    return {s.key: (s.running, s.waiting) for s in await broker.admin.list_limits("default")}


async def test_W13_concurrency_limit_holds_across_claims_and_workers(
    make_broker, clock: FakeClock
) -> None:
    one, two = await make_broker(), await make_broker()
    for i in range(5):
        await enqueue(one, clock, f"k{i}", conc("k", 2))
    assert await claim_ids(one, limit=1) == ["k0"]
    assert await claim_ids(two, limit=10) == ["k1"]
    assert await claim_ids(one, limit=10) == []
    assert await claim_ids(two, limit=10) == []
    assert await snapshot(one) == {A: ["k0", "k1"], P: ["k2", "k3", "k4"]}
    assert await limits_of(one) == {"k": (2, 3)}
    held = await one.admin.get_task("default", "k2")
    assert held.state is P and held.held_by == "k"
    assert held.limits == (conc("k", 2),)


async def test_W13_no_head_of_line_blocking(broker: FullBroker, clock: FakeClock) -> None:
    """Held tasks at the head of the queue do not stop other keys or unlimited tasks."""
    await enqueue(broker, clock, "k0", conc("k", 1))
    for i in range(1, 30):
        await enqueue(broker, clock, f"k{i}", conc("k", 1))
    await enqueue(broker, clock, "j0", conc("j", 1))
    await enqueue(broker, clock, "u0")
    await enqueue(broker, clock, "u1")
    assert await claim_ids(broker, limit=3) == ["k0", "j0", "u0"]
    assert await claim_ids(broker, limit=3) == ["u1"]
    assert await claim_ids(broker, limit=3) == []
    assert await limits_of(broker) == {"j": (1, 0), "k": (1, 29)}


async def test_W13_several_limits_on_one_task(broker: FullBroker, clock: FakeClock) -> None:
    """A global limit and a per-partner one: a task runs only when both have room."""
    for task_id, partner in (("a", "p1"), ("b", "p1"), ("c", "p2"), ("d", "p3")):
        await enqueue(broker, clock, task_id, conc("all", 2), conc(f"partner:{partner}", 1))
    got = await claim(broker, limit=10)
    assert [x.task.id for x in got] == ["a", "c"]
    assert await claim_ids(broker, limit=10) == []
    assert await broker.complete(CompleteParams(got[0].ref))  # a: frees "all" and p1
    assert await claim_ids(broker, limit=10) == ["b"]
    running = {k: r for k, (r, _) in (await limits_of(broker)).items()}
    # d waits on "all", the first full key; its partner's counter may not exist yet.
    assert running.pop("partner:p3", 0) == 0
    assert running == {"all": 2, "partner:p1": 1, "partner:p2": 1}


def _ends(clock: FakeClock):
    async def complete(broker: FullBroker, lease: Lease) -> None:
        assert await broker.complete(CompleteParams(lease.ref))

    async def complete_kept(broker: FullBroker, lease: Lease) -> None:
        assert await broker.complete_many([CompleteParams(lease.ref, b"1", retention=60)])

    async def retry(broker: FullBroker, lease: Lease) -> None:
        assert await broker.retry(RetryParams(lease.ref, "boom", 3600))

    async def snooze(broker: FullBroker, lease: Lease) -> None:
        assert await broker.retry(RetryParams(lease.ref, "", 3600, snooze=True))

    async def archive(broker: FullBroker, lease: Lease) -> None:
        assert await broker.archive(ArchiveParams(lease.ref, "boom"))

    async def requeue(broker: FullBroker, lease: Lease) -> None:
        assert await broker.requeue(lease.ref)

    async def lease_expired(broker: FullBroker, lease: Lease) -> None:
        clock.advance(LEASE + 1)
        rescued = await lifecycle.rescue_expired(broker, max_lost=3)
        assert [t.id for t in rescued] == [lease.task.id]

    return {
        "complete": complete,
        "complete_kept": complete_kept,
        "retry": retry,
        "snooze": snooze,
        "archive": archive,
        "requeue": requeue,
        "lease_expired": lease_expired,
    }


@pytest.mark.parametrize(
    "end",
    ["complete", "complete_kept", "retry", "snooze", "archive", "requeue", "lease_expired"],
)
async def test_W13_every_end_of_an_attempt_gives_its_slot_back(
    broker: FullBroker, clock: FakeClock, end: str
) -> None:
    await enqueue(broker, clock, "first", conc("k", 1))
    await enqueue(broker, clock, "second", conc("k", 1))
    (lease,) = await claim(broker, limit=10)
    assert lease.task.id == "first"
    assert await claim_ids(broker, limit=10) == []
    await _ends(clock)[end](broker, lease)
    got = await claim_ids(broker, limit=10)
    # A requeued or rescued task is due again too: one of the two runs, never both.
    assert len(got) == 1 and got[0] in {"first", "second"}
    assert await claim_ids(broker, limit=10) == []
    assert (await limits_of(broker))["k"][0] == 1


async def test_W13_held_tasks_come_back_in_claim_order(
    broker: FullBroker, clock: FakeClock
) -> None:
    """A key with room again lets its held tasks back in the order a claim takes tasks
    (priority, then ready time, then enqueue order), not in the order they were held."""
    await enqueue(broker, clock, "running", conc("k", 1))
    (lease,) = await claim(broker, limit=10)
    for task_id, priority in (("old", 0), ("urgent", 5), ("later", 0), ("first", 9)):
        await broker.enqueue(params(task_id, limits=(conc("k", 1),), priority=priority))
        clock.advance(0.001)
    assert await claim_ids(broker, limit=10) == []  # all four held on the full key
    order = []
    for _ in range(4):
        assert await broker.complete(CompleteParams(lease.ref))
        (lease,) = await claim(broker, limit=10)
        order.append(lease.task.id)
    assert order == ["first", "urgent", "old", "later"]


async def test_W13_a_lost_fence_gives_nothing_back(broker: FullBroker, clock: FakeClock) -> None:
    """A zombie's late outcome (its lease was rescued and claimed again) frees no slot."""
    await enqueue(broker, clock, "t", conc("k", 1))
    await enqueue(broker, clock, "u", conc("k", 1))
    (stale,) = await claim(broker, limit=10)
    clock.advance(LEASE + 1)
    await lifecycle.rescue_expired(broker, max_lost=3)
    assert len(await claim(broker, limit=10)) == 1
    assert not await broker.complete(CompleteParams(stale.ref))
    assert await claim_ids(broker, limit=10) == []
    assert (await limits_of(broker))["k"][0] == 1


async def test_W13_rate_limit_on_the_broker_clock(broker: FullBroker, clock: FakeClock) -> None:
    """3 per 10 s: a full bucket of 3, then one token every 3.33 s."""
    for i in range(8):
        await enqueue(broker, clock, f"r{i}", rate("r", 3, 10.0))
    await enqueue(broker, clock, "u")
    got = await claim(broker, limit=10)
    assert [x.task.id for x in got] == ["r0", "r1", "r2", "u"]
    got = await claim(broker, limit=10)
    assert got == []
    if isinstance(got, Claimed):  # when the next token comes, for the worker's wait
        assert got.wake_at is not None
        assert clock.now() + 3.0 < got.wake_at <= clock.now() + 3.34
    clock.advance(3.4)
    assert await claim_ids(broker, limit=10) == ["r3"]
    assert await claim_ids(broker, limit=10) == []
    clock.advance(60)  # the bucket holds at most 3
    assert await claim_ids(broker, limit=10) == ["r4", "r5", "r6"]
    stats = (await broker.admin.list_limits("default"))[0]
    assert (stats.key, stats.rate, stats.per, stats.waiting) == ("r", 3, 10.0, 1)
    assert stats.tokens is not None and stats.tokens < 1


async def test_W13_limits_are_counted_per_queue(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("a", "one", limits=(conc("k", 1),)))
    await broker.enqueue(params("b", "two", limits=(conc("k", 1),)))
    assert await claim_ids(broker, ["one", "two"], limit=10) == ["a", "b"]


async def test_W13_a_freed_slot_wakes_a_waiting_worker(make_broker, clock: FakeClock) -> None:
    worker, other = await make_broker(), await make_broker()
    await enqueue(other, clock, "a", conc("k", 1))
    await enqueue(other, clock, "b", conc("k", 1))
    (lease,) = await claim(other, limit=10)
    assert await claim_ids(worker, limit=10) == []  # b is held
    waiting = asyncio.create_task(worker.wait_for_work(["default"], timeout=30))
    await asyncio.sleep(0.05)
    start = time.monotonic()
    assert await other.complete(CompleteParams(lease.ref))
    assert await asyncio.wait_for(waiting, 2.0)
    assert time.monotonic() - start < 2.0
    assert await claim_ids(worker, limit=10) == ["b"]


async def test_W13_inspector_moves_of_held_tasks(broker: FullBroker, clock: FakeClock) -> None:
    """A held task can be archived, run again and deleted like any pending task."""
    await enqueue(broker, clock, "a", conc("k", 1))
    await enqueue(broker, clock, "b", conc("k", 1))
    await enqueue(broker, clock, "c", conc("k", 1))
    (lease,) = await claim(broker, limit=10)
    await lifecycle.archive_task(broker.admin, "default", "b")
    await lifecycle.delete_task(broker.admin, "default", "c")
    assert await broker.complete(CompleteParams(lease.ref))
    await lifecycle.run_task(broker.admin, "default", "b")
    assert await claim_ids(broker, limit=10) == ["b"]
    assert await limits_of(broker) == {"k": (1, 0)}
