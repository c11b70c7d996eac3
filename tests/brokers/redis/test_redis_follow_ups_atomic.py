"""A task archived by the rescuer or the inspector gets its follow-up in the same script as
the archive: whatever instant the connection is cut, the follow-up exists exactly when the
archive happened (there is no second call that a crash could lose)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from redis import exceptions as rex

from durq import continuations, lifecycle
from durq.brokers.base import ClaimParams, EnqueueParams
from durq.brokers.redis import RedisBroker
from durq.clock import FakeClock
from durq.errors import BrokerUnavailableError, TaskNotFoundError
from durq.states import TaskState

LEASE = 30.0
THEN = {
    continuations.HEADER: json.dumps(
        {"type": "test:next", "queue": "default", "on_archived": True, "max_retry": 3}
    )
}
#: Scripts that archive a task outside a worker's own outcome.
ARCHIVING = {"archive", "admin_move"}


def cut(broker: RedisBroker, *, before: bool) -> None:
    """Make the connection fail at the first archiving script call: ``before`` it runs (the
    archive never reaches the server), or right after its reply (every later call fails)."""
    eval_one, eval_many = broker._storage.eval, broker._storage.eval_many
    gone = False

    async def guarded(names: Sequence[str], call: Callable[[], Awaitable[Any]]) -> Any:
        nonlocal gone
        hits = ARCHIVING.intersection(names)
        if gone or (hits and before):
            gone = True
            raise rex.ConnectionError("connection cut by the test")
        reply = await call()
        gone = bool(hits)
        return reply

    async def one(name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return await guarded([name], lambda: eval_one(name, keys, args))

    async def many(calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]) -> list[Any]:
        return await guarded([c[0] for c in calls], lambda: eval_many(calls))

    broker._storage.eval = one  # type: ignore[method-assign]
    broker._storage.eval_many = many  # type: ignore[method-assign]


async def archive_by(actor: str, broker: RedisBroker) -> None:
    if actor == "rescuer":
        await lifecycle.rescue_expired(broker, 1)
    elif actor == "inspector-archive":
        await lifecycle.archive_task(broker.admin, "default", "t")
    else:
        await lifecycle.cancel_task(broker.admin, "default", "t")


@pytest.mark.parametrize("actor", ["rescuer", "inspector-archive", "inspector-cancel"])
@pytest.mark.parametrize("before", [True, False], ids=["cut-before", "cut-after"])
async def test_archive_and_its_follow_up_are_one_step(
    redis_url: str, clock: FakeClock, actor: str, before: bool
) -> None:
    setup = RedisBroker.from_url(redis_url, clock=clock)
    await setup.migrate()
    await setup.enqueue(
        EnqueueParams(id="t", queue="default", type="test:t", payload=b"{}", headers=THEN)
    )
    if actor == "rescuer":
        assert await setup.claim(ClaimParams(["default"], 1, "w", LEASE))
        clock.advance(LEASE + 1)

    victim = RedisBroker.from_url(redis_url, clock=clock)
    cut(victim, before=before)
    try:
        await archive_by(actor, victim)
    except BrokerUnavailableError:
        assert before  # cut after the archive: nothing left to fail
    finally:
        await victim.close()

    archived = (await setup.admin.get_task("default", "t")).state is TaskState.ARCHIVED
    try:
        await setup.admin.get_task("default", "then:t")
        followed = True
    except TaskNotFoundError:
        followed = False
    await setup.close()
    assert archived is (not before)
    assert followed is archived
