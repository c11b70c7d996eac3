"""Redis-specific behaviour beyond the shared conformance suite: scripts by SHA with NOSCRIPT
reload, one slot per script call, keys confined to the prefix, real (not spurious) wake-ups."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from durq import lifecycle
from durq.brokers.base import ClaimParams, CompleteParams, EnqueueParams, WorkerInfo
from durq.brokers.redis import RedisBroker
from durq.brokers.redis.lua import LuaScript
from durq.clock import FakeClock
from durq.errors import QueueNotFoundError
from durq.states import TaskState
from durq.task import LimitSpec, TaskInfo
from servers import raw_redis


def task(task_id: str, queue: str = "default", **kw: Any) -> EnqueueParams:
    return EnqueueParams(id=task_id, queue=queue, type="test:task", payload=b'{"n":1}', **kw)


def claim_params(queues: list[str], limit: int = 10) -> ClaimParams:
    return ClaimParams(queues=queues, limit=limit, worker_id="w1", lease_seconds=30)


def unknown_to_server(broker: RedisBroker) -> None:
    """Give every script a SHA the server has never seen, as after a restart or SCRIPT FLUSH."""
    import hashlib
    import uuid

    fresh = {}
    for name, s in broker._storage.scripts.items():
        source = s.source + f"\n-- {uuid.uuid4()}\n".encode()
        fresh[name] = LuaScript(name, source, hashlib.sha1(source).hexdigest())
    broker._storage.scripts = fresh


async def test_scripts_are_reloaded_on_noscript(rbroker: RedisBroker) -> None:
    unknown_to_server(rbroker)
    assert (await rbroker.enqueue(task("a"))).state is TaskState.PENDING
    unknown_to_server(rbroker)
    outcomes = await rbroker.enqueue_many([task("b"), task("c"), task("a")])
    assert [o.created for o in outcomes] == [True, True, False]
    unknown_to_server(rbroker)
    leases = await rbroker.claim(claim_params(["default"]))
    assert [lease.task.id for lease in leases] == ["a", "b", "c"]
    unknown_to_server(rbroker)
    assert await rbroker.complete_many([CompleteParams(x.ref) for x in leases]) == [True] * 3
    unknown_to_server(rbroker)
    assert (await rbroker.extend_leases([leases[0].ref], 30)).lost == {"a"}


async def test_script_flush_on_a_private_server(private_redis) -> None:
    server = private_redis()
    broker = RedisBroker.from_url(server.url, clock=FakeClock())
    await broker.enqueue(task("a"))
    raw = raw_redis(broker)
    await raw.script_flush()
    await broker.enqueue(task("b"))
    await raw.script_flush()
    assert len(await broker.claim(claim_params(["default"]))) == 2
    await broker.close()


async def test_a_batch_after_script_flush_runs_in_order(private_redis) -> None:
    """The scripts of a batch the server may not hold are loaded ahead of it: its calls run
    in the order given (the completion, then the claim that takes the slot it frees), never
    the refused one after the rest."""
    server = private_redis()
    one = (LimitSpec("k", concurrency=1),)
    broker = RedisBroker.from_url(server.url, clock=FakeClock())
    await broker.enqueue_many([task("k0", limits=one), task("k1", limits=one)])
    (lease,) = await broker.claim(claim_params(["default"], 2))
    await raw_redis(broker).script_flush()
    await broker.close()
    fresh = RedisBroker.from_url(server.url, clock=FakeClock())
    # The claim script is back on the server (a claim ran), the complete script not.
    assert await fresh.claim(claim_params(["default"], 2)) == []
    done, leases = await fresh.complete_and_claim(
        [CompleteParams(lease.ref)], claim_params(["default"], 2)
    )
    assert done == [True] and [x.task.id for x in leases] == ["k1"]
    await fresh.close()


class SlotRecorder:
    """Wraps the connection's calls to record the KEYS of every script call."""

    def __init__(self, broker: RedisBroker, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[str]] = []
        #: Claim calls of several queues (on a cluster each queue has a call of its own).
        self.several_queues = 0
        wire = broker._storage.wire
        wire_call, wire_call_many = wire.call, wire.call_many

        claim_sha = broker._storage.scripts["claim"].sha

        def record(command: Any) -> None:
            if command[0] == "EVALSHA":
                n = int(command[2])
                keys = [k if isinstance(k, str) else k.decode() for k in command[3 : 3 + n]]
                # A claim of several queues on a single node: one call, eight keys a queue.
                step = 8 if command[1] == claim_sha else n
                self.calls.extend(keys[i : i + step] for i in range(0, n, step))
                self.several_queues += command[1] == claim_sha and n > step

        async def call(command: Any) -> Any:
            record(command)
            return await wire_call(command)

        async def call_many(commands: Any) -> Any:
            for command in commands:
                record(command)
            return await wire_call_many(commands)

        monkeypatch.setattr(wire, "call", call)
        monkeypatch.setattr(wire, "call_many", call_many)


