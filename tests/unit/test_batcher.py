"""How :func:`durq.brokers.batcher.enqueue_coalescer` groups calls into round trips, watched
through the round trips it asks for (the brokers' own behaviour is in tests/conformance)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from durq.brokers.base import EnqueueOutcome, EnqueueParams
from durq.brokers.batcher import enqueue_coalescer
from durq.clock import to_datetime
from durq.errors import BrokerUnavailableError
from durq.states import TaskState
from durq.task import TaskInfo, make_info


def item(task_id: str) -> EnqueueParams:
    return EnqueueParams(id=task_id, queue="q", type="t", payload=b"{}")


def info_of(p: EnqueueParams) -> TaskInfo:
    at = to_datetime(0.0)
    return make_info(
        id=p.id,
        queue=p.queue,
        type=p.type,
        raw_payload=p.payload,
        state=TaskState.PENDING,
        max_retry=0,
        next_process_at=at,
        enqueued_at=at,
    )


class Store:
    """Round trips of one event-loop pass each; records what each carried."""

    def __init__(self, *, down: bool = False) -> None:
        self.trips: list[list[str]] = []
        self.down = down
        #: Cleared: round trips wait until it is set again.
        self.open = asyncio.Event()
        self.open.set()

    async def one(self, p: EnqueueParams) -> TaskInfo:
        self.trips.append([p.id])
        await self.open.wait()
        await asyncio.sleep(0)
        if self.down:
            raise BrokerUnavailableError("down")
        if p.id.startswith("bad"):
            raise ValueError(p.id)
        return info_of(p)

    async def many(self, items: Sequence[EnqueueParams]) -> list[EnqueueOutcome]:
        self.trips.append([p.id for p in items])
        await self.open.wait()
        await asyncio.sleep(0)
        if self.down:
            raise BrokerUnavailableError("down")
        if any(p.id.startswith("bad") for p in items):
            raise ValueError("a bad item")
        return [EnqueueOutcome(p, info=info_of(p)) for p in items]


async def test_a_lone_caller_is_sent_alone_and_at_once() -> None:
    store = Store()
    batcher = enqueue_coalescer(store.one, store.many)
    for i in range(5):
        assert (await batcher.send(item(f"t{i}"))).id == f"t{i}"
    assert store.trips == [[f"t{i}"] for i in range(5)]


async def test_calls_made_during_a_round_trip_go_together() -> None:
    store = Store()
    batcher = enqueue_coalescer(store.one, store.many)

    async def caller(c: int) -> list[str]:
        return [(await batcher.send(item(f"c{c}-{i}"))).id for i in range(4)]

    answers = await asyncio.gather(*(caller(c) for c in range(50)))
    assert answers == [[f"c{c}-{i}" for i in range(4)] for c in range(50)]
    # The first call alone; then every round trip carries the next call of all 50 callers
    # (the first caller's second call joins the 49 that waited; it finishes first).
    assert [len(t) for t in store.trips] == [1, 50, 50, 50, 49]


async def test_a_failing_batch_is_sent_again_call_by_call() -> None:
    store = Store()
    batcher = enqueue_coalescer(store.one, store.many)
    answers = await asyncio.gather(
        *(batcher.send(item(i)) for i in ("a", "b", "bad", "c")), return_exceptions=True
    )
    assert [a.id for a in answers if isinstance(a, TaskInfo)] == ["a", "b", "c"]
    assert isinstance(answers[2], ValueError)


async def test_an_unreachable_broker_fails_every_caller_once() -> None:
    store = Store(down=True)
    batcher = enqueue_coalescer(store.one, store.many)
    answers = await asyncio.gather(
        *(batcher.send(item(f"t{i}")) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(a, BrokerUnavailableError) for a in answers)
    assert [len(t) for t in store.trips] == [1, 4]  # not re-sent call by call


async def test_a_cancelled_call_is_not_sent() -> None:
    store = Store()
    batcher = enqueue_coalescer(store.one, store.many)
    store.open.clear()
    first = asyncio.ensure_future(batcher.send(item("first")))
    await asyncio.sleep(0)  # in flight, held
    gone = asyncio.ensure_future(batcher.send(item("gone")))
    kept = asyncio.ensure_future(batcher.send(item("kept")))
    await asyncio.sleep(0)
    gone.cancel()
    store.open.set()
    assert (await first).id == "first"
    assert (await kept).id == "kept"
    assert gone.cancelled()
    assert store.trips == [["first"], ["kept"]]
