"""Redis Cluster routing on a real cluster (3 masters, 3 replicas, started by the suite):
hash slots, MOVED and ASK after a slot moves, per-node script caches, the outbox of
follow-ups into another slot, WAIT for replicas, and URL errors. The broker's behaviour on a
cluster is the conformance suite's ``redis-cluster`` kind."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durq.bench.isolation import Isolated
from durq.brokers.base import ClaimParams, CompleteParams, EnqueueParams
from durq.brokers.redis import RedisBroker
from durq.brokers.redis.cluster import key_slot
from durq.brokers.redis.storage import RedisStorage
from durq.errors import BrokerError, ConfigurationError
from durq.states import TaskState
from durq.task import LimitSpec
from servers import RedisCluster, require_redis_cluster, unique_name


@pytest.fixture
async def cbroker(redis_cluster: RedisCluster) -> AsyncIterator[RedisBroker]:
    prefix = unique_name("durqtest")
    broker = RedisBroker.from_url(redis_cluster.url(prefix))
    await broker.migrate()
    yield broker
    await broker.close()
    redis_cluster.delete_prefix(prefix)


def task(task_id: str, queue: str) -> EnqueueParams:
    return EnqueueParams(id=task_id, queue=queue, type="test:task", payload=b"{}")


def node_id(cluster: RedisCluster, port: int) -> str:
    return bytes(cluster.client(port).execute_command("CLUSTER", "MYID")).decode()


def master_of(cluster: RedisCluster, slot: int) -> int:
    for port, ranges in cluster.masters().items():
        if any(start <= slot <= end for start, end in ranges):
            return port
    raise AssertionError(f"slot {slot} has no master")


def other_master(cluster: RedisCluster, port: int) -> int:
    return next(p for p in cluster.masters() if p != port)


def start_migration(cluster: RedisCluster, queue: str) -> tuple[int, int, int]:
    """Start moving ``queue``'s slot to another master: (slot, source port, target port)."""
    slot = key_slot(f"{{{queue}}}")
    source = master_of(cluster, slot)
    target = other_master(cluster, source)
    cluster.client(target).execute_command(
        "CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(cluster, source)
    )
    cluster.client(source).execute_command(
        "CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(cluster, target)
    )
    return slot, source, target


def move_keys(cluster: RedisCluster, slot: int, source: int, target: int) -> None:
    client = cluster.client(source)
    while keys := client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        client.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)


def finish_migration(cluster: RedisCluster, slot: int, target: int) -> None:
    target_id = node_id(cluster, target)
    for port in cluster.masters():
        cluster.client(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)


async def test_key_slots_are_the_servers(redis_cluster: RedisCluster) -> None:
    client = redis_cluster.client(redis_cluster.ports[0])
    keys = [
        "durq:{default}:pending", "durq:queues", "{}", "a{}b", "a{b}c", "{a}{b}", "x{}{y}",
        "{{a}}", "a}b{c", "durq:{é}:t:1", "durq:worker:host-1", "", "{user1000}.following",
    ]  # fmt: skip
    keys += [f"durq:{{q{i}}}:t:{i}" for i in range(200)]
    for key in keys:
        assert key_slot(key) == client.execute_command("CLUSTER", "KEYSLOT", key), key


async def test_commands_go_to_the_master_of_their_slot(redis_cluster: RedisCluster) -> None:
    storage = RedisStorage(redis_cluster.url())
    prefix = unique_name("durqtest")
    keys = [f"{prefix}:{{q{i}}}:k" for i in range(50)]
    try:
        await storage.commands([("SET", key, key) for key in keys])
        assert await storage.commands([("GET", key) for key in keys]) == [k.encode() for k in keys]
        used = set()
        for key in keys:
            port = master_of(redis_cluster, key_slot(key))
            used.add(port)
            # A plain client on that master, with no redirection, has the key.
            assert redis_cluster.client(port).execute_command("GET", key) == key.encode()
        assert len(used) == 3  # the keys spread over every master
    finally:
        await storage.close()
        redis_cluster.delete_prefix(prefix)


async def test_a_moved_queue_is_followed(redis_cluster: RedisCluster, cbroker: RedisBroker) -> None:
    """A queue's slot moves to another master while a broker is connected: MOVED replies
    update its slot map; enqueue, claim and complete go on without a reconnect."""
    queue = unique_name("moving")
    await cbroker.enqueue(task("before", queue))
    slot, source, target = start_migration(redis_cluster, queue)
    move_keys(redis_cluster, slot, source, target)
    finish_migration(redis_cluster, slot, target)
    await cbroker.enqueue(task("after", queue))
    leases = await cbroker.claim(ClaimParams([queue], 2, "w", 60.0))
    assert [lease.task.id for lease in leases] == ["before", "after"]
    for lease in leases:
        assert await cbroker.complete(CompleteParams(lease.ref, None, 60))
    assert redis_cluster.client(target).execute_command(
        "EXISTS", f"{cbroker.prefix}:{{{queue}}}:t:after"
    )
    stats = await cbroker.admin.queue_stats(queue)
    assert stats.sizes[TaskState.COMPLETED] == 2


