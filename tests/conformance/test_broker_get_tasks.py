"""Admin.get_tasks: several tasks of one queue read at once (what a workflow node reads of
its dependencies before it runs), each exactly as get_task reads it alone."""

from __future__ import annotations

import pytest
from brokerkit import A, C, P, R, S, X, put

from durq.brokers import FullBroker
from durq.clock import FakeClock
from durq.errors import TaskNotFoundError

ALL = {"p": P, "s": S, "a": A, "r": R, "x": X, "c": C}


async def test_get_tasks_reads_each_task_as_get_task_does(
    broker: FullBroker, clock: FakeClock
) -> None:
    await put(broker, clock, ALL)
    await put(broker, clock, {"elsewhere": P}, queue="other")
    ids = ["c", "absent", "p", "a", "x", "elsewhere", "r", "s", "p"]
    got = await broker.admin.get_tasks("default", ids)
    assert len(got) == len(ids)
    for task_id, info in zip(ids, got, strict=True):
        if task_id in ("absent", "elsewhere"):  # no such task in this queue
            assert info is None
        else:
            assert info == await broker.admin.get_task("default", task_id)
    assert [i.state if i else None for i in got] == [C, None, P, A, X, None, R, S, P]
    assert got[0] is not None and got[0].raw_result == b'"ok"'
    assert await broker.admin.get_tasks("default", []) == []


async def test_get_tasks_leaves_out_a_completed_task_past_its_retention(
    broker: FullBroker, clock: FakeClock
) -> None:
    await put(broker, clock, {"brief": C}, retention=10)
    await put(broker, clock, {"kept": C})
    assert all(i is not None for i in await broker.admin.get_tasks("default", ["brief", "kept"]))
    clock.advance(11)
    with pytest.raises(TaskNotFoundError):
        await broker.admin.get_task("default", "brief")
    brief, kept = await broker.admin.get_tasks("default", ["brief", "kept"])
    assert brief is None and kept is not None and kept.id == "kept"
