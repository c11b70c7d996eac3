"""Workflows on every broker (W20): a graph created all or none, each node run once after the nodes
it names with their results in ``ctx.dependencies``, ``app.wait`` on the whole, and what a
failed node means for the rest (``on_failure``)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import durq
from conformance.apps import FAST, marker_lines, wait_for_state, worker_process
from conformance.conftest import requires
from durq.brokers.base import CAP_CROSS_QUEUE_GROUPS, CAP_DEPENDENCIES, CAP_MULTI_PROCESS
from durq.errors import ValidationError
from durq.states import TaskState

LIMIT = 60.0


@pytest.fixture(autouse=True)
async def _dependencies(app: durq.App) -> None:
    requires(await app.broker(), CAP_DEPENDENCIES)


def _recorder(app: durq.App, ran: list[str]) -> None:
    """``wf:step`` returns its payload's ``n`` plus the sum of its dependencies' results."""

    @app.task("wf:step")
    async def step(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        ran.append(payload["name"])
        return int(payload.get("n", 1)) + sum(v for v in ctx.dependencies.values())


async def _states(app: durq.App, info: durq.WorkflowInfo) -> dict[str, TaskState]:
    got = {}
    for name, task in info.nodes.items():
        got[name] = (await app.inspector.get_task_info(task.queue, task.id)).state
    return got


async def test_a_diamond_passes_results_downstream(app: durq.App) -> None:
    ran: list[str] = []
    _recorder(app, ran)
    wf = durq.Workflow("diamond")
    a = wf.add("wf:step", {"name": "a", "n": 1}, name="a")
    # Built in any order: d names b and c before they exist.
    wf.add("wf:step", {"name": "d", "n": 0}, name="d", after=["b", "c"])
    wf.add("wf:step", {"name": "b", "n": 10}, name="b", after=[a])
    wf.add("wf:step", {"name": "c", "n": 100}, name="c", after=[a])
    info = await app.enqueue_workflow(wf)
    assert info.finals == ("d",)
    assert {n: t.state for n, t in info.nodes.items()} == {
        "a": TaskState.PENDING,
        "d": TaskState.WAITING,
        "b": TaskState.WAITING,
        "c": TaskState.WAITING,
    }
    async with app.worker(concurrency=4, **FAST):
        assert await app.wait(info, timeout=LIMIT) == {"d": 112}
    assert ran[0] == "a" and ran[-1] == "d" and sorted(ran) == ["a", "b", "c", "d"]


async def test_a_deep_chain_runs_in_order(app: durq.App) -> None:
    ran: list[str] = []
    _recorder(app, ran)
    wf = durq.Workflow("chain")
    previous: list[durq.Node] = []
    for i in range(200):
        previous = [wf.add("wf:step", {"name": f"n{i}", "n": 1}, name=f"n{i}", after=previous)]
    info = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=4, **FAST):
        assert await app.wait(info, timeout=LIMIT) == {"n199": 200}
    assert ran == [f"n{i}" for i in range(200)]


async def test_a_wide_fan_out_fans_in_once(app: durq.App) -> None:
    ran: list[str] = []
    _recorder(app, ran)
    wf = durq.Workflow("wide")
    root = wf.add("wf:step", {"name": "root", "n": 0}, name="root")
    leaves = [
        wf.add("wf:step", {"name": f"leaf{i}", "n": 1}, name=f"leaf{i}", after=[root])
        for i in range(998)
    ]
    wf.add("wf:step", {"name": "merge", "n": 0}, name="merge", after=leaves)
    info = await app.enqueue_workflow(wf)
    assert len(info.nodes) == 1000
    async with app.worker(concurrency=20, **FAST):
        assert await app.wait(info, timeout=LIMIT) == {"merge": 998}
    assert len(ran) == 1000 and ran.count("merge") == 1 and ran[-1] == "merge"


async def test_wait_returns_every_final_node(app: durq.App) -> None:
    _recorder(app, [])
    wf = durq.Workflow("two-ends")
    a = wf.add("wf:step", {"name": "a", "n": 1}, name="a")
    wf.add("wf:step", {"name": "x", "n": 2}, name="x", after=[a])
    wf.add("wf:step", {"name": "y", "n": 3}, name="y", after=[a])
    info = await app.enqueue_workflow(wf)
    assert info.finals == ("x", "y")
    async with app.worker(concurrency=2, **FAST):
        assert await app.wait(info, timeout=LIMIT) == {"x": 3, "y": 4}
        # A node's own id can be waited for like any task.
        assert await app.wait(info.nodes["a"], timeout=LIMIT) == 1


async def test_cycles_and_unknown_names_are_refused_at_creation(app: durq.App) -> None:
    wf = durq.Workflow("loop")
    wf.add("wf:step", name="a", after=["c"])
    wf.add("wf:step", name="b", after=["a"])
    wf.add("wf:step", name="c", after=["b"])
    with pytest.raises(durq.WorkflowCycleError, match="a -> b -> c -> a") as caught:
        await app.enqueue_workflow(wf)
    assert caught.value.cycle == ("a", "b", "c", "a")
    itself = durq.Workflow("self")
    itself.add("wf:step", name="a", after=["a"])
    with pytest.raises(durq.WorkflowCycleError, match="a -> a"):
        await app.enqueue_workflow(itself)
    unknown = durq.Workflow("unknown")
    unknown.add("wf:step", name="a", after=["nope"])
    with pytest.raises(durq.WorkflowError, match="'nope', which is no node"):
        await app.enqueue_workflow(unknown)
    twice = durq.Workflow("twice")
    twice.add("wf:step")
    with pytest.raises(durq.WorkflowError, match="named 'wf:step' already"):
        twice.add("wf:step")
    assert await app.inspector.list_queues() == []


async def test_one_refused_node_creates_nothing(app: durq.App) -> None:
    await app.enqueue("wf:step", {"name": "taken"}, task_id="taken", process_in=3600)
    wf = durq.Workflow("refused")
    a = wf.add("wf:step", {"name": "a"}, name="a")
    wf.add("wf:step", {"name": "b"}, name="b", after=[a])
    wf.add("wf:step", {"name": "c"}, name="c", after=[a], task_id="taken")
    with pytest.raises(durq.TaskIDConflictError):
        await app.enqueue_workflow(wf)
    for name in ("a", "b"):
        with pytest.raises(durq.TaskNotFoundError):
            await app.inspector.get_task_info("default", wf.node_id(name))
    # The same workflow id again, its nodes free now: created whole, then refused whole.
    retry = durq.Workflow("refused", id=wf.id)
    retry.add("wf:step", {"name": "a"}, name="a")
    info = await app.enqueue_workflow(retry)
    assert info.nodes["a"].id == wf.node_id("a")
    with pytest.raises(durq.TaskIDConflictError):
        await app.enqueue_workflow(retry)


async def test_nodes_in_several_queues(app: durq.App) -> None:
    _recorder(app, [])
    wf = durq.Workflow("queues")
    a = wf.add("wf:step", {"name": "a"}, name="a", queue="wf-a")
    wf.add("wf:step", {"name": "b"}, name="b", queue="wf-b", after=[a])
    if CAP_CROSS_QUEUE_GROUPS not in (await app.broker()).capabilities:
        with pytest.raises(ValidationError, match="one queue"):
            await app.enqueue_workflow(wf)
        return
    info = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=2, queues={"wf-a": 1, "wf-b": 1}, **FAST):
        assert await app.wait(info, timeout=LIMIT) == {"b": 2}


def _failing(app: durq.App, ran: list[str]) -> None:
    _recorder(app, ran)

    @app.task("wf:boom", max_retry=0)
    async def boom(payload: dict[str, Any]) -> None:
        ran.append(payload["name"])
        raise ValueError("bad row 7")


async def test_a_failed_node_cancels_its_dependents(app: durq.App) -> None:
    ran: list[str] = []
    _failing(app, ran)
    wf = durq.Workflow("cancels")
    a = wf.add("wf:step", {"name": "a"}, name="a")
    bad = wf.add("wf:boom", {"name": "bad"}, name="bad", after=[a])
    after = wf.add("wf:step", {"name": "after"}, name="after", after=[bad])
    wf.add("wf:step", {"name": "last"}, name="last", after=[after, a])
    info = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=2, **FAST):
        with pytest.raises(durq.WorkflowFailedError) as caught:
            await app.wait(info, timeout=LIMIT)
    assert caught.value.node == "bad"
    assert caught.value.last_error == "ValueError: bad row 7"
    assert caught.value.traceback is not None and "bad row 7" in caught.value.traceback
    assert ran == ["a", "bad"]
    states = await _states(app, info)
    assert states == {
        "a": TaskState.COMPLETED,
        "bad": TaskState.ARCHIVED,
        "after": TaskState.ARCHIVED,
        "last": TaskState.ARCHIVED,
    }
    last = await app.inspector.get_task_info("default", info.nodes["last"].id)
    assert last.last_error == "not run: node 'bad' failed: ValueError: bad row 7"


async def test_skip_leaves_the_failed_branch_out(app: durq.App) -> None:
    ran: list[str] = []
    _failing(app, ran)
    wf = durq.Workflow("skips")
    a = wf.add("wf:step", {"name": "a", "n": 1}, name="a")
    bad = wf.add("wf:boom", {"name": "bad"}, name="bad", after=[a], on_failure="skip")
    wf.add("wf:step", {"name": "after"}, name="after", after=[bad])
    wf.add("wf:step", {"name": "other", "n": 5}, name="other", after=[a])
    info = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=2, **FAST):
        assert await app.wait(info, timeout=LIMIT) == {"other": 6}
    assert "after" not in ran
    after = await app.inspector.get_task_info("default", info.nodes["after"].id)
    assert after.state is TaskState.ARCHIVED
    assert after.last_error is not None and after.last_error.startswith("skipped: node 'bad'")


async def test_continue_runs_dependents_with_the_error(app: durq.App) -> None:
    seen: list[Any] = []
    _failing(app, [])

    @app.task("wf:inspect")
    async def inspect(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        seen.append(ctx.dependencies["bad"])
        return "ran anyway"

    wf = durq.Workflow("continues", on_failure="continue")
    bad = wf.add("wf:boom", {"name": "bad"}, name="bad")
    wf.add("wf:inspect", {}, name="report", after=[bad])
    info = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=2, **FAST):
        assert await app.wait(info, timeout=LIMIT) == {"report": "ran anyway"}
    assert seen == [durq.NodeFailed("bad", TaskState.ARCHIVED, "ValueError: bad row 7")]


async def test_wait_times_out_while_a_node_runs(app: durq.App) -> None:
    wf = durq.Workflow("slow")
    wf.add("wf:never", {}, name="never")
    info = await app.enqueue_workflow(wf)
    with pytest.raises(durq.WaitTimeoutError):
        await app.wait(info, timeout=0.3)


async def test_the_sync_face_creates_and_waits(app: durq.App) -> None:
    requires(await app.broker(), CAP_MULTI_PROCESS)  # the sync face opens its own broker
    _recorder(app, [])
    wf = durq.Workflow("sync")
    wf.add("wf:step", {"name": "a", "n": 4}, name="a")
    info = await asyncio.to_thread(app.enqueue_workflow_sync, wf)
    async with app.worker(concurrency=1, **FAST):
        assert await asyncio.to_thread(app.wait_sync, info, timeout=LIMIT) == {"a": 4}


async def test_cancelling_a_workflow_reaches_running_waiting_and_pending_nodes(
    app: durq.App,
) -> None:
    started = asyncio.Event()
    ran: list[str] = []

    @app.task("wf:hang")
    async def hang(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(3600)

    _recorder(app, ran)
    wf = durq.Workflow("cancelled")
    running = wf.add("wf:hang", {}, name="running")
    wf.add("wf:step", {"name": "waiting"}, name="waiting", after=[running])
    wf.add("wf:step", {"name": "later"}, name="later", process_in=3600)
    info = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=2, **FAST):
        await asyncio.wait_for(started.wait(), LIMIT)
        assert await app.cancel_workflow(info) == 3
        with pytest.raises(durq.WorkflowFailedError, match="was cancelled"):
            await app.wait(info, timeout=LIMIT)
        await wait_for_state(app, "default", info.nodes["running"].id, TaskState.ARCHIVED)
    assert ran == []
    for task in info.nodes.values():
        got = await app.inspector.get_task_info(task.queue, task.id)
        assert (got.state, got.last_error) == (TaskState.ARCHIVED, "cancelled")
    assert await app.cancel_workflow(info) == 0


async def test_a_kill_during_the_last_completion_releases_the_merge_once(
    app: durq.App, broker_url: str, tmp_path: Path
) -> None:
    """SIGKILL the worker process the moment both branches' handlers returned: whatever
    instant the kill lands in, after recovery the merge runs once, with both results."""
    marker = tmp_path / "marker.txt"
    wf = durq.Workflow("killed", queue="kill")
    a = wf.add("test:returns", {"n": 1}, name="a")
    b = wf.add("test:returns", {"n": 2}, name="b")
    # Due a moment later: the killed process never runs it, the worker below does.
    wf.add("test:returns", {"n": 3}, name="merge", after=[a, b], process_in=3)
    with worker_process(broker_url, marker, lease=1.5) as proc:
        info = await app.enqueue_workflow(wf)
        deadline = time.monotonic() + 20
        while sum(line[0] == "return" for line in marker_lines(marker)) < 2:
            assert time.monotonic() < deadline, "the worker never ran both branches"
            await asyncio.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait(20)

    runs: list[dict[str, Any]] = []

    @app.task("test:returns", queue="kill")
    def returns(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
        if payload["n"] == 3:
            runs.append(dict(ctx.dependencies))
        return {"n": payload["n"]}

    async with app.worker(queues=["kill"], lease_seconds=2, **FAST):
        assert await app.wait(info, timeout=LIMIT) == {"merge": {"n": 3}}
    assert runs == [{"a": {"n": 1}, "b": {"n": 2}}]


async def test_a_node_may_be_a_durable_task(app: durq.App) -> None:
    """A node that records a step and sleeps durably: its dependents wait for its end, not
    for its first attempt, and it reads its dependencies again when it resumes."""
    calls: list[str] = []

    @app.task("wf:first")
    async def first(payload: dict[str, Any]) -> int:
        return 20

    @app.task("wf:durable")
    async def durable(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        def charge() -> int:
            calls.append("charge")
            return 1

        charged = await ctx.step("charge", charge)
        await ctx.sleep("cool-off", 0.3)
        return int(ctx.dependencies["first"]) + charged

    @app.task("wf:last")
    async def last(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        return int(ctx.dependencies["durable"]) * 2

    wf = durq.Workflow("durable")
    a = wf.add("wf:first", {}, name="first")
    b = wf.add("wf:durable", {}, name="durable", after=[a])
    wf.add("wf:last", {}, name="last", after=[b])
    info = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=2, **FAST):
        assert await app.wait(info, timeout=LIMIT) == {"last": 42}
    assert calls == ["charge"]
