"""``rewrite_task`` (``durq encryption rotate``'s write) on every broker: new payload and
result bytes only while the task is in the expected state, not active, and still holds the
bytes the new ones were made from."""

from __future__ import annotations

import pytest
from brokerkit import A, C, P, R, S, X, put, snapshot

from durq.brokers import FullBroker
from durq.brokers.base import TaskRewrite
from durq.clock import FakeClock
from durq.states import TaskState

ALL = {"p": P, "s": S, "a": A, "r": R, "x": X, "c": C}
# Longer than one 64-byte chunk of a Redis task hash, so chunked values are compared whole.
NEW = b'{"durq:encrypted":"v1:k2:' + b"A" * 150 + b'"}'


def change(task_id: str, state: TaskState, payload: bytes, result: bytes | None) -> TaskRewrite:
    return TaskRewrite("default", task_id, state, payload, result, NEW, NEW if result else None)


@pytest.mark.parametrize("task_id", ["p", "s", "r", "x", "c"])
async def test_rewrites_a_task_whose_fences_hold(
    broker: FullBroker, clock: FakeClock, task_id: str
) -> None:
    await put(broker, clock, ALL)
    before = await snapshot(broker)
    info = await broker.admin.get_task("default", task_id)
    assert await broker.admin.rewrite_task(
        change(task_id, info.state, info.raw_payload, info.raw_result)
    )
    after = await broker.admin.get_task("default", task_id)
    assert after.raw_payload == NEW and after.state is info.state
    assert after.raw_result == (NEW if info.raw_result is not None else None)
    assert await snapshot(broker) == before


async def test_refuses_when_a_fence_fails(broker: FullBroker, clock: FakeClock) -> None:
    await put(broker, clock, ALL)
    a = await broker.admin.get_task("default", "a")
    c = await broker.admin.get_task("default", "c")
    p = await broker.admin.get_task("default", "p")
    refused = [
        change("a", A, a.raw_payload, None),  # a worker holds it
        change("p", S, p.raw_payload, None),  # it moved: not in the expected state
        change("p", P, b'{"other":1}', None),  # rewritten meanwhile
        change("c", C, c.raw_payload, b'"other"'),  # its result differs
        change("c", C, c.raw_payload, None),  # it has a result
        change("gone", P, p.raw_payload, None),
    ]
    for rewrite in refused:
        assert not await broker.admin.rewrite_task(rewrite), rewrite
    for task_id, info in (("a", a), ("c", c), ("p", p)):
        now = await broker.admin.get_task("default", task_id)
        assert (now.raw_payload, now.raw_result) == (info.raw_payload, info.raw_result)


async def test_a_completed_task_past_its_retention_counts_as_gone(
    broker: FullBroker, clock: FakeClock
) -> None:
    await put(broker, clock, {"c": C}, retention=10)
    c = await broker.admin.get_task("default", "c")
    clock.advance(11)
    assert not await broker.admin.rewrite_task(change("c", C, c.raw_payload, c.raw_result))
