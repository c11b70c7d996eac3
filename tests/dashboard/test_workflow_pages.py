"""The workflow pages over HTTP (the browser test clicks through them) and the graph's layout."""

from __future__ import annotations

import itertools
import re

import httpx

import durq
from durq.dashboard import create_dashboard
from durq.dashboard.graph import NODE_W, layers, layout
from durq.workflow_progress import WorkflowNodeProgress

from .conftest import BEARER, TOKEN


def node(name: str, *after: str, state: str = "pending") -> WorkflowNodeProgress:
    return WorkflowNodeProgress(
        name, "t", "default", f"wf:x:{name}", "cancel", after, state, 0, None
    )


def test_layers_follow_the_longest_path() -> None:
    nodes = [node("a"), node("b", "a"), node("c", "b"), node("d", "a", "c"), node("e")]
    assert layers(nodes) == {"a": 0, "b": 1, "c": 2, "d": 3, "e": 0}


def test_every_edge_goes_right_and_boxes_do_not_overlap() -> None:
    nodes = [node("root")]
    nodes += [node(f"leaf{i}", "root") for i in range(40)]
    nodes += [node("merge", *(f"leaf{i}" for i in range(40))), node("side", "root")]
    drawn = layout(nodes)
    box = {p.node.name: (p.x, p.y) for p in drawn.nodes}
    assert len(drawn.edges) == 40 + 40 + 1
    for e in drawn.edges:
        assert box[e.source][0] + NODE_W < box[e.target][0]
    column = sorted(y for name, (x, y) in box.items() if x == box["leaf0"][0])
    assert all(b - a >= drawn.node_h for a, b in itertools.pairwise(column))
    assert all(
        0 <= x and x + drawn.node_w <= drawn.width and 0 <= y and y + drawn.node_h <= drawn.height
        for x, y in box.values()
    )


def test_ordering_uncrosses_edges() -> None:
    # Added in an order that crosses: x1 runs after b, x2 after a.
    nodes = [node("a"), node("b"), node("x1", "b"), node("x2", "a")]
    y = {p.node.name: p.y for p in layout(nodes).nodes}
    assert (y["a"] < y["b"]) == (y["x2"] < y["x1"])


async def _diamond(app: durq.App, workflow_id: str) -> None:
    wf = durq.Workflow("etl", id=workflow_id)
    a = wf.add("etl:step", {}, name="a")
    b = wf.add("etl:step", {}, name="b", after=[a])
    c = wf.add("etl:step", {}, name="c", after=[a])
    wf.add("etl:step", {}, name="d", after=[b, c])
    await app.enqueue_workflow(wf)


async def test_pages_render_and_refuse_bad_searches(app: durq.App, api: httpx.AsyncClient) -> None:
    await _diamond(app, "wf-1")
    listing = await api.get("/workflows")
    assert listing.status_code == 200 and 'data-id="wf-1"' in listing.text
    assert (await api.get("/workflows", params={"state": "running"})).status_code == 200
    assert "No workflow matches" in (await api.get("/workflows?state=failed")).text
    for query in ("state=done", "newer_than=soon", "colour=red", "cursor=x"):
        r = await api.get(f"/workflows?{query}")
        assert r.status_code == 400, query
    page = await api.get("/workflows/wf-1")
    assert page.status_code == 200
    assert len(re.findall(r'<g class="node node-', page.text)) == 4
    assert len(re.findall(r'<path class="edge"', page.text)) == 4
    assert 'href="/queues/default/tasks/wf%3Awf-1%3Ad"' in page.text
    assert 'id="cancel-workflow"' in page.text
    missing = await api.get("/workflows/nope")
    assert missing.status_code == 404 and "no workflow" in missing.text


async def test_a_wide_workflow_is_drawn_whole(app: durq.App, api: httpx.AsyncClient) -> None:
    wf = durq.Workflow("wide", id="wide-1")
    root = wf.add("etl:step", {}, name="root")
    leaves = [wf.add("etl:step", {}, name=f"leaf{i}", after=[root]) for i in range(1000)]
    wf.add("etl:step", {}, name="merge", after=leaves)
    await app.enqueue_workflow(wf)
    page = await api.get("/workflows/wide-1")
    assert page.status_code == 200
    assert len(re.findall(r'<g class="node node-', page.text)) == 1002
    assert len(re.findall(r'<path class="edge"', page.text)) == 2000


async def test_read_only_shows_no_cancel_and_refuses_it(app: durq.App) -> None:
    await _diamond(app, "wf-1")
    dash = create_dashboard(app, token=TOKEN, read_only=True)
    transport = httpx.ASGITransport(app=dash)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=BEARER) as c:
        page = await c.get("/workflows/wf-1")
        assert page.status_code == 200 and 'id="cancel-workflow"' not in page.text
        assert (await c.post("/workflows/wf-1/cancel")).status_code == 403
    assert (await app.inspector.get_workflow("wf-1")).state == "running"