async def test_every_script_call_touches_one_slot_under_the_prefix(
    rbroker: RedisBroker, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis.crc import key_slot

    rec = SlotRecorder(rbroker, monkeypatch)
    await rbroker.enqueue_many([task("a", "q:1"), task("b", "q:1", unique_key="u", unique_ttl=9)])
    await rbroker.enqueue(task("c", "other", process_at=clock.now() + 5))
    clock.advance(10)
    leases = await rbroker.claim(claim_params(["q:1", "other"]))
    await rbroker.extend_leases([x.ref for x in leases], 30)
    await rbroker.complete(CompleteParams(leases[0].ref, b"1", retention=5))
    await rbroker.retry(dataclasses.replace(_retry(leases[1])))
    await rbroker.requeue(leases[2].ref)
    await rbroker.promote_due()
    clock.advance(100)
    await lifecycle.rescue_expired(rbroker, 3)
    await rbroker.delete_expired(10)
    await lifecycle.run_all(rbroker.admin, "q:1", TaskState.RETRY)
    await lifecycle.archive_task(rbroker.admin, "q:1", "b")
    await lifecycle.run_task(rbroker.admin, "q:1", "b")
    await lifecycle.cancel_task(rbroker.admin, "q:1", "b")
    await lifecycle.delete_task(rbroker.admin, "q:1", "b")
    await lifecycle.delete_all(rbroker.admin, "other", TaskState.PENDING)
    assert len(rec.calls) >= 15
    assert rec.several_queues  # (twice when the first call met NOSCRIPT)
    for keys in rec.calls:
        assert keys, "every script receives its keys"
        assert {key_slot(k.encode()) for k in keys} == {key_slot(keys[0].encode())}
        assert all(k.startswith(f"{rbroker.prefix}:{{") for k in keys)
    # Nothing at all was written outside the prefix.
    mine = [k async for k in raw_redis(rbroker).scan_iter(match=f"*{rbroker.prefix}*")]
    assert mine and all(k.startswith(f"{rbroker.prefix}:".encode()) for k in mine)


def _retry(lease: Any) -> Any:
    from durq.brokers.base import RetryParams

    return RetryParams(lease.ref, "boom", 0.0)


async def test_a_claim_then_wait_is_woken_by_a_real_notification(
    redis_url: str, clock: FakeClock
) -> None:
    waiter = RedisBroker.from_url(redis_url, clock=clock)
    client = RedisBroker.from_url(redis_url, clock=clock)
    try:
        # The first wait on a queue subscribes to it and returns at once: what was published
        # before it is unknown.
        assert await waiter.wait_for_work(["default"], timeout=0.2) is True
        assert await waiter.claim(claim_params(["default"])) == []
        # Level-triggered from the claim: no enqueue since, so the wait is not woken...
        assert await waiter.wait_for_work(["default"], timeout=0.2) is False
        # ...and an enqueue into another queue does not wake it either.
        await client.enqueue(task("x", "elsewhere"))
        assert await waiter.wait_for_work(["default"], timeout=0.2) is False
        latencies = []
        for i in range(20):
            await waiter.claim(claim_params(["default"]))
            waiting = asyncio.create_task(waiter.wait_for_work(["default"], timeout=5))
            await asyncio.sleep(0.01)
            start = time.perf_counter()
            await client.enqueue(task(f"t{i}"))
            assert await waiting
            latencies.append(time.perf_counter() - start)
            await waiter.claim(claim_params(["default"]))
        latencies.sort()
        assert latencies[len(latencies) // 2] < 0.05, latencies
    finally:
        await waiter.close()
        await client.close()


async def test_enqueue_between_claim_and_wait_is_not_missed(
    redis_url: str, clock: FakeClock
) -> None:
    waiter = RedisBroker.from_url(redis_url, clock=clock)
    client = RedisBroker.from_url(redis_url, clock=clock)
    try:
        await waiter.claim(claim_params(["default"]))
        await client.enqueue(task("late"))
        await asyncio.sleep(0.05)  # the notification arrives before anyone waits
        start = time.monotonic()
        assert await waiter.wait_for_work(["default"], timeout=5)
        assert time.monotonic() - start < 0.5
    finally:
        await waiter.close()
        await client.close()


async def test_pause_of_unknown_queue_and_queues_known_by_workers(rbroker: RedisBroker) -> None:
    with pytest.raises(QueueNotFoundError):
        await rbroker.admin.pause_queue("nope")
    await rbroker.register_worker(
        WorkerInfo(id="host:1", host="host", pid=1, queues={"mail": 1}, concurrency=2, started_at=0)
    )
    await rbroker.admin.pause_queue("mail")
    (stats,) = await rbroker.admin.list_queues()
    assert stats.name == "mail" and stats.paused
    (worker,) = await rbroker.admin.list_workers()
    assert worker.queues == {"mail": 1}


async def test_E9_concurrent_enqueues_share_script_calls(rbroker: RedisBroker) -> None:
    """50 callers, 10 enqueues each: a script call carries the calls that arrived while the
    one before was in flight (not one script call per enqueue)."""
    await rbroker.enqueue(task("warm"))  # connected, queue known
    wire = rbroker._storage.wire
    scripts: list[int] = []  # EVALSHA commands per round trip

    def counted(send: Any) -> Any:
        async def run(commands: Any) -> Any:
            batch = commands if isinstance(commands, list) else [commands]
            scripts.append(sum(1 for c in batch if c[0] == "EVALSHA"))
            return await send(commands)

        return run

    wire.call, wire.call_many = counted(wire.call), counted(wire.call_many)  # type: ignore[method-assign]

    async def caller(c: int) -> list[TaskInfo]:
        return [await rbroker.enqueue(task(f"c{c}-{i}")) for i in range(10)]

    answers = await asyncio.gather(*(caller(c) for c in range(50)))
    assert [[a.id for a in mine] for mine in answers] == [
        [f"c{c}-{i}" for i in range(10)] for c in range(50)
    ]
    # The first call alone, then two script calls per round of the 50 callers: 21, where one
    # script call per enqueue would be 500.
    assert sum(scripts) <= 30, scripts
    assert len(await rbroker.admin.list_tasks("default", TaskState.PENDING, limit=1000)) == 501


async def test_E9_concurrent_enqueues_keep_two_round_trips_in_flight(rbroker: RedisBroker) -> None:
    """While Redis runs one batch of concurrent enqueues the next is already on its way: two
    round trips in flight, never more."""
    await rbroker.enqueue(task("warm"))
    wire = rbroker._storage.wire
    flying = most = 0

    def counted(send: Any) -> Any:
        async def run(commands: Any) -> Any:
            nonlocal flying, most
            flying += 1
            most = max(most, flying)
            try:
                return await send(commands)
            finally:
                flying -= 1

        return run

    wire.call, wire.call_many = counted(wire.call), counted(wire.call_many)  # type: ignore[method-assign]

    async def caller(c: int) -> None:
        for i in range(10):
            await rbroker.enqueue(task(f"c{c}-{i}"))

    await asyncio.gather(*(caller(c) for c in range(50)))
    assert most == 2


async def test_a_held_entry_of_the_layout_before_ranks_is_still_let_back(
    rbroker: RedisBroker, clock: FakeClock
) -> None:
    """Held entries read "<key>\\0<rank>\\0<member>" (claim order); one written as
    "<key>\\0<member>" before the rank existed is let back, listed and archived alike."""
    limit = (LimitSpec("k", concurrency=1),)
    for task_id in ("running", "held", "other"):
        await rbroker.enqueue(task(task_id, limits=limit))
        clock.advance(0.001)
    (lease,) = await rbroker.claim(claim_params(["default"]))
    assert await rbroker.claim(claim_params(["default"])) == []  # both held now
    held_key = rbroker._storage.keys.queue("default").held
    redis = raw_redis(rbroker)
    for entry in await redis.zrange(held_key, 0, -1):
        key, _rank, member = entry.split(b"\0")
        await redis.zrem(held_key, entry)
        await redis.zadd(held_key, {key + b"\0" + member: 0})
    listed = await rbroker.admin.list_tasks("default", TaskState.PENDING)
    assert sorted(t.id for t in listed) == ["held", "other"]
    await lifecycle.archive_task(rbroker.admin, "default", "other")
    assert await redis.zcard(held_key) == 1
    assert await rbroker.complete(CompleteParams(lease.ref))
    assert [x.task.id for x in await rbroker.claim(claim_params(["default"]))] == ["held"]
    assert await redis.zcard(held_key) == 0
