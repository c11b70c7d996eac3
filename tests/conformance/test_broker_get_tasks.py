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


async def test_get_outcomes_reads_what_get_tasks_reads_of_each(
    broker: FullBroker, clock: FakeClock
) -> None:
    """Admin.get_outcomes: the state, result, error and headers of each task, as get_tasks
    reads them; ``None`` where get_tasks has none (absent, or completed past its retention)."""
    await put(broker, clock, {"brief": C}, retention=10)
    await put(broker, clock, ALL, headers={"durq-workflow": '{"on_failure":"skip"}'})
    await put(broker, clock, {"elsewhere": P}, queue="other")
    clock.advance(11)
    ids = ["c", "absent", "p", "a", "x", "elsewhere", "r", "s", "brief", "p"]
    outcomes = await broker.admin.get_outcomes("default", ids)
    tasks = await broker.admin.get_tasks("default", ids)
    assert len(outcomes) == len(ids)
    for task_id, outcome, info in zip(ids, outcomes, tasks, strict=True):
        if info is None:
            assert outcome is None, task_id
            continue
        assert outcome is not None
        assert (outcome.id, outcome.state, outcome.raw_result, outcome.last_error) == (
            info.id,
            info.state,
            info.raw_result,
            info.last_error,
        )
        assert outcome.headers == info.headers == {"durq-workflow": '{"on_failure":"skip"}'}
    assert [o.state if o else None for o in outcomes] == [C, None, P, A, X, None, R, S, None, P]
    assert outcomes[0] is not None and outcomes[0].raw_result == b'"ok"'
    assert outcomes[4] is not None and outcomes[4].last_error
    assert await broker.admin.get_outcomes("default", []) == []
