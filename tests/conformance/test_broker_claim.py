"""Claim (W8, W10): order, limit, queue order, paused queues, and never one task twice."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from datetime import UTC, datetime

from brokerkit import LEASE, A, C, P, R, X, claim, claim_ids, params, picture, put, snapshot

from conformance.conftest import requires
from durq.brokers import FullBroker
from durq.brokers.base import CAP_MULTI_PROCESS, ClaimParams
from durq.clock import FakeClock


async def test_claim_order_next_process_at_then_enqueue_order(
    broker: FullBroker, clock: FakeClock
) -> None:
    t0 = clock.now()
    await broker.enqueue(params("a"))  # ready at t0
    await broker.enqueue(params("c", process_at=t0 + 0.5))  # ready at t0 + 0.5
    clock.advance(1)
    await broker.enqueue(params("b"))  # ready at t0 + 1
    await broker.enqueue(params("d"))  # same time as b, enqueued after it
    await broker.enqueue(params("e"))
    clock.advance(1)
    assert await claim_ids(broker, limit=10) == ["a", "c", "b", "d", "e"]


async def test_claim_respects_limit_and_takes_oldest(broker: FullBroker, clock: FakeClock) -> None:
    for i in range(5):
        await broker.enqueue(params(f"t{i}"))
        clock.advance(1)
    assert await claim_ids(broker, limit=2) == ["t0", "t1"]
    assert await claim_ids(broker, limit=2) == ["t2", "t3"]
    assert await claim_ids(broker, limit=2) == ["t4"]
    assert await claim_ids(broker, limit=2) == []
    assert await snapshot(broker) == picture(active="t0 t1 t2 t3 t4")


async def test_claim_fills_from_queues_in_the_order_given(
    broker: FullBroker, clock: FakeClock
) -> None:
    for q in ("low", "high"):
        for i in range(3):
            await broker.enqueue(params(f"{q}{i}", q))
    got = await claim(broker, ["high", "low"], limit=4)
    assert [(x.task.queue, x.task.id) for x in got] == [
        ("high", "high0"),
        ("high", "high1"),
        ("high", "high2"),
        ("low", "low0"),
    ]
    assert await claim_ids(broker, ["nothing-here"], limit=4) == []


async def test_claim_sets_the_lease(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t", max_retry=7))
    (lease,) = await claim(broker, lease=45)
    task = lease.task
    assert task.state is A
    assert task.retried == 0 and task.max_retry == 7
    assert task.worker_id == "w1"
    assert task.lease_expires_at == datetime.fromtimestamp(clock.now() + 45, tz=UTC)
    assert task.payload == {"id": "t"}
    assert lease.token
    stored = await broker.admin.get_task("default", "t")
    assert stored.state is A and stored.worker_id == "w1"


async def test_claim_gives_each_lease_its_own_token(broker: FullBroker, clock: FakeClock) -> None:
    for i in range(5):
        await broker.enqueue(params(f"t{i}"))
    tokens = [x.token for x in await claim(broker, limit=5)]
    assert len(set(tokens)) == 5


async def test_claim_does_not_take_active_or_finished(broker: FullBroker, clock: FakeClock) -> None:
    await put(broker, clock, {"a": A, "r": R, "x": X, "c": C})
    assert await claim_ids(broker) == []


async def test_claim_zero_limit(broker: FullBroker) -> None:
    await broker.enqueue(params("t"))
    assert await claim_ids(broker, limit=0) == []
    assert await snapshot(broker) == picture(pending="t")


async def test_W8_paused_queue_gives_nothing_but_accepts_enqueue(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("before", "mail"))
    await broker.enqueue(params("other", "sms"))
    await broker.admin.pause_queue("mail")
    info = await broker.enqueue(params("during", "mail"))
    assert info.state is P
    assert await claim_ids(broker, ["mail", "sms"]) == ["other"]
    assert (await broker.admin.queue_stats("mail")).paused
    await broker.admin.unpause_queue("mail")
    assert await claim_ids(broker, ["mail"]) == ["before", "during"]


async def test_W10_concurrent_claims_from_many_brokers_never_share_a_task(
    make_broker, clock: FakeClock
) -> None:
    brokers = [await make_broker() for _ in range(3)]
    total = 90
    await brokers[0].enqueue_many([params(f"t{i:03}") for i in range(total)])

    async def one(broker: FullBroker, n: int) -> list[str]:
        got = await broker.claim(ClaimParams(["default"], 3, f"w{n}", LEASE))
        return [x.task.id for x in got]

    results = await asyncio.gather(*(one(brokers[n % 3], n) for n in range(45)))
    claimed = [task_id for ids in results for task_id in ids]
    assert len(claimed) == len(set(claimed)), "a task was handed out twice"
    assert sorted(claimed) == [f"t{i:03}" for i in range(total)]


_CLAIMER = textwrap.dedent(
    """
    import asyncio, json, sys
    from durq.brokers import open_broker
    from durq.brokers.base import ClaimParams, CompleteParams

    async def main():
        broker = open_broker(sys.argv[1])
        await broker.connect()
        ids, idle = [], 0
        while idle < 3:
            got = await broker.claim(ClaimParams(["default"], 2, sys.argv[2], 60.0))
            if not got:
                idle += 1
                await asyncio.sleep(0.05)
                continue
            idle = 0
            ids += [lease.task.id for lease in got]
            await broker.complete_many([CompleteParams(lease.ref) for lease in got])
        await broker.close()
        print(json.dumps(ids))

    asyncio.run(main())
    """
)


async def test_W10_worker_processes_never_share_a_task(make_broker, broker_url: str) -> None:
    # Real time: the child processes use the system clock too.
    broker = await make_broker(fake_clock=False)
    requires(broker, CAP_MULTI_PROCESS)
    total = 400
    await broker.enqueue_many([params(f"t{i:03}") for i in range(total)])
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _CLAIMER,
            broker_url,
            f"proc{n}",
            stdout=subprocess.PIPE,
        )
        for n in range(3)
    ]
    outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 60)
    assert all(p.returncode == 0 for p in procs)
    claimed = [task_id for out, _ in outputs for task_id in json.loads(out)]
    assert len(claimed) == len(set(claimed)), "a task ran twice"
    assert sorted(claimed) == [f"t{i:03}" for i in range(total)]
    assert await snapshot(broker) == {}
