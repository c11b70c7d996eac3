"""Redis filters a search in the client, reading the state's tasks in order up to a bound:
past it the answer says it is incomplete and how many tasks it read."""

from __future__ import annotations

import json

import pytest

from durq.brokers.base import EnqueueParams, TaskFilter, TaskSearch
from durq.brokers.redis import admin
from durq.brokers.redis.broker import RedisBroker
from durq.states import TaskState


async def test_a_search_past_the_bound_says_it_is_incomplete(
    rbroker: RedisBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(12):
        payload = json.dumps({"partner": "acme" if i % 3 == 0 else "other"}).encode()
        await rbroker.enqueue(EnqueueParams(id=f"t{i:02d}", queue="q", type="x", payload=payload))
    where = TaskFilter(payload=(("partner", "acme"),))
    monkeypatch.setattr(admin, "SEARCH_CHUNK", 4)
    monkeypatch.setattr(admin, "SEARCH_SCAN", 8)
    result = await rbroker.admin.search_tasks(TaskSearch("q", TaskState.PENDING, where))
    assert [t.id for t in result.tasks] == ["t00", "t03", "t06"]
    assert (result.total, result.complete, result.scanned) == (3, False, 8)
    monkeypatch.setattr(admin, "SEARCH_SCAN", 12)
    result = await rbroker.admin.search_tasks(TaskSearch("q", TaskState.PENDING, where))
    assert (result.total, result.complete, result.scanned) == (4, True, 12)
