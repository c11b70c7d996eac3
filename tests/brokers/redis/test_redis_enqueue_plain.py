"""enqueue_plain.lua, the single enqueue of a plain task: it must store what enqueue.lua
stores for the same params, and leave every other task to enqueue.lua."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from durq.brokers.base import EnqueueParams
from durq.brokers.redis import RedisBroker
from durq.clock import FakeClock
from durq.errors import TaskIDConflictError
from durq.states import TaskState
from durq.task import LimitSpec
from servers import raw_redis


def task(task_id: str, **kw: Any) -> EnqueueParams:
    kw.setdefault("payload", b'{"n":1}')
    return EnqueueParams(id=task_id, queue="default", type="test:task", **kw)


def scripts_sent(broker: RedisBroker) -> list[str]:
    """The names of the scripts the broker sends from now on, in order."""
    wire = broker._storage.wire
    by_sha = {s.sha: name for name, s in broker._storage.scripts.items()}
    sent: list[str] = []
    call = wire.call

    async def counted(command: Any) -> Any:
        if command[0] == "EVALSHA":
            sent.append(by_sha[command[1]])
        return await call(command)

    wire.call = counted  # type: ignore[method-assign]
    return sent


PLAIN = [
    {},
    {"timeout": 90.0},
    {"retention": 0.0},
    {"retention": 3600.0, "max_retry": 3},
    {"payload": b'{"text":"' + b"x" * 300 + b'"}'},  # stored in chunks
    {"payload": b'{"text":"' + b"y" * 20_000 + b'"}'},  # stored whole
]


@pytest.mark.parametrize("options", PLAIN)
async def test_the_plain_script_stores_what_enqueue_lua_stores(
    rbroker: RedisBroker, clock: FakeClock, options: dict[str, Any]
) -> None:
    await rbroker.enqueue(task("warm"))  # connected, queue known
    sent = scripts_sent(rbroker)
    storage = rbroker._storage
    plain, general = task("plain", **options), task("general", **options)
    assert storage.plain_call(plain) is not None
    info = await rbroker.enqueue(plain)
    assert sent == ["enqueue_plain"]
    call, state = storage.enqueue_call(general, clock.now())
    assert isinstance(await storage.eval(*call), bytes) and state is TaskState.PENDING

    r = raw_redis(rbroker)
    k = storage.keys.queue("default")
    stored = {key: await r.hgetall(k.task(key)) for key in ("plain", "general")}
    members = {key: stored[key].pop(b"m") for key in stored}
    assert stored["plain"].pop(b"id") == b"plain" and stored["general"].pop(b"id") == b"general"
    assert stored["plain"] == stored["general"]
    scores = {key: await r.zscore(k.pending, members[key]) for key in stored}
    assert scores["plain"] == scores["general"] == clock.now()
    # Enqueue order: the plain task took the sequence number before the general one.
    assert members["plain"] < members["general"]
    # What the client answers is what a read of the task gives.
    read = await rbroker.admin.get_task("default", "plain")
    assert dataclasses.replace(info, headers={}) == dataclasses.replace(read, headers={})


@pytest.mark.parametrize(
    "options",
    [
        {"priority": 5},
        {"headers": {"k": "v"}},
        {"unique_key": "k", "unique_ttl": 60.0},
        {"limits": (LimitSpec("acct", concurrency=1),)},
        {"process_in": 60.0},
        {"process_at": 2_000_000_000.0},
        {"deadline": 2_000_000_000.0},
        {"after": (("default", "other"),)},
    ],
)
def test_other_tasks_take_enqueue_lua(rbroker: RedisBroker, options: dict[str, Any]) -> None:
    assert rbroker._storage.plain_call(task("t", **options)) is None


async def test_a_taken_id_goes_to_enqueue_lua_which_decides(
    rbroker: RedisBroker, clock: FakeClock
) -> None:
    await rbroker.enqueue(task("warm"))
    first = await rbroker.enqueue(task("same"))
    sent = scripts_sent(rbroker)
    with pytest.raises(TaskIDConflictError) as caught:
        await rbroker.enqueue(task("same", payload=b'{"n":2}'))
    assert caught.value.existing is not None
    assert caught.value.existing.raw_payload == first.raw_payload
    # The plain script wrote nothing and left the answer to enqueue.lua.
    assert sent == ["enqueue_plain", "enqueue"]
    pending = await rbroker.admin.list_tasks("default", TaskState.PENDING, limit=10)
    assert sorted(t.id for t in pending) == ["same", "warm"]
