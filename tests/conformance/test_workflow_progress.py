"""A workflow's progress on every broker, as the inspector shows it (from its stored record and
its nodes' tasks, W21): the workflow's state while it runs, once it succeeded, failed or was
cancelled; listings by state and age; cancelling by id."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import durq
from conformance.apps import FAST
from durq.brokers.base import CAP_DEPENDENCIES
from durq.errors import ValidationError, WorkflowNotFoundError

LIMIT = 60.0


@pytest.fixture(autouse=True)
async def _dependencies(app: durq.App) -> None:
    if CAP_DEPENDENCIES not in (await app.broker()).capabilities:
        pytest.skip("no workflows on this broker")


def _tasks(app: durq.App) -> None:
    @app.task("wf:step")
    async def step(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        return 1 + sum(ctx.dependencies.values())

    @app.task("wf:boom", max_retry=0)
    async def boom(payload: dict[str, Any]) -> None:
        raise ValueError("bad row 7")


def diamond(name: str, **options: Any) -> durq.Workflow:
    wf = durq.Workflow(name, **options)
    a = wf.add("wf:step", {}, name="a")
    b = wf.add("wf:step", {}, name="b", after=[a])
    c = wf.add("wf:step", {}, name="c", after=[a])
    wf.add("wf:step", {}, name="d", after=[b, c])
    return wf


async def test_W21_progress_of_a_workflow_that_succeeds(app: durq.App) -> None:
    _tasks(app)
    info = await app.enqueue_workflow(diamond("etl"))
    shown = await app.inspector.get_workflow(info.id)
    assert (shown.id, shown.name, shown.state) == (info.id, "etl", "running")
    assert shown.by_state == {"pending": 1, "waiting": 3}
    assert [(n.name, n.after) for n in shown.nodes] == [
        ("a", ()),
        ("b", ("a",)),
        ("c", ("a",)),
        ("d", ("b", "c")),
    ]
    assert [n.task_id for n in shown.nodes] == [t.id for t in info.nodes.values()]
    async with app.worker(concurrency=2, **FAST):
        assert await app.wait(info, timeout=LIMIT) == {"d": 5}
    done = await app.inspector.get_workflow(info.id)
    assert done.state == "succeeded"
    assert (done.finished, done.by_state) == (4, {"completed": 4})
    assert {n.attempts for n in done.nodes} == {1}
    assert done.to_dict()["nodes"][3]["after"] == ["b", "c"]


async def test_W21_a_failed_node_fails_the_workflow_unless_skipped(app: durq.App) -> None:
    _tasks(app)
    failing = durq.Workflow("fails")
    a = failing.add("wf:boom", {}, name="a")
    failing.add("wf:step", {}, name="b", after=[a])
    skipping = durq.Workflow("skips")
    x = skipping.add("wf:boom", {}, name="x", on_failure="skip")
    skipping.add("wf:step", {}, name="y", after=[x])
    skipping.add("wf:step", {}, name="z")
    fails = await app.enqueue_workflow(failing)
    skips = await app.enqueue_workflow(skipping)
    async with app.worker(concurrency=2, **FAST):
        with pytest.raises(durq.WorkflowFailedError):
            await app.wait(fails, timeout=LIMIT)
        assert await app.wait(skips, timeout=LIMIT) == {"z": 1}
    failed = await app.inspector.get_workflow(fails.id)
    assert (failed.state, failed.by_state) == ("failed", {"archived": 2})
    assert failed.node("a").last_error == "ValueError: bad row 7"
    assert failed.node("a").attempts == 1
    assert (await app.inspector.get_workflow(skips.id)).state == "succeeded"


async def test_W21_cancel_by_id_reaches_running_pending_and_waiting_nodes(
    app: durq.App,
) -> None:
    _tasks(app)
    started = asyncio.Event()

    @app.task("wf:hang")
    async def hang(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(3600)

    wf = durq.Workflow("cancel-me")
    running = wf.add("wf:hang", {}, name="running")
    queued = wf.add("wf:hang", {}, name="queued")
    wf.add("wf:step", {}, name="waiting", after=[running, queued])
    info = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=1, **FAST):
        await asyncio.wait_for(started.wait(), LIMIT)
        before = await app.inspector.get_workflow(info.id)
        assert before.by_state == {"active": 1, "pending": 1, "waiting": 1}
        assert await app.cancel_workflow(info.id) == 3
        with pytest.raises(durq.WorkflowFailedError, match="was cancelled"):
            await app.wait(info, timeout=LIMIT)

        async def all_archived() -> bool:
            shown = await app.inspector.get_workflow(info.id)
            return shown.by_state == {"archived": 3}

        deadline = asyncio.get_running_loop().time() + LIMIT
        while not await all_archived():
            assert asyncio.get_running_loop().time() < deadline, "not cancelled in time"
            await asyncio.sleep(0.05)
    after = await app.inspector.get_workflow(info.id)
    assert after.state == "cancelled"
    assert {n.last_error for n in after.nodes} == {"cancelled"}
    assert await app.cancel_workflow(info.id) == 0
    with pytest.raises(WorkflowNotFoundError, match="no workflow 'nope'"):
        await app.cancel_workflow("nope")
    with pytest.raises(WorkflowNotFoundError):
        await app.inspector.get_workflow("nope")


async def test_W21_listing_by_state_age_and_pages(app: durq.App) -> None:
    _tasks(app)
    infos = []
    for i in range(5):
        wf = durq.Workflow("batch")
        wf.add("wf:boom" if i % 2 else "wf:step", {}, name="only")
        infos.append(await app.enqueue_workflow(wf))
    ids = [info.id for info in infos]
    async with app.worker(concurrency=2, **FAST):
        for i, info in enumerate(infos):
            if i % 2:
                with pytest.raises(durq.WorkflowFailedError):
                    await app.wait(info, timeout=LIMIT)
            else:
                assert await app.wait(info, timeout=LIMIT) == {"only": 1}
    newest_first = list(reversed(ids))
    listed = await app.inspector.list_workflows()
    assert [w.id for w in listed.workflows] == newest_first and listed.cursor is None
    failed = await app.inspector.list_workflows(state="failed")
    assert [w.id for w in failed.workflows] == [ids[3], ids[1]]
    assert all(w.state == "failed" for w in failed.workflows)
    seen: list[str] = []
    cursor = None
    while True:
        page = await app.inspector.list_workflows(state="succeeded", limit=2, cursor=cursor)
        seen += [w.id for w in page.workflows]
        if page.cursor is None:
            break
        cursor = page.cursor
    assert seen == [ids[4], ids[2], ids[0]]
    assert (await app.inspector.list_workflows(older_than=3600)).workflows == ()
    assert len((await app.inspector.list_workflows(newer_than=3600)).workflows) == 5
    with pytest.raises(ValidationError, match="unknown workflow state"):
        await app.inspector.list_workflows(state="done")
