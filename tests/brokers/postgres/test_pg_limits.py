"""Flow control on PostgreSQL: the claim of limited tasks is one statement, a freed slot is
taken by the next claim, and concurrent claims on many connections never overrun a key."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

from durq.brokers.base import (
    ArchiveParams,
    ClaimParams,
    CompleteParams,
    EnqueueParams,
    Lease,
    RetryParams,
)
from durq.brokers.postgres import PostgresBroker
from durq.task import LimitSpec


def task(task_id: str, key: str, concurrency: int) -> EnqueueParams:
    return EnqueueParams(
        id=task_id,
        queue="default",
        type="t",
        payload=b"{}",
        limits=(LimitSpec(key, concurrency=concurrency),),
    )


def claim_params(limit: int = 10, worker: str = "w") -> ClaimParams:
    return ClaimParams(["default"], limit, worker, 30)


async def drain(
    broker: PostgresBroker,
    worker: str,
    limit: int,
    run: Callable[[list[Lease]], Awaitable[None]],
    idle_claims: int = 20,
) -> None:
    """Claim, ``run`` and complete until ``idle_claims`` claims in a row find nothing."""
    idle = 0
    while idle < idle_claims:
        leases = await broker.claim(claim_params(limit, worker))
        if not leases:
            idle += 1
            await asyncio.sleep(0.01)
            continue
        idle = 0
        await run(leases)
        assert all(await broker.complete_many([CompleteParams(x.ref) for x in leases]))


class Checkouts:
    """How many pooled connections a broker's calls take, by method."""

    def __init__(self, broker: PostgresBroker) -> None:
        self.counts: Counter[str] = Counter()
        storage = broker._storage
        taken = storage.connection

        @contextlib.asynccontextmanager
        async def counted(method: str) -> AsyncIterator[object]:
            self.counts[method] += 1
            async with taken(method) as conn:
                yield conn

        storage.connection = counted  # type: ignore[method-assign]


async def test_a_freed_slot_is_taken_by_one_claim_statement(make_pg) -> None:
    """The key's held task comes back in the claim that follows the completion: one
    round trip (the due-time step and the claim, pipelined), nothing else."""
    broker = await make_pg()
    await broker.enqueue_many([task(f"t{i}", "k", 1) for i in range(3)])
    (first,) = await broker.claim(claim_params())
    assert await broker.complete(CompleteParams(first.ref))
    checkouts = Checkouts(broker)
    (second,) = await broker.claim(claim_params())
    assert second.task.id == "t1"
    assert checkouts.counts["claim"] == 1  # (the completion's wake-ups go in the background)
    held = await broker.admin.get_task("default", "t2")
    assert held.held_by == "k"


async def test_a_freed_slot_wakes_this_processs_worker_at_once(make_pg) -> None:
    """The completion that frees a slot wakes this broker's own waiting fetcher before its
    NOTIFY has made the round trip through the server."""
    broker = await make_pg()
    await broker.enqueue_many([task(f"t{i}", "k", 1) for i in range(2)])
    (lease,) = await broker.claim(claim_params())
    assert await broker.claim(claim_params()) == []
    assert await broker.wait_for_work(["default"], 0.5) in (True, False)  # listening now
    waiting = asyncio.create_task(broker.wait_for_work(["default"], 30))
    await asyncio.sleep(0.05)
    assert await broker.complete(CompleteParams(lease.ref))
    for _ in range(3):
        await asyncio.sleep(0)
    assert waiting.done() and waiting.result()


async def test_concurrent_claims_never_run_more_of_a_key_than_its_limit(make_pg) -> None:
    """Six brokers (six pools) claim and complete at once: at no moment do more attempts of
    a key hold leases than its limit, and every task runs once."""
    brokers = [await make_pg() for _ in range(6)]
    keys = {"a": 1, "b": 2, "c": 3}
    await brokers[0].enqueue_many(
        [task(f"{key}{i}", key, n) for key, n in keys.items() for i in range(40)]
    )
    running: Counter[str] = Counter()
    most: Counter[str] = Counter()
    seen: Counter[str] = Counter()

    async def run(leases: list[Lease]) -> None:
        for lease in leases:
            key = lease.task.id[0]
            running[key] += 1
            most[key] = max(most[key], running[key])
            seen[lease.task.id] += 1
        await asyncio.sleep(0.002)
        for lease in leases:  # counted out before the slot is given back
            running[lease.task.id[0]] -= 1

    await asyncio.gather(*(drain(b, f"w{n}", 4, run) for n, b in enumerate(brokers)))
    assert len(seen) == 120 and set(seen.values()) == {1}
    assert all(most[key] <= n for key, n in keys.items()), most
    assert most["c"] >= 2  # the limit, not a lock, decided
    limits = {s.key: (s.running, s.waiting) for s in await brokers[0].admin.list_limits("default")}
    assert limits == {"a": (0, 0), "b": (0, 0), "c": (0, 0)}


async def test_a_batch_of_moves_gives_every_slot_back(make_pg) -> None:
    """The rescuer's batch (several retry/archive moves in one transaction) locks all their
    counters first, in key order, and gives each key its slot back."""
    broker = await make_pg()
    await broker.enqueue_many([task(f"{key}{i}", key, 1) for key in "ba" for i in range(2)])
    leases = await broker.claim(claim_params())
    assert sorted(x.task.id for x in leases) == ["a0", "b0"]
    moves = [
        RetryParams(leases[0].ref, "boom", 3600),
        ArchiveParams(leases[1].ref, "boom"),
    ]
    assert await broker.move_leases(moves) == [True, True]
    limits = {s.key: (s.running, s.waiting) for s in await broker.admin.list_limits("default")}
    assert limits == {"a": (0, 1), "b": (0, 1)}
    assert sorted(x.task.id for x in await broker.claim(claim_params())) == ["a1", "b1"]


async def test_many_claims_on_shared_keys_meet_no_deadlock(make_pg, caplog) -> None:
    """Eight workers claim and complete tasks that each carry two of six keys, with tasks
    held on every key all along: no claim or outcome meets a deadlock (claims never wait for
    a counter, outcomes lock theirs in key order), and every task runs once."""
    caplog.set_level(logging.DEBUG, logger="durq.brokers.postgres")
    brokers = [await make_pg() for _ in range(8)]
    keys = [LimitSpec(k, concurrency=2) for k in "abcdef"]
    # Two different keys each (4i + 1 is never a multiple of 6), in either order.
    tasks = [
        EnqueueParams(
            id=f"t{i}",
            queue="default",
            type="t",
            payload=b"{}",
            limits=(keys[i % 6], keys[(i * 5 + 1) % 6]),
        )
        for i in range(240)
    ]
    await brokers[0].enqueue_many(tasks)
    seen: Counter[str] = Counter()

    async def run(leases: list[Lease]) -> None:
        seen.update(lease.task.id for lease in leases)
        await asyncio.sleep(0.001)

    await asyncio.gather(*(drain(b, f"w{n}", 3, run, 30) for n, b in enumerate(brokers)))
    assert [r for r in caplog.records if "deadlock" in r.getMessage()] == []
    assert len(seen) == len(tasks) and set(seen.values()) == {1}
