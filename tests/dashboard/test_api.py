"""The admin HTTP API (I1-I5) and its error mapping: 4xx JSON for bad input, never a 500."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import durq
from durq.brokers.base import ClaimParams
from durq.dashboard import create_dashboard
from durq.states import TaskState


async def test_queues_and_one_queue(app: durq.App, api: httpx.AsyncClient) -> None:
    await app.enqueue("email:send", {"to": "a@b.c"})
    await app.enqueue("email:send", {"to": "d@e.f"}, queue="low", process_in=60)
    r = await api.get("/api/queues")
    assert r.status_code == 200
    by_name = {q["name"]: q for q in r.json()["queues"]}
    assert by_name["default"]["sizes"]["pending"] == 1
    assert by_name["low"]["sizes"]["scheduled"] == 1
    assert by_name["default"]["paused"] is False
    r = await api.get("/api/queues/low")
    assert r.status_code == 200 and r.json()["size"] == 1


async def test_limits(app: durq.App, api: httpx.AsyncClient) -> None:
    limit = durq.Limit("partner:{p}", concurrency=1)
    held = [(await app.enqueue("call", {"p": "acme"}, limit=limit)).id for _ in range(2)]
    broker = await app.broker()
    await broker.claim(ClaimParams(["default"], 10, "w1", 30.0))
    r = await api.get("/api/limits")
    assert r.status_code == 200
    assert r.json()["limits"] == [
        {
            "queue": "default",
            "key": "partner:acme",
            "running": 1,
            "concurrency": 1,
            "rate": None,
            "per": None,
            "tokens": None,
            "waiting": 1,
            "override": None,
        }
    ]
    task = (await api.get(f"/api/queues/default/tasks/{held[1]}")).json()
    assert task["held_by"] == "partner:acme"
    assert task["limits"] == [{"key": "partner:acme", "concurrency": 1, "rate": None, "per": None}]
    r = await api.get("/api/queues/default/tasks", params={"state": "pending"})
    assert [t["held_by"] for t in r.json()["tasks"]] == ["partner:acme"]


async def test_tasks_paginated(app: durq.App, api: httpx.AsyncClient) -> None:
    ids = [(await app.enqueue("email:send", {"n": i})).id for i in range(5)]
    r = await api.get("/api/queues/default/tasks", params={"state": "pending", "page_size": 2})
    body = r.json()
    assert r.status_code == 200
    assert body["total"] == 5 and body["page"] == 1 and len(body["tasks"]) == 2
    seen = [t["id"] for t in body["tasks"]]
    for page in (2, 3):
        r = await api.get(
            "/api/queues/default/tasks", params={"state": "pending", "page_size": 2, "page": page}
        )
        seen += [t["id"] for t in r.json()["tasks"]]
    assert sorted(seen) == sorted(ids)
    r = await api.get("/api/queues/default/tasks", params={"state": "archived"})
    assert r.json()["tasks"] == [] and r.json()["total"] == 0


async def test_one_task_and_actions(app: durq.App, api: httpx.AsyncClient) -> None:
    info = await app.enqueue("email:send", {"to": "x"}, process_in=3600, task_id="order/1")
    r = await api.get("/api/queues/default/tasks/order/1")
    assert r.status_code == 200
    assert r.json()["payload"] == {"to": "x"} and r.json()["state"] == "scheduled"

    r = await api.post("/api/queues/default/tasks/order/1/archive")
    assert r.status_code == 200 and r.json()["state"] == "archived"
    r = await api.post("/api/queues/default/tasks/order/1/run")
    assert r.status_code == 200 and r.json()["state"] == "pending"
    # pending cannot be "run" again: a 409, not a 500
    r = await api.post("/api/queues/default/tasks/order/1/run")
    assert r.status_code == 409 and r.json()["error"]["code"] == "invalid_state"
    r = await api.delete(f"/api/queues/default/tasks/{info.id}")
    assert r.status_code == 204
    r = await api.get(f"/api/queues/default/tasks/{info.id}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


async def test_bulk_and_pause(app: durq.App, api: httpx.AsyncClient) -> None:
    for i in range(3):
        await app.enqueue("email:send", {"n": i}, process_in=3600)
    r = await api.post("/api/queues/default/tasks:run_all", params={"state": "scheduled"})
    assert r.status_code == 200 and r.json()["count"] == 3
    stats = await app.inspector.queue_stats("default")
    assert stats.sizes[TaskState.PENDING] == 3
    r = await api.post("/api/queues/default/tasks:delete_all", params={"state": "pending"})
    assert r.json()["count"] == 3
    r = await api.post("/api/queues/default/tasks:run_all", params={"state": "pending"})
    assert r.status_code == 409
    r = await api.post("/api/queues/default/tasks:run_all")
    assert r.status_code == 400

    r = await api.post("/api/queues/default/pause")
    assert r.status_code == 200 and r.json()["paused"] is True
    r = await api.post("/api/queues/default/unpause")
    assert r.json()["paused"] is False


@pytest.mark.parametrize(
    ("method", "url", "status"),
    [
        ("GET", "/api/queues/nope", 404),
        ("GET", "/api/queues/nope/tasks", 404),
        ("POST", "/api/queues/nope/pause", 404),
        ("GET", "/api/queues/default/tasks/missing", 404),
        ("POST", "/api/queues/default/tasks/missing/cancel", 404),
        ("GET", "/api/queues/bad%20name", 400),
        ("GET", "/api/queues/default/tasks?state=bogus", 400),
        ("GET", "/api/queues/default/tasks?page=0", 400),
        ("GET", "/api/queues/default/tasks?page=abc", 400),
        ("GET", "/api/queues/default/tasks?page_size=100000", 400),
        ("GET", "/api/queues/default/tasks?page=99999999999999999999999", 400),
        ("PUT", "/api/queues", 405),
        ("DELETE", "/api/queues/default", 405),
        ("GET", "/api/queues/default/pause", 405),
        ("GET", "/api/nothing-here", 404),
    ],
)
async def test_bad_input_is_a_json_4xx(
    app: durq.App, api: httpx.AsyncClient, method: str, url: str, status: int
) -> None:
    await app.enqueue("email:send", {})
    r = await api.request(method, url)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert set(r.json()["error"]) == {"code", "message"}


async def test_workers(app: durq.App, api: httpx.AsyncClient) -> None:
    async with app.worker(concurrency=3) as worker:
        r = await api.get("/api/workers")
        workers = r.json()["workers"]
        assert [w["id"] for w in workers] == [worker.id]
        assert workers[0]["concurrency"] == 3 and workers[0]["started_at"]


async def test_broker_unavailable_is_503() -> None:
    app = durq.App("sqlite:////nonexistent/dir/durq.sqlite3")
    dash = create_dashboard(app, token="t" * 16)
    transport = httpx.ASGITransport(app=dash)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.get("/api/queues", headers={"Authorization": "Bearer " + "t" * 16})
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["code"] == "broker_unavailable"
        r = await c.get("/", headers={"Authorization": "Bearer " + "t" * 16})
        assert r.status_code == 503 and "Broker unavailable" in r.text


async def test_openapi_lists_every_route(api: httpx.AsyncClient) -> None:
    doc = (await api.get("/api/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    assert "/api/queues/{queue}/tasks/{task_id}/run" in doc["paths"]
    assert "/api/workers" in doc["paths"]


async def test_a_failed_task_shows_its_traceback(
    app: durq.App, api: httpx.AsyncClient, client: httpx.AsyncClient
) -> None:
    @app.task("parse:reply", max_retry=0)
    async def parse(payload: dict) -> None:
        try:
            {}["total"]
        except KeyError as exc:
            raise RuntimeError("reply <unusable>") from exc

    info = await parse.enqueue({})
    async with app.worker(poll_interval=0.05):
        for _ in range(200):
            if (await app.inspector.get_task_info("default", info.id)).state is TaskState.ARCHIVED:
                break
            await asyncio.sleep(0.05)
    body = (await api.get(f"/api/queues/default/tasks/{info.id}")).json()
    assert body["last_error"] == "RuntimeError: reply <unusable>"
    assert "KeyError: 'total'" in body["traceback"]
    assert "direct cause" in body["traceback"]
    listed = (await api.get("/api/queues/default/tasks", params={"state": "archived"})).json()
    assert "traceback" not in listed["tasks"][0]  # lists keep the one-line error
    page = (await client.get(f"/queues/default/tasks/{info.id}")).text
    assert 'id="traceback"' in page and "KeyError: &#39;total&#39;" in page
    assert "reply &lt;unusable&gt;" in page


async def test_group_progress_in_the_api_and_on_the_task_page(
    app: durq.App, api: httpx.AsyncClient, client: httpx.AsyncClient
) -> None:
    group = await app.enqueue_group(
        [durq.EnqueueRequest("part:x", {"i": i}) for i in range(3)], then="part:merge"
    )
    first, second, _ = (t.id for t in group.tasks)
    await app.inspector.cancel_task("default", second)
    body = (await api.get(f"/api/queues/default/groups/{group.id}")).json()
    assert (body["total"], body["finished"]) == (3, 1)
    assert body["by_state"] == {"pending": 2, "archived": 1}
    assert body["then_id"] == f"group:{group.id}" and body["finished_at"] is None
    assert [m["id"] for m in body["members"]] == [t.id for t in group.tasks]
    task = (await api.get(f"/api/queues/default/tasks/{first}")).json()
    assert task["group"] == {"id": group.id, "queue": "default"}
    missing = await api.get("/api/queues/default/groups/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert (await api.get("/api/queues/default/groups/bad:id")).status_code in (400, 422)
    page = (await client.get(f"/queues/default/tasks/{first}")).text
    assert 'id="group"' in page and "1 of 3 finished" in page
    assert f'href="/queues/default/tasks/{second}"' in page
    assert f"group:{group.id}" in page  # the follow-up to come


async def test_priority_in_task_and_list(app: durq.App, api: httpx.AsyncClient) -> None:
    await app.enqueue("email:send", {"n": 1}, task_id="urgent", priority=90)
    await app.enqueue("email:send", {"n": 2}, task_id="plain")
    r = await api.get("/api/queues/default/tasks/urgent")
    assert r.status_code == 200 and r.json()["priority"] == 90
    r = await api.get("/api/queues/default/tasks", params={"state": "pending"})
    assert {t["id"]: t["priority"] for t in r.json()["tasks"]} == {"urgent": 90, "plain": 0}
    doc = (await api.get("/api/openapi.json")).json()
    assert doc["components"]["schemas"]["Task"]["properties"]["priority"]["maximum"] == 100


async def test_W14_task_shows_progress_and_log_lines(app: durq.App, api: httpx.AsyncClient) -> None:
    from durq.brokers.base import ProgressParams
    from durq.progress import encode_line, encode_progress

    info = await app.enqueue("import:rows", {})
    broker = await app.broker()
    (lease,) = await broker.claim(ClaimParams(["default"], 1, "w1", 30.0))
    assert await broker.report_progress(
        ProgressParams(
            lease.ref,
            progress=encode_progress(1, 0.4, "rows 400/1000", 1_700_000_000.0),
            lines=(encode_line(1, 1_700_000_000.0, "warning", "nul\\x00 kept as text"),),
        )
    )
    task = (await api.get(f"/api/queues/default/tasks/{info.id}")).json()
    assert task["progress"] == {
        "attempt": 1,
        "fraction": 0.4,
        "message": "rows 400/1000",
        "at": "2023-11-14T22:13:20+00:00",
    }
    assert task["logs"] == [
        {
            "attempt": 1,
            "at": "2023-11-14T22:13:20+00:00",
            "level": "warning",
            "message": "nul\\x00 kept as text",
        }
    ]
    # Lists carry the progress (a running task's bar) but not the log.
    r = await api.get("/api/queues/default/tasks", params={"state": "active"})
    (row,) = r.json()["tasks"]
    assert row["progress"]["fraction"] == 0.4 and "logs" not in row


async def test_W19_a_signal_over_http(app: durq.App, api: httpx.AsyncClient) -> None:
    await app.enqueue("email:send", {"to": "x"}, process_in=3600, task_id="order/2")
    url = "/api/queues/default/tasks/order/2/signals/partner-callback"
    r = await api.post(url, json={"policy": "POL-1"})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "queue": "default",
        "id": "order/2",
        "name": "partner-callback",
        "delivered": True,
    }
    r = await api.post(url, json={"policy": "again"})
    assert r.status_code == 200 and r.json()["delivered"] is False
    r = await api.post("/api/queues/default/tasks/order/2/signals/no%20spaces", json=1)
    assert r.status_code == 400 and "error" in r.json()
    r = await api.post("/api/queues/default/tasks/nope/signals/cb", json=1)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await api.post("/api/queues/default/tasks/order/2/signals/nul", json="a\u0000b")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
    doc = (await api.get("/api/openapi.json")).json()
    assert "/api/queues/{queue}/tasks/{task_id}/signals/{name}" in doc["paths"]
