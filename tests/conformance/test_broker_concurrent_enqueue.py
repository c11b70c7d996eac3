"""Concurrent single enqueues, as a web server's handlers make them: brokers may send the
calls that arrive while a round trip is in flight together, but every caller keeps the
answer it would have had alone (E3, E4, E9), with every option of its task, and a call
inside a caller's transaction stays in that transaction (E8)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from brokerkit import P, S, params, picture, snapshot

from durq.brokers import FullBroker
from durq.brokers.base import CAP_TRANSACTIONAL_ENQUEUE, EnqueueParams
from durq.clock import FakeClock
from durq.errors import DuplicateTaskError, TaskIDConflictError
from durq.task import LimitSpec, TaskInfo


async def enqueue_all(broker: FullBroker, items: list[EnqueueParams]) -> list[Any]:
    """Every item by its own concurrent ``enqueue`` call: a TaskInfo or the exception."""
    return await asyncio.gather(*(broker.enqueue(p) for p in items), return_exceptions=True)


async def test_E3_E4_concurrent_callers_each_get_their_own_answer(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("held"))
    items = [params(f"t{i}", payload={"call": i}) for i in range(150)]
    # The same ids again (a retried request), then an id that exists already.
    items += [params(f"t{i}", payload={"call": 150 + i}) for i in range(40)]
    items += [params("held", payload={"call": 190})]
    # Nine calls for one unique key: the first is created, the others are duplicates of it.
    items += [params(f"u{i}", unique_key="k", unique_ttl=60) for i in range(9)]
    assert len(items) == 200
    answers = await enqueue_all(broker, items)

    for i, answer in enumerate(answers[:150]):
        assert isinstance(answer, TaskInfo), (i, answer)
        assert (answer.id, answer.state) == (f"t{i}", P)
        assert answer.payload == {"call": i}
    for i, answer in enumerate(answers[150:190]):
        assert isinstance(answer, TaskIDConflictError), (i, answer)
        assert answer.existing is not None and answer.existing.id == f"t{i}"
        assert answer.existing.payload == {"call": i}
    assert isinstance(answers[190], TaskIDConflictError)
    assert answers[190].existing is not None and answers[190].existing.id == "held"
    assert isinstance(answers[191], TaskInfo) and answers[191].id == "u0"
    for answer in answers[192:]:
        assert isinstance(answer, DuplicateTaskError), answer
        assert answer.existing_id == "u0"
    assert (await broker.admin.get_task("default", "t7")).payload == {"call": 7}
    assert await snapshot(broker) == picture(
        pending=" ".join(["held", *(f"t{i}" for i in range(150)), "u0"])
    )


async def test_E9_an_error_in_one_call_does_not_fail_the_others(broker: FullBroker) -> None:
    # A queue name the edge would refuse: what this broker answers for it alone...
    alone: Any
    try:
        alone = await broker.enqueue(params("bad0", "bad queue!"))
    except Exception as exc:
        alone = exc
    # ...is what it answers among 30 good calls, which are all created.
    items = [params(f"g{i}") for i in range(15)]
    items += [params("bad1", "bad queue!")]
    items += [params(f"g{i}") for i in range(15, 30)]
    answers = await enqueue_all(broker, items)
    bad = answers.pop(15)
    assert type(bad) is type(alone)
    assert all(isinstance(a, TaskInfo) for a in answers), answers
    assert await snapshot(broker) == picture(pending=" ".join(f"g{i}" for i in range(30)))


async def test_E9_concurrent_calls_keep_every_option(broker: FullBroker, clock: FakeClock) -> None:
    items = [
        params(
            f"o{i}",
            payload={"n": i},
            max_retry=i,
            timeout=float(i + 1),
            deadline=clock.now() + 1000 + i,
            retention=float(10 * i),
            priority=i - 10,
            headers={"h": str(i)},
            process_in=60.0 if i % 3 == 0 else None,
            limits=(LimitSpec(f"key{i % 2}", concurrency=2),),
        )
        for i in range(20)
    ]
    answers = await enqueue_all(broker, items)
    for p, answer in zip(items, answers, strict=True):
        assert isinstance(answer, TaskInfo), answer
        stored = await broker.admin.get_task("default", p.id)
        for info in (answer, stored):
            assert info.state is (S if p.process_in else P)
            assert (info.max_retry, info.timeout, info.retention) == (
                p.max_retry,
                p.timeout,
                p.retention,
            )
            assert info.priority == p.priority
            assert info.headers == p.headers
            assert info.limits == p.limits
            assert info.payload == {"n": int(p.id[1:])}
            assert info.deadline is not None and p.deadline is not None
            assert info.deadline.timestamp() == pytest.approx(p.deadline)
        assert answer.next_process_at == stored.next_process_at


async def test_E8_a_call_in_a_transaction_is_not_sent_with_others(broker: FullBroker) -> None:
    from conformance.test_broker_transactional import caller

    if CAP_TRANSACTIONAL_ENQUEUE not in broker.capabilities:
        pytest.skip(f"{broker.name} lacks capability {CAP_TRANSACTIONAL_ENQUEUE!r}")
    async with caller(broker) as c:

        async def in_transaction() -> TaskInfo:
            info = await broker.enqueue(params("in-tx"), connection=c.conn)
            await c.rollback()  # at once: SQLite's other writers wait for this transaction
            return info

        others = [broker.enqueue(params(f"n{i}")) for i in range(20)]
        answers = await asyncio.gather(*others[:10], in_transaction(), *others[10:])
        assert all(isinstance(a, TaskInfo) for a in answers)
    # The caller's rollback took its task; the others were committed on their own.
    assert await snapshot(broker) == picture(pending=" ".join(f"n{i}" for i in range(20)))
