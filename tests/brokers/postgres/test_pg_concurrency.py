"""Races decided by the database: many brokers (many connections) at once."""

from __future__ import annotations

import asyncio
from collections import Counter

from durq.brokers.base import ClaimParams, CompleteParams, EnqueueParams
from durq.errors import DuplicateTaskError, TaskIDConflictError


def task(task_id: str, **options: object) -> EnqueueParams:
    return EnqueueParams(
        id=task_id,
        queue="default",
        type="t",
        payload=b"{}",
        **options,  # type: ignore[arg-type]
    )


async def test_W10_concurrent_claims_never_share_a_task(make_pg) -> None:
    brokers = [await make_pg() for _ in range(6)]
    await brokers[0].enqueue_many([task(f"t{i}") for i in range(300)])
    seen: Counter[str] = Counter()

    async def drain(n: int) -> None:
        broker = brokers[n]
        while True:
            leases = await broker.claim(ClaimParams(["default"], 7, f"w{n}", 30))
            if not leases:
                return
            seen.update(lease.task.id for lease in leases)
            assert all(await broker.complete_many([CompleteParams(x.ref) for x in leases]))

    await asyncio.gather(*(drain(n) for n in range(len(brokers))))
    assert len(seen) == 300 and set(seen.values()) == {1}


async def test_E3_same_id_from_many_connections_creates_one(make_pg) -> None:
    brokers = [await make_pg() for _ in range(8)]
    results = await asyncio.gather(
        *(b.enqueue(task("order-1")) for b in brokers), return_exceptions=True
    )
    created = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, TaskIDConflictError)]
    assert len(created) == 1 and len(refused) == 7
    assert all(r.existing is not None and r.existing.id == "order-1" for r in refused)


async def test_E4_same_unique_key_from_many_connections_creates_one(make_pg) -> None:
    brokers = [await make_pg() for _ in range(8)]
    results = await asyncio.gather(
        *(b.enqueue(task(f"u{i}", unique_key="k1", unique_ttl=60)) for i, b in enumerate(brokers)),
        return_exceptions=True,
    )
    created = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, DuplicateTaskError)]
    assert len(created) == 1 and len(refused) == 7
    assert {r.existing_id for r in refused} == {created[0].id}


async def test_E4_key_released_by_ttl_is_reused_once_under_a_race(make_pg, clock) -> None:
    brokers = [await make_pg() for _ in range(6)]
    await brokers[0].enqueue(task("first", unique_key="k2", unique_ttl=10))
    clock.advance(11)
    results = await asyncio.gather(
        *(
            b.enqueue(task(f"next{i}", unique_key="k2", unique_ttl=10))
            for i, b in enumerate(brokers)
        ),
        return_exceptions=True,
    )
    created = [r for r in results if not isinstance(r, BaseException)]
    assert len(created) == 1, results
    assert all(isinstance(r, DuplicateTaskError) for r in results if r not in created)


async def test_E3_retention_passed_frees_the_id_under_a_race(make_pg, clock) -> None:
    brokers = [await make_pg() for _ in range(6)]
    await brokers[0].enqueue(task("r1"))
    (lease,) = await brokers[0].claim(ClaimParams(["default"], 1, "w", 30))
    assert await brokers[0].complete(CompleteParams(lease.ref, b"1", retention=5))
    clock.advance(6)
    results = await asyncio.gather(
        *(b.enqueue(task("r1")) for b in brokers), return_exceptions=True
    )
    created = [r for r in results if not isinstance(r, BaseException)]
    assert len(created) == 1, results
    assert all(isinstance(r, TaskIDConflictError) for r in results if r not in created)
