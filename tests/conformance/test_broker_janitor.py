"""Retention (E5) and the janitor: completed tasks live exactly as long as their retention."""

from __future__ import annotations

import pytest
from brokerkit import C, claim, params, picture, put, snapshot

import durq
from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import CompleteParams
from durq.clock import FakeClock
from durq.errors import TaskNotFoundError
from durq.options import DEFAULT_RETENTION


async def test_E5_janitor_deletes_only_after_retention(
    broker: FullBroker, clock: FakeClock
) -> None:
    await put(broker, clock, {"short": C}, retention=10)
    await put(broker, clock, {"long": C}, retention=100)
    await broker.enqueue(params("waiting"))
    clock.advance(9)
    assert await broker.delete_expired(100) == 0
    assert await snapshot(broker) == picture(completed="long short", pending="waiting")
    clock.advance(1)
    assert await broker.delete_expired(100) == 1
    assert await snapshot(broker) == picture(completed="long", pending="waiting")
    clock.advance(90)
    assert await broker.delete_expired(100) == 1
    assert await snapshot(broker) == picture(pending="waiting")


async def test_E5_janitor_batch_is_bounded(broker: FullBroker, clock: FakeClock) -> None:
    for i in range(7):
        await broker.enqueue(params(f"t{i}"))
    for lease in await claim(broker, limit=7):
        assert await broker.complete(CompleteParams(lease.ref, retention=5))
    clock.advance(5)
    assert await broker.delete_expired(3) == 3
    assert await broker.delete_expired(3) == 3
    assert await broker.delete_expired(3) == 1
    assert await broker.delete_expired(3) == 0


async def test_E5_past_retention_is_gone_before_the_janitor(
    broker: FullBroker, clock: FakeClock
) -> None:
    await put(broker, clock, {"t": C}, retention=10)
    assert (await broker.admin.get_task("default", "t")).state is C
    clock.advance(10)
    with pytest.raises(TaskNotFoundError):
        await broker.admin.get_task("default", "t")


async def test_E5_default_retention_keeps_a_result_an_hour_then_the_janitor_deletes_it(
    broker: FullBroker, clock: FakeClock
) -> None:
    app = durq.App(broker, clock=clock)
    info = await app.enqueue("test:task", {})  # no retention given: the default
    assert info.retention == DEFAULT_RETENTION == 3600
    (lease,) = await claim(broker)
    assert lease.task.retention == DEFAULT_RETENTION
    assert await broker.complete(lifecycle.completed(lease, b'{"ok": true}', now=clock.now()))
    clock.advance(DEFAULT_RETENTION - 1)
    assert await broker.delete_expired(100) == 0
    done = await broker.admin.get_task("default", info.id)
    assert done.state is C and done.result == {"ok": True}
    clock.advance(1)
    assert await broker.delete_expired(100) == 1
    with pytest.raises(TaskNotFoundError):
        await broker.admin.get_task("default", info.id)
