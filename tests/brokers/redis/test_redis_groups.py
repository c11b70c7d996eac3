"""Groups of the maximum size on Redis. Lua's stack holds about 8,000 values, and a script
that fails keeps the writes it made before the error: the scripts that write or read a whole
group pass its lists to Redis in slices, and a refused group leaves every key as it was."""

from __future__ import annotations

from typing import Any

import pytest

import durq
from conformance.apps import check_group_made_before_upgrade
from durq import EnqueueRequest, groups
from durq.brokers.redis import RedisBroker
from durq.clock import FakeClock
from durq.errors import DurqError
from durq.states import TaskState
from servers import raw_redis


async def _picture(rbroker: RedisBroker) -> dict[bytes, bytes | None]:
    """Every key under the broker's prefix with its serialized value."""
    raw = raw_redis(rbroker)
    keys = [k async for k in raw.scan_iter(match=f"{rbroker.prefix}:*", count=1000)]
    return {k: await raw.dump(k) for k in keys}


def _group(
    app: durq.App, group_id: str, last: EnqueueRequest, process_in: float | None = None
) -> groups.GroupParams:
    members = [
        app.params(EnqueueRequest("m:x", {"i": i}, process_in=process_in))
        for i in range(groups.MAX_MEMBERS - 1)
    ]
    members.append(app.params(last))
    return groups.build(group_id, members, "m:merge", app, retention=60, max_payload=1 << 20)


async def test_a_group_of_the_maximum_refused_at_its_last_member_changes_no_key(
    rbroker: RedisBroker,
) -> None:
    app = durq.App(rbroker)
    await app.enqueue("m:x", {}, task_id="taken")
    await app.enqueue("m:x", {"u": 1}, unique=3600)
    before = await _picture(rbroker)
    refused: list[tuple[EnqueueRequest, type[DurqError]]] = [
        (EnqueueRequest("m:x", {}, task_id="taken"), durq.TaskIDConflictError),
        (EnqueueRequest("m:x", {"u": 1}, unique=3600), durq.DuplicateTaskError),
    ]
    for n, (last, error) in enumerate(refused):
        try:
            await rbroker.enqueue_group(_group(app, f"refused{n}", last))
        except error:
            pass
        else:
            raise AssertionError(f"{error.__name__} expected")
    assert await _picture(rbroker) == before


async def test_deleting_every_member_of_the_maximum_leaves_no_task_key(
    rbroker: RedisBroker,
) -> None:
    """The bulk delete releases the group through the last member: every member's key goes,
    the follow-up and the group's record (until its retention) stay."""
    app = durq.App(rbroker)
    last = EnqueueRequest("m:x", {"i": "last"}, process_in=3600)
    await rbroker.enqueue_group(_group(app, "full", last, process_in=3600))
    assert await rbroker.admin.move_all("default", TaskState.SCHEDULED, None) == groups.MAX_MEMBERS
    qk = rbroker._storage.keys.queue("default")
    raw = raw_redis(rbroker)
    tasks = [k async for k in raw.scan_iter(match=f"{qk.task_prefix}*", count=1000)]
    assert tasks == [qk.task("group:full").encode()]
    group = qk.group("full")
    assert await raw.exists(group, f"{group}:e", f"{group}:s") == 3
    info = await rbroker.admin.get_group("default", "full")
    assert info.by_state == {"deleted": groups.MAX_MEMBERS}


async def test_a_group_wakes_its_queue_once(rbroker: RedisBroker) -> None:
    """One wake-up message for a group's pending members (E9), as for a batch: a group of
    10,000 must not send 10,000 messages to every subscribed worker."""
    app = durq.App(rbroker)
    channel = rbroker._storage.keys.queue("default").notify
    pubsub = raw_redis(rbroker).pubsub()
    await pubsub.subscribe(channel)
    try:
        await app.enqueue_group([EnqueueRequest("m:x", {"i": i}) for i in range(50)])
        await raw_redis(rbroker).publish(channel, "end")  # after the script's messages
        got: list[bytes] = []
        while not got or got[-1] != b"end":
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=10)
            if message is not None:
                got.append(message["data"])
        assert got == [b"1", b"end"]
    finally:
        await pubsub.aclose()


async def test_a_group_refused_by_a_full_server_leaves_no_key(private_redis: Any) -> None:
    """A Redis past its ``maxmemory`` (noeviction) refuses a script's first write: the group
    script checks everything before it, so nothing of the group exists; with room again
    the same group is created whole."""
    server = private_redis()
    broker = RedisBroker.from_url(server.url, clock=FakeClock())
    try:
        await broker.migrate()
        app = durq.App(broker)
        await app.enqueue("m:x", {}, task_id="seed")  # the queue is known, the scripts loaded
        params = _group(app, "g", EnqueueRequest("m:x", {"i": "last"}))
        raw = raw_redis(broker)
        before = await _picture(broker)
        await raw.config_set("maxmemory-policy", "noeviction")
        await raw.config_set("maxmemory", 1)
        try:
            with pytest.raises(DurqError, match="OOM"):
                await broker.enqueue_group(params)
        finally:
            await raw.config_set("maxmemory", 0)
        assert await _picture(broker) == before
        await broker.enqueue_group(params)
        info = await broker.admin.get_group("default", "g")
        assert (info.total, info.by_state) == (groups.MAX_MEMBERS, {"pending": groups.MAX_MEMBERS})
    finally:
        await broker.close()


async def test_a_group_made_before_the_follow_up_waited_still_fans_in(
    rbroker: RedisBroker,
) -> None:
    async def downgrade(group_id: str) -> None:
        await raw_redis(rbroker).hdel(rbroker._storage.keys.queue("default").group(group_id), "w")

    await check_group_made_before_upgrade(rbroker, downgrade)
