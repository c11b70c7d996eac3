"""Workflows in a real browser (Chromium, headless) over uvicorn, with a real SQLite broker and
a worker: the list searched by state, the graph drawn on the server (nodes coloured by their
task's state, the edges), a node clicked through to its task and back.

Screenshots go to ``test-artifacts/`` (not committed); those in ``docs/images/`` were taken
by this test."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import durq
from durq.dashboard import DashboardSettings, create_dashboard
from durq.inspector import Inspector
from durq.workflow_progress import WorkflowProgress

from .conftest import TOKEN
from .live import LiveServer
from .test_browser import (  # noqa: F401  # browser: the module's Chromium, a fixture
    ARTIFACTS,
    WorkerThread,
    browser,
    fresh_page,
    log_in,
    run_async,
    wait_for,
)


@dataclass
class WorkflowEnv:
    app: durq.App
    url: str
    gate: threading.Event

    def workflow(self, workflow_id: str) -> WorkflowProgress:
        async def main() -> WorkflowProgress:
            try:
                inspector: Inspector = self.app.inspector
                return await inspector.get_workflow(workflow_id)
            finally:
                await self.app.close()

        return run_async(main)


def _etl(workflow_id: str) -> durq.Workflow:
    """extract, three cleaners (one fails, with on_failure=continue), a merge after them,
    a report after extract alone, and a load after the merge."""
    wf = durq.Workflow("nightly-etl", id=workflow_id)
    extract = wf.add("etl:step", {"ms": 0}, name="extract")
    cleaners = [
        wf.add("etl:step", {}, name="clean-orders", after=[extract]),
        wf.add("etl:slow", {}, name="clean-customers", after=[extract]),
        wf.add("etl:broken", {}, name="clean-refunds", after=[extract], on_failure="continue"),
    ]
    merge = wf.add("etl:step", {}, name="merge", after=cleaners)
    wf.add("etl:step", {}, name="report", after=[extract])
    wf.add("etl:step", {}, name="load", after=[merge])
    return wf


@pytest.fixture
def wf_env(tmp_path: Path) -> Iterator[WorkflowEnv]:
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    gate = threading.Event()

    @app.task("etl:step", retention=3600)
    async def step(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        return 1 + len(ctx.dependencies)

    @app.task("etl:slow", retention=3600)
    def slow(payload: dict[str, Any]) -> int:
        gate.wait(30)
        return 1

    @app.task("etl:broken", max_retry=0, retention=3600)
    async def broken(payload: dict[str, Any]) -> None:
        raise RuntimeError("refund file is empty")

    async def seed() -> None:
        await (await app.broker()).migrate()
        done = durq.Workflow("hourly-sync", id="sync-0700")
        done.add("etl:step", {}, name="fetch")
        await app.enqueue_workflow(done)
        failed = durq.Workflow("refunds", id="refunds-0700")
        failed.add("etl:broken", {}, name="read")
        failed.add("etl:step", {}, name="write", after=["read"])
        await app.enqueue_workflow(failed)
        await app.enqueue_workflow(_etl("etl-2024-05-01"))
        await app.close()

    run_async(seed)
    settings = DashboardSettings(refresh_seconds=60)
    with LiveServer(create_dashboard(app, token=TOKEN, settings=settings)) as server:
        with WorkerThread(app):
            env = WorkflowEnv(app, server.url, gate)

            def settled() -> bool:
                etl = env.workflow("etl-2024-05-01").by_state
                return (
                    env.workflow("refunds-0700").state == "failed"
                    and env.workflow("sync-0700").state == "succeeded"
                    and etl == {"completed": 3, "active": 1, "archived": 1, "waiting": 2}
                )

            wait_for(settled, timeout=30)
            try:
                yield env
            finally:
                gate.set()  # a failed test must not leave the handler waiting


@pytest.fixture
def page(browser: Any, wf_env: WorkflowEnv) -> Iterator[Any]:  # noqa: F811
    yield from fresh_page(browser)


def test_the_list_the_graph_and_a_node_through_to_its_task(page: Any, wf_env: WorkflowEnv) -> None:
    log_in(page, wf_env)  # type: ignore[arg-type]
    page.click('header nav a[href="/workflows"]')
    rows = page.locator("table#workflows tbody tr")
    assert [rows.nth(i).get_attribute("data-id") for i in range(rows.count())] == [
        "etl-2024-05-01",
        "refunds-0700",
        "sync-0700",
    ]
    state = {
        rows.nth(i).get_attribute("data-id"): rows.nth(i).locator(".badge").inner_text()
        for i in range(rows.count())
    }
    assert {k: v.lower() for k, v in state.items()} == {
        "etl-2024-05-01": "running",
        "refunds-0700": "failed",
        "sync-0700": "succeeded",
    }
    page.screenshot(path=str(ARTIFACTS / "workflow-list.png"), full_page=True)

    page.select_option("#search-state", "failed")
    page.click("#workflow-search button[type=submit]")
    page.wait_for_url("**/workflows?state=failed*")
    assert page.locator("table#workflows tbody tr").count() == 1
    assert page.locator('tr[data-id="refunds-0700"]').count() == 1
    page.select_option("#search-state", "")
    page.select_option("#search-older", "1d")
    page.click("#workflow-search button[type=submit]")
    assert page.locator("#workflows-empty").inner_text().startswith("No workflow matches")

    page.goto(wf_env.url + "/workflows")
    page.click('a[href="/workflows/etl-2024-05-01"]')
    graph = page.locator("svg#workflow-graph")
    graph.wait_for()
    drawn = {
        graph.locator("g.node").nth(i).get_attribute("data-node"): graph.locator("g.node")
        .nth(i)
        .get_attribute("data-state")
        for i in range(graph.locator("g.node").count())
    }
    assert drawn == {
        "extract": "completed",
        "clean-orders": "completed",
        "clean-customers": "active",
        "clean-refunds": "archived",
        "report": "completed",
        "merge": "waiting",
        "load": "waiting",
    }
    edges = graph.locator("path.edge")
    pairs = {
        (edges.nth(i).get_attribute("data-from"), edges.nth(i).get_attribute("data-to"))
        for i in range(edges.count())
    }
    assert pairs == {
        ("extract", "clean-orders"),
        ("extract", "clean-customers"),
        ("extract", "clean-refunds"),
        ("extract", "report"),
        ("clean-orders", "merge"),
        ("clean-customers", "merge"),
        ("clean-refunds", "merge"),
        ("merge", "load"),
    }
    # Colours come from the stylesheet, by state.
    fill = page.evaluate(
        """[...document.querySelectorAll('svg#workflow-graph g.node')].map(g =>
             [g.dataset.node, getComputedStyle(g.querySelector('rect')).fill])"""
    )
    colours = dict(fill)
    assert colours["extract"] == colours["clean-orders"] != colours["clean-refunds"]
    assert len({colours["extract"], colours["clean-customers"], colours["clean-refunds"]}) == 3
    # Left to right in layers: every edge goes rightwards.
    boxes = {
        name: graph.locator(f'g.node[data-node="{name}"] rect').bounding_box() for name in drawn
    }
    for source, target in pairs:
        assert boxes[source]["x"] + boxes[source]["width"] < boxes[target]["x"]
    assert page.locator('#workflow-nodes tr[data-node="clean-refunds"] td.err').inner_text() == (
        "RuntimeError: refund file is empty"
    )
    page.screenshot(path=str(ARTIFACTS / "workflow-graph.png"), full_page=True)

    page.click('svg#workflow-graph g.node[data-node="clean-orders"] a')
    page.wait_for_url("**/queues/default/tasks/wf%3Aetl-2024-05-01%3Aclean-orders")
    assert page.locator("#task-state").text_content() == "completed"
    assert "node clean-orders" in page.locator("#task-workflow").inner_text()
    page.click("#task-workflow a")
    page.wait_for_url("**/workflows/etl-2024-05-01")

    wf_env.gate.set()
    wait_for(lambda: wf_env.workflow("etl-2024-05-01").state == "succeeded", timeout=30)
    page.reload()
    assert page.locator("#workflow-state").inner_text().lower() == "succeeded"
    assert page.locator("#cancel-workflow").count() == 0
    states = page.locator("svg#workflow-graph g.node")
    assert {states.nth(i).get_attribute("data-state") for i in range(states.count())} == {
        "completed",
        "archived",
    }


def test_cancel_from_the_workflow_page(page: Any, wf_env: WorkflowEnv) -> None:
    log_in(page, wf_env)  # type: ignore[arg-type]
    page.goto(wf_env.url + "/workflows/etl-2024-05-01")
    page.click("#cancel-workflow")  # confirmed by the dialog handler
    assert "node(s) cancelled" in page.locator(".notice").inner_text()
    wait_for(lambda: wf_env.workflow("etl-2024-05-01").state == "cancelled", timeout=30)
    wait_for(lambda: "active" not in wf_env.workflow("etl-2024-05-01").by_state, timeout=30)
    page.reload()
    assert page.locator("#workflow-state").inner_text().lower() == "cancelled"
    assert wf_env.workflow("etl-2024-05-01").node("load").last_error == "cancelled"
