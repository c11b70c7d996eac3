"""An idle worker waits and claims in one step on Redis: BLPOP on its queues' token lists
with the claim script of those queues behind it (``RedisBroker.wait_and_claim``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from durq.brokers.base import ClaimParams, EnqueueParams
from durq.brokers.redis import RedisBroker
from durq.states import TaskState
from fetchkit import assert_acks_hand_a_limited_slot_on
from servers import PrivateRedis


def task(task_id: str, queue: str = "q") -> EnqueueParams:
    return EnqueueParams(id=task_id, queue=queue, type="t", payload=b"{}")


def claim(limit: int = 1, *queues: str) -> ClaimParams:
    return ClaimParams(list(queues or ["q"]), limit, "w", 30)


async def blocked(broker: RedisBroker, params: ClaimParams, timeout: float) -> asyncio.Task:
    """A wait_and_claim call that has reached the server and blocks there."""
    waiting = asyncio.create_task(broker.wait_and_claim(params, timeout))
    blocking = broker._storage.blocking_wire
    assert blocking is not None
    for _ in range(200):
        await asyncio.sleep(0.01)
        clients = await broker._storage.command("CLIENT", "LIST", "TYPE", "normal")
        if b"cmd=blpop" in clients:
            return waiting
    raise AssertionError("the wait never blocked on the server")


async def test_a_task_enqueued_while_a_worker_waits_comes_back_leased(
    rbroker: RedisBroker,
) -> None:
    waiting = await blocked(rbroker, claim(5), timeout=5)
    await rbroker.enqueue(task("a"))
    leases = await asyncio.wait_for(waiting, 2)
    assert leases is not None and [lease.task.id for lease in leases] == ["a"]
    assert leases[0].task.state is TaskState.ACTIVE


async def test_the_wait_ends_empty_at_its_timeout(rbroker: RedisBroker) -> None:
    await rbroker.migrate()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await rbroker.wait_and_claim(claim(), 0.3) == []
    assert loop.time() - started >= 0.29


async def test_work_already_there_is_claimed_at_once(rbroker: RedisBroker) -> None:
    await rbroker.enqueue(task("a"))
    leases = await asyncio.wait_for(rbroker.wait_and_claim(claim(), 5), 2)
    assert leases is not None and [lease.task.id for lease in leases] == ["a"]


async def test_a_claim_that_leaves_tasks_behind_wakes_the_next_waiting_worker(
    rbroker: RedisBroker, redis_url: str
) -> None:
    other = RedisBroker.from_url(redis_url)
    try:
        first = await blocked(rbroker, claim(1), timeout=5)
        second = await blocked(other, claim(1), timeout=5)
        await rbroker.enqueue_many([task("a"), task("b")])  # one token for both
        got = await asyncio.wait_for(asyncio.gather(first, second), 3)
        assert sorted(lease.task.id for leases in got for lease in leases or []) == ["a", "b"]
    finally:
        await other.close()


async def test_cancelling_the_wait_unblocks_it_and_hands_back_what_it_claimed(
    rbroker: RedisBroker,
) -> None:
    waiting = await blocked(rbroker, claim(1), timeout=30)
    await rbroker.enqueue(task("a"))  # the claim behind the wait has run by the reply
    waiting.cancel()
    # Room for the hand-back on a loaded machine: a second cancellation by a timeout here
    # would interrupt it and leave the lease to expire.
    await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), 20)
    info = await rbroker.admin.get_task("q", "a")
    assert info.state is TaskState.PENDING and info.retried == 0
    assert [lease.task.id for lease in await rbroker.claim(claim())] == ["a"]


async def test_cancelling_an_idle_wait_ends_it_at_once(rbroker: RedisBroker) -> None:
    waiting = await blocked(rbroker, claim(1), timeout=30)
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting.cancel()
    await asyncio.wait_for(asyncio.gather(waiting, return_exceptions=True), 20)
    assert loop.time() - started < 10  # not the wait's 30 s
    await rbroker.enqueue(task("a"))
    assert (await rbroker.admin.get_task("q", "a")).state is TaskState.PENDING


async def test_a_worker_of_several_queues_is_woken_by_a_task_in_any_of_them(
    rbroker: RedisBroker,
) -> None:
    waiting = await blocked(rbroker, claim(5, "q", "r", "s"), timeout=5)
    await rbroker.enqueue(task("b", queue="r"))
    leases = await asyncio.wait_for(waiting, 2)
    assert leases is not None and [(x.task.queue, x.task.id) for x in leases] == [("r", "b")]


async def test_a_claim_of_several_queues_fills_in_their_order_and_passes_the_rest_on(
    rbroker: RedisBroker, redis_url: str
) -> None:
    await rbroker.enqueue_many([task("a"), task("b", "r"), task("c", "r")])
    leases = await asyncio.wait_for(rbroker.wait_and_claim(claim(2, "q", "r"), 5), 2)
    assert leases is not None and [(x.task.queue, x.task.id) for x in leases] == [
        ("q", "a"),
        ("r", "b"),
    ]
    # What is left is claimed at once by a worker blocked on that queue: the token stayed.
    other = RedisBroker.from_url(redis_url)
    try:
        rest = await asyncio.wait_for(other.wait_and_claim(claim(5, "r"), 5), 2)
        assert rest is not None and [x.task.id for x in rest] == ["c"]
    finally:
        await other.close()


async def test_a_paused_queue_gives_nothing_to_a_worker_of_several_queues(
    rbroker: RedisBroker,
) -> None:
    await rbroker.enqueue_many([task("a"), task("b", "r")])
    await rbroker.admin.pause_queue("q")
    leases = await asyncio.wait_for(rbroker.wait_and_claim(claim(5, "q", "r"), 5), 2)
    assert leases is not None and [(x.task.queue, x.task.id) for x in leases] == [("r", "b")]


async def test_a_server_that_refuses_client_id_keeps_the_subscriptions_way(
    private_redis: Callable[..., PrivateRedis],
) -> None:
    """An ACL user without CLIENT (common for application users): the broker waits on
    pub/sub, and an enqueue still wakes it at once."""
    server = private_redis(
        "--user", "default", "off", "--user", "app", "on", ">s3cret", "~*", "&*", "+@all", "-client"
    )
    url = server.url.replace("redis://", "redis://app:s3cret@")
    waiter, client = RedisBroker.from_url(url), RedisBroker.from_url(url)
    try:
        await waiter.migrate()
        assert await waiter.wait_and_claim(claim(), 0.2) is None
        assert await waiter.wait_and_claim(claim(), 0.2) is None  # it does not ask again
        assert await waiter.wait_for_work(["q"], timeout=0.2) is True  # the first subscribes
        waiting = asyncio.create_task(waiter.wait_for_work(["q"], timeout=5))
        await asyncio.sleep(0.05)
        await client.enqueue(task("a"))
        assert await asyncio.wait_for(waiting, 2) is True
    finally:
        await waiter.close()
        await client.close()


async def test_a_worker_waiting_on_pub_sub_still_carries_its_acks_in_its_claims(
    private_redis: Callable[..., PrivateRedis],
) -> None:
    """Where the server refuses the blocking wait, the worker waits on pub/sub as on the
    other brokers, and an attempt that ends meanwhile has its ack ride in the claim that
    fills its slot (a key at its concurrency limit hands its slot on in one round trip)."""
    server = private_redis(
        "--user", "default", "off", "--user", "app", "on", ">s3cret", "~*", "&*", "+@all", "-client"
    )
    await assert_acks_hand_a_limited_slot_on(server.url.replace("redis://", "redis://app:s3cret@"))
