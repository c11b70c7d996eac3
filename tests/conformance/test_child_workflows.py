"""Fan-out decided at run time on every broker (W20): a task starts a workflow it built from
what it found (``ctx.run_workflow``), holds no worker slot while it runs, and resumes with
its results; the nodes after that task wait for all of it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durq
from conformance.apps import FAST, wait_for_state
from conformance.conftest import requires
from durq.brokers.base import CAP_DEPENDENCIES
from durq.child_workflows import DONE_TYPE, as_child, child_id
from durq.errors import StepError
from durq.states import TaskState

LIMIT = 60.0


@pytest.fixture(autouse=True)
async def _dependencies(app: durq.App) -> None:
    requires(await app.broker(), CAP_DEPENDENCIES)


def _fan_out(app: durq.App, runs: list[str], *, bad_row: int | None = None) -> None:
    """``rows:split`` reads its rows once (a step), runs one ``rows:one`` per row and a
    ``rows:sum`` after them as a child workflow, and returns the sum doubled."""

    @app.task("rows:split", max_retry=0)
    async def split(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        runs.append("split")
        rows = await ctx.step("read", lambda: list(range(payload["rows"])))
        wf = durq.Workflow("rows")
        ones = [wf.add("rows:one", {"row": r}, name=f"row{r}") for r in rows]
        wf.add("rows:sum", {}, name="sum", after=ones)
        got = await ctx.run_workflow(wf, timeout=LIMIT)
        return int(got["sum"]) * 2

    @app.task("rows:one", max_retry=0)
    async def one(payload: dict[str, Any]) -> int:
        runs.append(f"row{payload['row']}")
        if payload["row"] == bad_row:
            raise ValueError(f"bad row {bad_row}")
        return int(payload["row"])

    @app.task("rows:sum")
    async def total(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        runs.append("sum")
        return sum(int(v) for v in ctx.dependencies.values())

    @app.task("rows:report")
    async def report(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        runs.append("report")
        return int(ctx.dependencies["split"]) + 1


async def test_a_node_fans_out_at_run_time_and_the_nodes_after_it_wait(app: durq.App) -> None:
    runs: list[str] = []
    _fan_out(app, runs)
    wf = durq.Workflow("nightly")
    split = wf.add("rows:split", {"rows": 50}, name="split")
    wf.add("rows:report", {}, name="report", after=[split])
    info = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=8, **FAST):
        assert await app.wait(info, timeout=LIMIT) == {"report": 2 * sum(range(50)) + 1}
    # The split ran twice (it ended its attempt to wait, then resumed); every row once, the
    # child's merge once, and the report after all of it.
    assert runs.count("split") == 2
    assert sorted(r for r in runs if r.startswith("row")) == sorted(f"row{i}" for i in range(50))
    assert runs.count("sum") == 1 and runs[-1] == "report"
    assert runs.index("sum") < len(runs) - 2  # the split's second run came after the sum


async def test_a_task_outside_a_workflow_may_fan_out(app: durq.App) -> None:
    runs: list[str] = []
    _fan_out(app, runs)
    task = await app.enqueue("rows:split", {"rows": 3})
    async with app.worker(concurrency=4, **FAST):
        assert await app.wait(task, timeout=LIMIT) == 6


async def test_a_failed_row_fails_the_task_that_waited(app: durq.App) -> None:
    runs: list[str] = []
    _fan_out(app, runs, bad_row=2)
    task = await app.enqueue("rows:split", {"rows": 4})
    async with app.worker(concurrency=4, **FAST):
        with pytest.raises(durq.TaskArchivedError) as failed:
            await app.wait(task, timeout=LIMIT)
    error = failed.value.info.last_error if failed.value.info else ""
    assert "WorkflowFailedError" in (error or "") and "row2" in (error or "")
    assert "sum" not in runs  # the merge did not run: the row's failure cancelled it


async def test_a_run_that_comes_again_finds_the_workflow_it_created(app: durq.App) -> None:
    """A crash between creating the child and recording that step: the next run's creation
    is refused by the derived ids and adopts the first one (nothing created twice)."""
    wf = durq.Workflow("rows")
    wf.add("rows:one", {"row": 1}, name="row1")
    queue = app.default_queue
    first = await app.child_workflows.create(wf, queue, "parent-1", "fan")
    again = await app.child_workflows.create(wf, queue, "parent-1", "fan")
    assert first == again
    wid = child_id(queue, "parent-1", "fan")
    assert first[0] == wid
    done = await app.inspector.get_task_info(queue, f"wf:{wid}:durq-done")
    assert done.type == DONE_TYPE and done.state is TaskState.WAITING
    # Another task, or another step of the same task, gets a workflow of its own.
    assert child_id(queue, "parent-2", "fan") != wid != child_id(queue, "parent-1", "other")


async def test_durq_s_own_node_is_not_for_callers(app: durq.App) -> None:
    with pytest.raises(durq.InvalidNameError):
        await app.enqueue(DONE_TYPE, {"queue": "q", "id": "x", "signal": "s"})
    wf = durq.Workflow("rows")
    wf.add("rows:one", name="durq-done")
    with pytest.raises(durq.WorkflowError, match="durq's own"):
        as_child(wf, app.default_queue, "t", "fan")
    outside = durq.TaskContext(
        id="t",
        queue="q",
        type="x",
        retried=0,
        max_retry=0,
        deadline=None,
        headers={},
        worker_id="w",
    )
    with pytest.raises(StepError, match="in a worker"):
        await outside.run_workflow(wf, timeout=1)


async def test_a_node_with_always_runs_whatever_the_nodes_before_it_did(app: durq.App) -> None:
    runs: list[str] = []
    _fan_out(app, runs, bad_row=1)
    seen: dict[str, Any] = {}

    @app.task("rows:cleanup")
    async def cleanup(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        seen.update(ctx.dependencies)
        return "cleaned"

    wf = durq.Workflow("with-cleanup")
    good = wf.add("rows:one", {"row": 0}, name="good")
    bad = wf.add("rows:one", {"row": 1}, name="bad")
    after_bad = wf.add("rows:one", {"row": 5}, name="after-bad", after=[bad])
    wf.add("rows:cleanup", {}, name="cleanup", after=[good, after_bad], always=True)
    info = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=2, **FAST):
        with pytest.raises(durq.WorkflowFailedError):
            await app.wait(info, timeout=LIMIT)
        cleaned = await app.wait(info.nodes["cleanup"], timeout=LIMIT)
    assert cleaned == "cleaned" and "row5" not in runs
    assert seen["good"] == 0
    failed = seen["after-bad"]
    assert isinstance(failed, durq.NodeFailed) and failed.state is TaskState.ARCHIVED
    assert (failed.error or "").startswith("not run: node 'bad' failed")


async def test_cancelling_a_workflow_reaches_the_workflows_its_nodes_started(
    app: durq.App,
) -> None:
    @app.task("rows:slow")
    async def slow(payload: dict[str, Any]) -> None:
        await asyncio.sleep(60)

    @app.task("rows:starter")
    async def starter(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        wf = durq.Workflow("slow-rows")
        first = wf.add("rows:slow", {}, name="first")
        wf.add("rows:slow", {}, name="second", after=[first])
        await ctx.run_workflow(wf, timeout=LIMIT)

    outer = durq.Workflow("outer")
    start = outer.add("rows:starter", {}, name="start")
    outer.add("rows:slow", {}, name="after", after=[start])
    info = await app.enqueue_workflow(outer)
    queue = info.nodes["start"].queue
    wid = child_id(queue, info.nodes["start"].id, "workflow:slow-rows")
    async with app.worker(concurrency=4, **FAST):
        await wait_for_state(app, queue, f"wf:{wid}:first", TaskState.ACTIVE, timeout=LIMIT)
        await wait_for_state(app, queue, info.nodes["start"].id, TaskState.WAITING, timeout=LIMIT)
        # The waiting node, the node after it, and its child's running and waiting nodes.
        assert await app.cancel_workflow(info) == 5
        for node in ("first", "second", "durq-done"):
            await wait_for_state(app, queue, f"wf:{wid}:{node}", TaskState.ARCHIVED, timeout=LIMIT)
    with pytest.raises(durq.WorkflowFailedError, match="cancelled"):
        await app.wait(info, timeout=LIMIT)


async def test_a_child_whose_final_node_is_a_failing_sub_workflow_fails_the_task(
    app: durq.App,
) -> None:
    """The done node reads a sub-workflow's final nodes grouped under its name: a failure
    inside is found there too (and the good results of one that succeeded come back)."""
    runs: list[str] = []
    _fan_out(app, runs, bad_row=1)

    @app.task("rows:parent", max_retry=0)
    async def parent(payload: dict[str, Any], ctx: durq.TaskContext) -> Any:
        inner = durq.Workflow("inner")
        inner.add("rows:one", {"row": payload["row"]}, name="only")
        wf = durq.Workflow("outer")
        wf.add_workflow(inner, name="sub")
        return await ctx.run_workflow(wf, timeout=LIMIT)

    good = await app.enqueue("rows:parent", {"row": 0})
    bad = await app.enqueue("rows:parent", {"row": 1})
    async with app.worker(concurrency=4, **FAST):
        assert await app.wait(good, timeout=LIMIT) == {"sub": {"only": 0}}
        with pytest.raises(durq.TaskArchivedError) as failed:
            await app.wait(bad, timeout=LIMIT)
    error = (failed.value.info.last_error if failed.value.info else "") or ""
    assert "WorkflowFailedError" in error and "sub.only" in error
