"""The acker batches concurrent acks into one round trip and sends a lone ack at once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from durq.brokers.base import CompleteParams, LeaseRef
from durq.errors import BrokerUnavailableError
from durq.worker.acker import Acker


class RecordingBroker:
    """Records complete_many batches; the first call is slow so others pile up behind it."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.fail = fail
        self.release = asyncio.Event()

    async def complete_many(self, items: Sequence[CompleteParams]) -> list[bool]:
        self.batches.append([p.lease.id for p in items])
        if len(self.batches) == 1:
            await self.release.wait()
        if self.fail:
            raise BrokerUnavailableError(operation="test.complete_many")
        return [p.lease.token == "ok" for p in items]


def params(task_id: str, token: str = "ok") -> CompleteParams:
    return CompleteParams(LeaseRef("default", task_id, token))


async def test_concurrent_acks_ride_one_round_trip() -> None:
    broker = RecordingBroker()
    acker = Acker(broker)  # type: ignore[arg-type]
    first = asyncio.create_task(acker.complete(params("a")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    rest = [
        asyncio.create_task(acker.complete(params(t, tok)))
        for t, tok in [("b", "ok"), ("c", "stale"), ("d", "ok")]
    ]
    await asyncio.sleep(0)
    broker.release.set()
    assert await first is True
    assert [await r for r in rest] == [True, False, True]
    assert broker.batches == [["a"], ["b", "c", "d"]]


async def test_lone_ack_is_not_delayed_and_errors_reach_the_caller() -> None:
    broker = RecordingBroker(fail=True)
    broker.release.set()
    acker = Acker(broker)  # type: ignore[arg-type]
    try:
        await acker.complete(params("a"))
    except BrokerUnavailableError:
        pass
    else:
        raise AssertionError("the broker error must reach the caller")
    assert broker.batches == [["a"]]


class ShortAnswerBroker:
    async def complete_many(self, items: Sequence[CompleteParams]) -> list[bool]:
        return [True] * (len(items) - 1)  # a broker bug: one answer missing


async def test_a_wrong_number_of_answers_fails_the_callers_instead_of_hanging() -> None:
    from durq.errors import BrokerError

    acker = Acker(ShortAnswerBroker())  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(acker.complete(params("a")), 5)
    except BrokerError:
        pass
    else:
        raise AssertionError("the caller must get the error")


async def test_carried_acks_wait_for_the_claim_and_go_alone_when_it_idles() -> None:
    broker = RecordingBroker()
    broker.release.set()
    woken: list[int] = []
    stored: list[str] = []
    acker = Acker(
        broker,  # type: ignore[arg-type]
        on_waiting=lambda: woken.append(1),
        on_stored=lambda acks: stored.extend(p.lease.id for p in acks),
    )
    acker.carry()
    a = asyncio.create_task(acker.complete(params("a")))
    b = asyncio.create_task(acker.complete(params("b", "stale")))
    await asyncio.sleep(0)
    assert broker.batches == [] and acker.waiting == 2 and len(woken) == 2
    batch = acker.take()
    acker.answer(batch, [True, False])  # as the fetcher does with complete_and_claim's answer
    assert (await a, await b) == (True, False)
    assert stored == ["a", "b"]
    c = asyncio.create_task(acker.complete(params("c")))
    await asyncio.sleep(0)
    assert broker.batches == []
    acker.send_alone()  # the fetcher waits for work: what waits goes out at once
    assert await c is True
    assert broker.batches == [["c"]]


async def test_an_idle_fetchers_acks_go_alone_unless_they_may_make_work() -> None:
    """While the fetcher waits for work, a plain ack goes out at once on its own (a claim
    with it would find the queues as the last claim left them); one whose completion may
    make work (a limited task, follow-ups, a group member) wakes the fetcher instead."""
    broker = RecordingBroker()
    broker.release.set()
    woken: list[int] = []
    acker = Acker(broker, on_waiting=lambda: woken.append(1))  # type: ignore[arg-type]
    acker.on_arrival = lambda: woken.append(2)
    acker.carry()  # a claim is in flight: acks wait for the next one
    a = asyncio.create_task(acker.complete(params("a")))
    b = asyncio.create_task(acker.complete(params("b")))
    await asyncio.sleep(0)
    assert acker.waiting == 2 and not acker.worth_a_claim()
    woken.clear()
    acker.idle()  # the claim came back short: what waits goes alone, as do later plain acks
    assert (await a, await b) == (True, True)
    c = asyncio.create_task(acker.complete(params("c")))
    assert await c is True
    assert broker.batches == [["a", "b"], ["c"]] and woken == []
    limited = CompleteParams(LeaseRef("default", "d", "ok"), limited=True)
    d = asyncio.create_task(acker.complete(limited))
    await asyncio.sleep(0)
    assert woken == [2, 1] and acker.waiting == 1 and acker.worth_a_claim()
    assert broker.batches == [["a", "b"], ["c"]]  # it waits for the fetcher's claim
    acker.carry()
    acker.answer(acker.take(), [True])
    assert await d is True


async def test_an_idle_fetchers_flush_leaves_an_ack_that_may_make_work_to_its_claim() -> None:
    """A limited task's ack that arrives while a plain one is in flight alone waits for the
    claim it woke the fetcher for, rather than going alone in the flusher's next batch."""
    broker = RecordingBroker()  # its first batch waits for release
    woken: list[int] = []
    acker = Acker(broker)  # type: ignore[arg-type]
    acker.on_arrival = lambda: woken.append(1)
    acker.idle()
    plain = asyncio.create_task(acker.complete(params("a")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert broker.batches == [["a"]]  # in flight
    limited = CompleteParams(LeaseRef("default", "d", "ok"), limited=True)
    d = asyncio.create_task(acker.complete(limited))
    await asyncio.sleep(0)
    broker.release.set()
    assert await plain is True
    await asyncio.sleep(0)
    assert broker.batches == [["a"]] and woken == [1] and acker.waiting == 1
    acker.carry()  # the woken fetcher claims with it
    acker.answer(acker.take(), [True])
    assert await d is True
