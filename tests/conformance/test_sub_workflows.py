"""Sub-workflows on every broker (W20): a workflow added as one node of another is created
with it, all or none; its first nodes run after that node's ``after=``, the nodes after it
wait for all of its final nodes and read its result (its final nodes' results by name)."""

from __future__ import annotations

from typing import Any

import pytest

import durq
from conformance.apps import FAST
from conformance.conftest import requires
from durq.brokers.base import CAP_DEPENDENCIES
from durq.states import TaskState

LIMIT = 60.0


@pytest.fixture(autouse=True)
async def _dependencies(app: durq.App) -> None:
    requires(await app.broker(), CAP_DEPENDENCIES)


def _recorder(app: durq.App, ran: list[str], seen: dict[str, Any]) -> None:
    """``sub:step`` returns its payload's ``n`` plus the numbers among its dependencies'
    results (a sub-workflow's result counts as the sum of its values)."""

    def total(value: Any) -> int:
        if isinstance(value, dict):
            return sum(total(v) for v in value.values())
        return 0 if isinstance(value, durq.NodeFailed) else int(value)

    @app.task("sub:step")
    async def step(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        ran.append(payload["name"])
        seen[payload["name"]] = dict(ctx.dependencies)
        return int(payload.get("n", 1)) + total(dict(ctx.dependencies))

    @app.task("sub:fail")
    async def fail(payload: dict[str, Any]) -> None:
        ran.append(payload["name"])
        raise RuntimeError("the partner said no")


def _etl(name: str = "etl") -> durq.Workflow:
    """extract -> (clean, enrich) -> two final nodes."""
    etl = durq.Workflow(name)
    x = etl.add("sub:step", {"name": "extract", "n": 1}, name="extract")
    etl.add("sub:step", {"name": "clean", "n": 10}, name="clean", after=[x])
    etl.add("sub:step", {"name": "enrich", "n": 100}, name="enrich", after=[x])
    return etl


async def test_a_sub_workflow_runs_in_its_place_and_hands_on_its_result(app: durq.App) -> None:
    ran: list[str] = []
    seen: dict[str, Any] = {}
    _recorder(app, ran, seen)
    wf = durq.Workflow("nightly")
    prepare = wf.add("sub:step", {"name": "prepare", "n": 1000}, name="prepare")
    etl = wf.add_workflow(_etl(), after=[prepare])
    wf.add("sub:step", {"name": "report", "n": 0}, name="report", after=[etl])
    info = await app.enqueue_workflow(wf)
    assert list(info.nodes) == ["prepare", "etl.extract", "etl.clean", "etl.enrich", "report"]
    assert info.nodes["etl.extract"].state is TaskState.WAITING
    assert info.finals == ("report",)
    async with app.worker(concurrency=4, **FAST):
        got = await app.wait(info, timeout=LIMIT)
    # extract 1001; clean 1011; enrich 1101; report reads both as the sub-workflow's result.
    assert seen["report"] == {"etl": {"clean": 1011, "enrich": 1101}}
    assert got == {"report": 2112}
    assert ran.index("prepare") < ran.index("extract") < ran.index("report")
    assert sorted(ran) == sorted(["prepare", "extract", "clean", "enrich", "report"])


async def test_a_final_sub_workflow_nested_twice_groups_its_results(app: durq.App) -> None:
    _recorder(app, [], {})
    inner = durq.Workflow("inner")
    inner.add("sub:step", {"name": "leaf", "n": 5}, name="leaf")
    middle = durq.Workflow("middle")
    m = middle.add_workflow(inner)
    middle.add("sub:step", {"name": "side", "n": 7}, name="side")
    middle.add_workflow(inner, name="again", after=[m])
    wf = durq.Workflow("outer")
    wf.add_workflow(middle)
    wf.add("sub:step", {"name": "alone", "n": 1}, name="alone")
    info = await app.enqueue_workflow(wf)
    assert set(info.nodes) == {
        "middle.inner.leaf",
        "middle.side",
        "middle.again.leaf",
        "alone",
    }
    async with app.worker(concurrency=4, **FAST):
        got = await app.wait(info, timeout=LIMIT)
    # "again" runs after "inner" (5): its leaf reads {"inner": {"leaf": 5}}, 5 + 5.
    assert got == {"alone": 1, "middle": {"side": 7, "again": {"leaf": 10}}}


async def test_a_failed_node_inside_stops_the_nodes_after_the_sub_workflow(
    app: durq.App,
) -> None:
    ran: list[str] = []
    _recorder(app, ran, {})
    etl = durq.Workflow("etl")
    etl.add("sub:fail", {"name": "extract"}, name="extract", max_retry=0)
    wf = durq.Workflow("nightly")
    sub = wf.add_workflow(etl)
    wf.add("sub:step", {"name": "report"}, name="report", after=[sub])
    info = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=2, **FAST):
        with pytest.raises(durq.WorkflowFailedError) as failed:
            await app.wait(info, timeout=LIMIT)
    assert failed.value.node == "etl.extract"
    assert "the partner said no" in (failed.value.last_error or "")
    assert "report" not in ran


async def test_on_failure_given_to_the_sub_workflow_node_reaches_its_nodes(
    app: durq.App,
) -> None:
    ran: list[str] = []
    seen: dict[str, Any] = {}
    _recorder(app, ran, seen)
    etl = durq.Workflow("etl")
    etl.add("sub:fail", {"name": "extract"}, name="extract", max_retry=0)
    wf = durq.Workflow("nightly")
    sub = wf.add_workflow(etl, on_failure="continue")
    wf.add("sub:step", {"name": "report", "n": 0}, name="report", after=[sub])
    info = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=2, **FAST):
        assert await app.wait(info, timeout=LIMIT) == {"report": 0}
    failed = seen["report"]["etl"]["extract"]
    assert isinstance(failed, durq.NodeFailed)
    assert failed.name == "etl.extract" and failed.state is TaskState.ARCHIVED


async def test_sub_workflows_are_checked_whole(app: durq.App) -> None:
    wf = durq.Workflow("outer")
    wf.add_workflow(_etl(), name="a", after=["b"])
    wf.add_workflow(_etl(), name="b", after=["a"])
    with pytest.raises(durq.WorkflowCycleError):
        await app.enqueue_workflow(wf)
    selfish = durq.Workflow("selfish")
    selfish.add("sub:step", name="x")
    selfish.add_workflow(selfish, name="me")
    with pytest.raises(durq.WorkflowError, match="contains itself"):
        await app.enqueue_workflow(selfish)
    with pytest.raises(durq.WorkflowError, match="another name"):
        wf.add_workflow(_etl(), name="a")
    empty = durq.Workflow("outer")
    empty.add_workflow(durq.Workflow("nothing"))
    with pytest.raises(durq.WorkflowError, match="no nodes"):
        await app.enqueue_workflow(empty)