async def test_ask_during_a_migration_reaches_the_key(
    redis_cluster: RedisCluster, cbroker: RedisBroker
) -> None:
    """Halfway through a migration a key already moved is answered by ASK: the call goes to
    the importing node with ASKING, and the slot map is left as it is."""
    queue = unique_name("asking")
    await cbroker.enqueue(task("t1", queue))
    slot, source, target = start_migration(redis_cluster, queue)
    try:
        move_keys(redis_cluster, slot, source, target)
        info = await cbroker.admin.get_task(queue, "t1")
        assert info.state is TaskState.PENDING
    finally:
        finish_migration(redis_cluster, slot, target)
    assert (await cbroker.claim(ClaimParams([queue], 1, "w", 60.0)))[0].task.id == "t1"


async def test_a_script_over_a_half_moved_slot_waits_for_the_move(
    redis_cluster: RedisCluster, cbroker: RedisBroker
) -> None:
    """A script whose keys are split between two nodes mid-migration is refused (TRYAGAIN on
    the importing node, ASK from the other); the call retries until the move is over."""
    queue = unique_name("split")
    await cbroker.enqueue(task("t1", queue))
    slot, source, target = start_migration(redis_cluster, queue)
    try:
        # Only the pending zset moves: the task hash stays behind.
        pending = f"{cbroker.prefix}:{{{queue}}}:pending"
        redis_cluster.client(source).execute_command(
            "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", pending
        )
        claim = asyncio.create_task(cbroker.claim(ClaimParams([queue], 1, "w", 60.0)))
        await asyncio.sleep(0.5)
        assert not claim.done()  # retrying, not failed
        move_keys(redis_cluster, slot, source, target)
    finally:
        finish_migration(redis_cluster, slot, target)
    (lease,) = await asyncio.wait_for(claim, 15)
    assert lease.task.id == "t1"


async def test_a_node_without_the_scripts_gets_them(
    redis_cluster: RedisCluster, cbroker: RedisBroker
) -> None:
    await cbroker.enqueue(task("a", "default"))
    for port in redis_cluster.masters():
        redis_cluster.client(port).execute_command("SCRIPT", "FLUSH")
    await cbroker.enqueue(task("b", "default"))
    leases = await cbroker.claim(ClaimParams(["default"], 5, "w", 60.0))
    assert [lease.task.id for lease in leases] == ["a", "b"]


async def test_a_batch_on_a_node_without_its_scripts_runs_in_order(
    redis_cluster: RedisCluster,
) -> None:
    """A new connection does not know what each node's script cache holds: the scripts of a
    batch are loaded ahead of it, so its calls run in the order given (the completion, then
    the claim that takes the slot it frees), never the refused one after the rest."""
    prefix = unique_name("durqtest")
    url = redis_cluster.url(prefix)
    setup = RedisBroker.from_url(url)
    try:
        await setup.migrate()
        for task_id in ("k0", "k1"):
            await setup.enqueue(
                dataclasses.replace(task(task_id, "default"), limits=(LimitSpec("k", 1),))
            )
        (lease,) = await setup.claim(ClaimParams(["default"], 2, "w", 60.0))
        for port in redis_cluster.masters():
            redis_cluster.client(port).execute_command("SCRIPT", "FLUSH")
        fresh = RedisBroker.from_url(url)
        try:
            # The claim script is back on the node (a claim ran), the complete script not.
            assert await fresh.claim(ClaimParams(["default"], 2, "w", 60.0)) == []
            done, leases = await fresh.complete_and_claim(
                [CompleteParams(lease.ref)], ClaimParams(["default"], 2, "w", 60.0)
            )
        finally:
            await fresh.close()
        assert done == [True]
        assert [x.task.id for x in leases] == ["k1"]
    finally:
        await setup.close()
        redis_cluster.delete_prefix(prefix)


