"""The HTML pages and their actions, driven over HTTP (the browser tests drive the same)."""

from __future__ import annotations

import re

import httpx

import durq
from durq.dashboard.views import age

from .test_security import csrf_of


async def test_overview_queue_task_and_workers_pages(app: durq.App, api: httpx.AsyncClient) -> None:
    info = await app.enqueue("email:send", {"to": "a@b.c", "n": 1}, task_id="order-7")
    await app.enqueue("email:send", {}, queue="low", process_in=600)
    r = await api.get("/")
    assert r.status_code == 200
    assert 'data-queue="default"' in r.text and 'data-queue="low"' in r.text
    r = await api.get("/queues/default")
    assert r.status_code == 200 and "order-7" in r.text and "Pause queue" in r.text
    r = await api.get("/queues/default/tasks/order-7")
    assert r.status_code == 200
    assert "&#34;to&#34;: &#34;a@b.c&#34;" in r.text  # pretty-printed, escaped JSON
    assert "Archive" in r.text and info.id in r.text
    r = await api.get("/workers")
    assert r.status_code == 200 and "No worker" in r.text


async def test_search_by_id(app: durq.App, api: httpx.AsyncClient) -> None:
    await app.enqueue("email:send", {}, task_id="find/me")
    r = await api.get("/queues/default/search", params={"id": "find/me"})
    assert r.status_code == 303 and r.headers["location"] == "/queues/default/tasks/find%2Fme"
    assert (await api.get(r.headers["location"])).status_code == 200
    r = await api.get("/queues/default/search", params={"id": "nope"})
    assert r.status_code == 404 and "no task" in r.text


async def test_pagination_links(app: durq.App, api: httpx.AsyncClient) -> None:
    for i in range(5):
        await app.enqueue("email:send", {"n": i})
    r = await api.get("/queues/default", params={"page_size": 2})
    assert "page 1 of 3" in r.text and 'rel="next"' in r.text
    r = await api.get("/queues/default", params={"page_size": 2, "page": 3})
    assert "page 3 of 3" in r.text and 'rel="prev"' in r.text
    r = await api.get("/queues/default", params={"page": "x"})
    assert r.status_code == 400 and "page must be an integer" in r.text


async def test_actions_from_forms(app: durq.App, api: httpx.AsyncClient) -> None:
    await app.enqueue("email:send", {}, task_id="a1", process_in=600)
    page = await api.get("/queues/default/tasks/a1")
    token = csrf_of(page.text)
    r = await api.post("/queues/default/tasks/a1/action/archive", data={"csrf_token": token})
    assert r.status_code == 303 and "notice=" in r.headers["location"]
    assert (await app.inspector.get_task_info("default", "a1")).state.value == "archived"
    r = await api.post("/queues/default/tasks/a1/action/run", data={"csrf_token": token})
    assert (await app.inspector.get_task_info("default", "a1")).state.value == "pending"
    r = await api.post("/queues/default/tasks/a1/action/run", data={"csrf_token": token})
    assert r.status_code == 409 and "cannot run" in r.text
    r = await api.post("/queues/default/tasks/a1/action/explode", data={"csrf_token": token})
    assert r.status_code == 400
    r = await api.post(
        "/queues/default/bulk/delete_all", data={"csrf_token": token, "state": "pending"}
    )
    assert r.status_code == 303
    follow = await api.get(r.headers["location"])
    assert re.search(r"1 pending task\(s\) deleted", follow.text)


def test_age_format() -> None:
    assert age(0) == "-" and age(5) == "5s" and age(75) == "1m 15s"
    assert age(3700) == "1h 01m" and age(90000) == "1d 01h"


async def test_task_and_queue_pages_show_the_priority(
    app: durq.App, api: httpx.AsyncClient
) -> None:
    await app.enqueue("email:send", {}, task_id="urgent-7", priority=-42)
    r = await api.get("/queues/default/tasks/urgent-7")
    assert r.status_code == 200
    assert re.search(r"<dt>Priority</dt><dd>-42</dd>", r.text)
    r = await api.get("/queues/default")
    assert r.status_code == 200 and re.search(r'<td class="n">-42</td>', r.text)


