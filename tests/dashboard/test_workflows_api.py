"""Workflows in the admin API: list, one, cancel; JSON errors; the write endpoint behind the
same authentication, CSRF and read-only rules as every other."""

from __future__ import annotations

from typing import Any

import httpx

import durq
from durq.dashboard import create_dashboard

from .conftest import BEARER, TOKEN
from .test_security import csrf_of, login


def _tasks(app: durq.App) -> None:
    @app.task("etl:step")
    async def step(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        return 1 + sum(ctx.dependencies.values())


async def _open(app: durq.App, workflow_id: str) -> durq.WorkflowInfo:
    wf = durq.Workflow("import", id=workflow_id)
    read = wf.add("imp:read", {}, name="read")
    wf.add("imp:write", {}, name="write", after=[read])
    return await app.enqueue_workflow(wf)


async def test_list_one_and_cancel(app: durq.App, api: httpx.AsyncClient) -> None:
    _tasks(app)
    wf = durq.Workflow("etl", id="done-1")
    a = wf.add("etl:step", {}, name="a")
    wf.add("etl:step", {}, name="b", after=[a])
    done = await app.enqueue_workflow(wf)
    async with app.worker(concurrency=2, poll_interval=0.05):
        assert await app.wait(done, timeout=60) == {"b": 2}
    await _open(app, "open-1")

    listed = (await api.get("/api/workflows")).json()
    assert [(w["id"], w["state"]) for w in listed["workflows"]] == [
        ("open-1", "running"),
        ("done-1", "succeeded"),
    ]
    assert listed["cursor"] is None and "nodes" not in listed["workflows"][0]
    assert listed["workflows"][0]["by_state"] == {"pending": 1, "waiting": 1}
    only = (await api.get("/api/workflows", params={"state": "succeeded"})).json()
    assert [w["id"] for w in only["workflows"]] == ["done-1"]
    old = (await api.get("/api/workflows", params={"older_than": 3600})).json()
    assert old["workflows"] == []
    first = (await api.get("/api/workflows", params={"limit": 1})).json()
    rest = (await api.get("/api/workflows", params={"limit": 1, "cursor": first["cursor"]})).json()
    assert [w["id"] for w in first["workflows"] + rest["workflows"]] == ["open-1", "done-1"]

    one = (await api.get("/api/workflows/done-1")).json()
    assert (one["name"], one["state"], one["finished"], one["total"]) == ("etl", "succeeded", 2, 2)
    assert [(n["name"], n["after"], n["state"], n["attempts"]) for n in one["nodes"]] == [
        ("a", [], "completed", 1),
        ("b", ["a"], "completed", 1),
    ]
    assert one["nodes"][1]["task_id"] == "wf:done-1:b"

    r = await api.post("/api/workflows/open-1/cancel")
    assert r.status_code == 200 and r.json() == {"id": "open-1", "cancelled": 2}
    after = (await api.get("/api/workflows/open-1")).json()
    assert after["state"] == "cancelled" and after["by_state"] == {"archived": 2}


async def test_errors_are_json(api: httpx.AsyncClient) -> None:
    r = await api.get("/api/workflows/nope")
    assert r.status_code == 404
    assert r.json()["error"] == {"code": "not_found", "message": "no workflow 'nope'"}
    assert (await api.post("/api/workflows/nope/cancel")).status_code == 404
    for params in ({"state": "done"}, {"limit": 0}, {"newer_than": -1}, {"cursor": "x"}):
        r = await api.get("/api/workflows", params=params)
        assert r.status_code == 400, params
        assert "error" in r.json()
    r = await api.get("/api/workflows/bad:id")
    assert r.status_code == 400 and "error" in r.json()
    doc = (await api.get("/api/openapi.json")).json()
    assert {"/api/workflows", "/api/workflows/{workflow_id}"} <= set(doc["paths"])
    assert "post" in doc["paths"]["/api/workflows/{workflow_id}/cancel"]


async def test_cancel_needs_auth_csrf_and_a_writable_dashboard(
    app: durq.App, client: httpx.AsyncClient
) -> None:
    await _open(app, "open-1")
    assert (await client.post("/api/workflows/open-1/cancel")).status_code == 401
    await login(client)
    # A session cookie alone is not enough for a write: the CSRF header is needed.
    assert (await client.post("/api/workflows/open-1/cancel")).status_code == 403
    assert (await app.inspector.get_workflow("open-1")).state == "running"
    token = csrf_of((await client.get("/queues/default")).text)
    r = await client.post("/api/workflows/open-1/cancel", headers={"X-CSRF-Token": token})
    assert r.status_code == 200 and r.json()["cancelled"] == 2

    await _open(app, "open-2")
    dash = create_dashboard(app, token=TOKEN, read_only=True)
    transport = httpx.ASGITransport(app=dash)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=BEARER) as c:
        r = await c.post("/api/workflows/open-2/cancel")
        assert r.status_code == 403 and "read-only" in r.json()["error"]["message"]
        assert (await c.get("/api/workflows/open-2")).json()["state"] == "running"