async def test_follow_up_left_in_the_outbox_is_created_once(
    redis_cluster: RedisCluster, cbroker: RedisBroker
) -> None:
    """A follow-up into another slot is kept in the source queue's outbox by the script that
    completes the task. If the process stops before it is moved (simulated: the script alone
    runs), the next promote_due creates it; a drain run twice creates it once."""
    assert key_slot("{default}") != key_slot("{mail}")
    await cbroker.enqueue(task("a", "default"))
    (lease,) = await cbroker.claim(ClaimParams(["default"], 1, "w", 60.0))
    follow = task("then:a", "mail")
    done = CompleteParams(lease.ref, None, 60, (follow,))
    s = cbroker._storage
    assert await s.eval(*cbroker._complete_call(done, s.clock.now()))
    outbox = s.keys.queue("default").outbox
    entries = await s.command("HGETALL", outbox)
    assert len(entries) == 2
    with pytest.raises(Exception, match="no task"):
        await cbroker.admin.get_task("mail", "then:a")
    await cbroker.promote_due()
    assert (await cbroker.admin.get_task("mail", "then:a")).state is TaskState.PENDING
    assert await s.command("HLEN", outbox) == 0
    # A drain that stopped after creating it, before deleting the entry: run it again.
    await s.command("HSET", outbox, *entries)
    assert await s.drain_outboxes(["default"]) == 1
    assert await s.command("HLEN", outbox) == 0
    assert len(await cbroker.admin.list_tasks("mail", TaskState.PENDING)) == 1


async def test_wait_replicas_confirms_or_fails(redis_cluster: RedisCluster) -> None:
    prefix = unique_name("durqtest")
    one = RedisBroker.from_url(redis_cluster.url(prefix) + "&wait_replicas=1")
    two = RedisBroker.from_url(redis_cluster.url(prefix) + "&wait_replicas=2&wait_timeout=50")
    try:
        await one.enqueue(task("a", "default"))  # each master has one replica
        with pytest.raises(BrokerError, match="1 of 2 replicas"):
            await two.enqueue(task("b", "default"))
    finally:
        await one.close()
        await two.close()
        redis_cluster.delete_prefix(prefix)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://127.0.0.1/", "host:port"),
        ("redis+cluster://127.0.0.1:7000,:7001/", "host:port"),
        ("redis+cluster://127.0.0.1:7000/3", "only database 0"),
        ("redis+cluster://127.0.0.1:7000/?wait_replicas=x", "invalid Redis Cluster URL"),
        (
            "redis+cluster://127.0.0.1:7000/?cluster_retry=-1",
            "cluster_retry must be a duration from 0",
        ),
        ("redis+cluster://127.0.0.1:7000/?cluster_retry=nan", "cluster_retry must be a duration"),
    ],
)
def test_bad_cluster_urls_are_configuration_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RedisBroker.from_url(url)


async def test_a_tls_cluster(tmp_path: Path) -> None:
    """``rediss+cluster://``: clients, the cluster bus and replication speak only TLS; tasks
    of queues on every master, a follow-up into another master's queue and a wake-up."""
    require_redis_cluster()
    cluster = RedisCluster(tmp_path / "tls-cluster", tls=True)
    broker = RedisBroker.from_url(cluster.url("tls"))
    try:
        await broker.migrate()
        queues = ["default", "mail", "q1", "q2", "q3", "q4"]
        masters = {master_of(cluster, key_slot(f"{{{q}}}")) for q in queues}
        assert len(masters) == 3
        for q in queues:
            await broker.enqueue(task(f"{q}-1", q))
        leases = await broker.claim(ClaimParams(queues, 10, "w", 60.0))
        assert sorted(lease.task.id for lease in leases) == sorted(f"{q}-1" for q in queues)
        first = next(lease for lease in leases if lease.task.queue == "default")
        follow = task("then", "mail")
        assert await broker.complete(CompleteParams(first.ref, None, 60, (follow,)))
        assert await broker.wait_for_work(["mail"], 5.0)
        (lease,) = await broker.claim(ClaimParams(["mail"], 1, "w", 60.0))
        assert lease.task.id == "then"
    finally:
        await broker.close()
        cluster.close()


async def test_bench_isolation_cleans_every_master(redis_cluster: RedisCluster) -> None:
    """``durq bench --broker redis+cluster://...`` removes its keys from every master."""
    place = Isolated.create(redis_cluster.url())
    await place.prepare()
    broker = RedisBroker.from_url(place.url)
    try:
        for q in ("default", "mail", "q1", "q2", "q3", "q4"):
            await broker.enqueue(task("t", q))
    finally:
        await broker.close()

    def left() -> int:
        return sum(
            len(list(redis_cluster.client(p).scan_iter(match=f"{place.name}:*")))
            for p in redis_cluster.masters()
        )

    assert left() > 6
    await place.cleanup()
    assert left() == 0