async def test_W14_queue_page_shows_the_progress_of_running_tasks(
    app: durq.App, api: httpx.AsyncClient
) -> None:
    from durq.brokers.base import ClaimParams, ProgressParams
    from durq.progress import encode_line, encode_progress

    await app.enqueue("import:rows", {}, task_id="rows-1")
    broker = await app.broker()
    (lease,) = await broker.claim(ClaimParams(["default"], 1, "w1", 30.0))
    assert await broker.report_progress(
        ProgressParams(
            lease.ref,
            progress=encode_progress(1, 0.25, "rows <250>/1000", 1.0),
            lines=(encode_line(1, 1.0, "info", "<b>started</b>"),),
        )
    )
    r = await api.get("/queues/default", params={"state": "active"})
    assert r.status_code == 200
    assert '<td class="progress">25% rows &lt;250&gt;/1000 (attempt 1)</td>' in r.text
    r = await api.get("/queues/default/tasks/rows-1")
    assert '<progress id="progress-bar" max="1" value="0.25">' in r.text
    assert "info &lt;b&gt;started&lt;/b&gt;" in r.text  # escaped, never markup


async def test_task_page_and_api_show_the_recorded_steps(
    app: durq.App, api: httpx.AsyncClient
) -> None:
    from durq.brokers.base import ClaimParams, StepsParams
    from durq.steps import encode

    await app.enqueue("import:rows", {}, task_id="steps-1")
    broker = await app.broker()
    (lease,) = await broker.claim(ClaimParams(["default"], 1, "w1", 30.0))
    entry = {"result": {"id": "<ch_1>"}, "started": 100.0, "ended": 100.25, "attempt": 1}
    assert await broker.record_steps(StepsParams(lease.ref, encode({"<charge>": entry})))
    r = await api.get("/queues/default/tasks/steps-1")
    assert r.status_code == 200
    assert '<td class="mono">&lt;charge&gt;</td><td>1</td>' in r.text
    assert "0.250 s" in r.text
    r = await api.get("/api/queues/default/tasks/steps-1")
    assert r.status_code == 200
    (step,) = r.json()["steps"]
    assert (step["name"], step["result"], step["duration"]) == ("<charge>", {"id": "<ch_1>"}, 0.25)
    assert r.json()["snoozes"] == 0


async def test_task_page_shows_the_timeline_of_steps_sleeps_and_signals(
    app: durq.App, api: httpx.AsyncClient
) -> None:
    """A durable task's page lists its step, its sleep and its wait for a signal in order,
    each with its kind, and the waiting task shows as waiting while it waits."""
    import asyncio

    from durq.states import TaskState

    @app.task("order:approve", retention=60)
    async def approve(payload: dict[str, object], ctx: durq.TaskContext) -> str:
        await ctx.step("quote", lambda: 42)
        await ctx.sleep("cool-off", 0.05)
        answer = await ctx.wait_for("approval", timeout="1h")
        return str(answer)

    info = await app.enqueue("order:approve", {}, task_id="timeline-1")
    async with app.worker(concurrency=2, poll_interval=0.05, promote_interval=0.05):
        for _ in range(400):
            if (await app.inspector.get_task_info("default", info.id)).state is TaskState.WAITING:
                break
            await asyncio.sleep(0.05)
        r = await api.get("/queues/default/tasks/timeline-1")
        assert r.status_code == 200 and "waiting" in r.text
        assert await app.signal(info, "approval", "yes") is True
        assert await app.wait(info, timeout=20) == "yes"
    page = (await api.get("/queues/default/tasks/timeline-1")).text
    rows = [
        page.index(f'<td class="mono">{name}</td>') for name in ("quote", "cool-off", "approval")
    ]
    assert rows == sorted(rows)
    for kind in ("step-step", "step-sleep", "step-wait"):
        assert f'class="{kind}"' in page, kind


async def test_task_page_shows_the_unique_key_a_task_holds(
    app: durq.App, api: httpx.AsyncClient
) -> None:
    await app.enqueue(
        "crm:sync", {"account": 7}, task_id="uk-1", unique=durq.Unique(keys=["account"])
    )
    await app.enqueue("crm:sync", {"account": 8}, task_id="uk-2")
    page = (await api.get("/queues/default/tasks/uk-1")).text
    assert "<dt>Unique key</dt>" in page and "held until it finishes" in page
    assert "<dt>Unique key</dt>" not in (await api.get("/queues/default/tasks/uk-2")).text
    body = (await api.get("/api/queues/default/tasks/uk-1")).json()
    assert body["unique_until"] is not None
