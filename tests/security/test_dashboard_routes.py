"""Every dashboard and admin API route, enumerated from the app itself (S2): refused without
credentials, mutations refused without a CSRF token or from a foreign Origin, HTML/JS in task
data and in errors escaped on every page, security headers on every answer.

tests/dashboard/test_security.py covers the login flow and a sample of routes; this module
walks *all* of them, so a route added later without protection fails here."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import durq
from durq.dashboard import create_dashboard

TOKEN = "route-test-token-0123"
EVIL = "<script>alert('x')</script>"
EVIL_ATTR = '"><img src=x onerror=alert(1)>'

#: Concrete requests for each route template; the test below checks this covers them all.
CONCRETE = {
    "/api/openapi.json": "/api/openapi.json",
    "/api/queues": "/api/queues",
    "/api/queues/{queue}": "/api/queues/default",
    "/api/queues/{queue}/pause": "/api/queues/default/pause",
    "/api/queues/{queue}/unpause": "/api/queues/default/unpause",
    "/api/queues/{queue}/tasks": "/api/queues/default/tasks",
    "/api/queues/{queue}/tasks:run_all": "/api/queues/default/tasks:run_all?state=archived",
    "/api/queues/{queue}/tasks:delete_all": "/api/queues/default/tasks:delete_all?state=archived",
    "/api/queues/{queue}/history": "/api/queues/default/history",
    "/api/queues/{queue}/partitions": "/api/queues/default/partitions",
    "/api/queues/{queue}/unique": "/api/queues/default/unique",
    "/api/queues/{queue}/tasks/{task_id:path}/run": "/api/queues/default/tasks/evil-1/run",
    "/api/queues/{queue}/tasks/{task_id:path}/archive": "/api/queues/default/tasks/evil-1/archive",
    "/api/queues/{queue}/tasks/{task_id:path}/cancel": "/api/queues/default/tasks/evil-1/cancel",
    "/api/queues/{queue}/tasks/{task_id:path}/signals/{name}": (
        "/api/queues/default/tasks/evil-1/signals/partner-callback"
    ),
    "/api/queues/{queue}/tasks/{task_id:path}": "/api/queues/default/tasks/evil-1",
    "/api/queues/{queue}/tasks:bulk": "/api/queues/default/tasks:bulk",
    "/api/queues/{queue}/groups/{group_id}": "/api/queues/default/groups/g-1",
    "/api/workflows": "/api/workflows",
    "/api/workflows/{workflow_id}": "/api/workflows/wf-1",
    "/api/workflows/{workflow_id}/cancel": "/api/workflows/wf-1/cancel",
    "/api/workers": "/api/workers",
    "/api/periodic": "/api/periodic",
    "/api/limits": "/api/limits",
    "/api/limits/{queue}/{key:path}": "/api/limits/default/partner%3Aevil-1",
    "/api/history": "/api/history",
    "/api/scaling": "/api/scaling",
    "/api/schedules": "/api/schedules",
    "/api/schedules/{name}": "/api/schedules/evil-1",
    "/api/schedules/{name}/pause": "/api/schedules/evil-1/pause",
    "/api/schedules/{name}/resume": "/api/schedules/evil-1/resume",
    "/api/schedules/{name}/trigger": "/api/schedules/evil-1/trigger",
    "/api/schedules/{name}/backfill": "/api/schedules/evil-1/backfill",
    "/": "/",
    "/login": "/login",
    "/logout": "/logout",
    "/workflows": "/workflows",
    "/workflows/{workflow_id}": "/workflows/wf-1",
    "/workflows/{workflow_id}/cancel": "/workflows/wf-1/cancel",
    "/workers": "/workers",
    "/periodic": "/periodic",
    "/periodic/new": "/periodic/new",
    "/periodic/{name}/edit": "/periodic/evil-1/edit",
    "/periodic/{name}/action/{action}": "/periodic/evil-1/action/pause",
    "/limits": "/limits?queue=default",
    "/limits/{queue}/override": "/limits/default/override",
    "/queues/{queue}/selection": "/queues/default/selection",
    "/queues/{queue}": "/queues/default",
    "/queues/{queue}/search": "/queues/default/search?q=evil",
    "/queues/{queue}/pause": "/queues/default/pause",
    "/queues/{queue}/unpause": "/queues/default/unpause",
    "/queues/{queue}/bulk/{action}": "/queues/default/bulk/run_all",
    "/queues/{queue}/tasks/{task_id:path}/action/{action}": "/queues/default/tasks/evil-1/action/run",
    "/queues/{queue}/tasks/{task_id:path}": "/queues/default/tasks/evil-1",
    "/metrics": "/metrics",
}
#: Routes that answer without credentials by design.
PUBLIC = {("GET", "/login"), ("POST", "/login"), ("POST", "/logout")}


def route_table(guard) -> list[tuple[str, str]]:
    dash = guard.dash
    out = []
    for route in [*dash.api.routes(), *dash.views.routes()]:
        for method in sorted(route.methods or []):
            if method != "HEAD":
                out.append((method, route.path))
    out.append(("GET", "/metrics"))
    return out


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[durq.App]:
    application = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")

    @application.task("evil:task", queue="default", max_retry=0)
    async def evil(payload: dict) -> None:
        raise RuntimeError(EVIL)

    broker = await application.broker()
    await broker.migrate()
    await application.enqueue(
        "evil:task",
        {"html": EVIL, "attr": EVIL_ATTR},
        task_id="evil-1",
        process_in=3600,
        headers={"x": EVIL},
    )
    yield application
    await application.close()


@pytest.fixture
def guard(app: durq.App):
    return create_dashboard(app, token=TOKEN)


@pytest.fixture
async def client(guard) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=guard)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', html)
    assert match
    return match.group(1)


async def login(client: httpx.AsyncClient) -> str:
    page = await client.get("/login")
    r = await client.post(
        "/login", data={"token": TOKEN, "csrf_token": csrf_of(page.text), "next": "/"}
    )
    assert r.status_code == 303
    return csrf_of((await client.get("/queues/default")).text)


def test_every_route_has_a_concrete_request(guard) -> None:
    missing = {path for _, path in route_table(guard)} - set(CONCRETE)
    assert not missing, f"add these routes to CONCRETE: {missing}"


async def test_every_route_refuses_anonymous_requests(guard, client, app) -> None:
    for method, template in route_table(guard):
        if (method, template) in PUBLIC:
            continue
        r = await client.request(method, CONCRETE[template])
        if template.startswith("/api") or template == "/metrics":
            assert r.status_code == 401, (method, template, r.status_code)
        else:
            assert r.status_code in (303, 401), (method, template, r.status_code)
            if r.status_code == 303:
                assert r.headers["location"].startswith("/login")
    # Nothing changed.
    info = await app.inspector.get_task_info("default", "evil-1")
    assert info.state.value == "scheduled"
    assert not (await app.inspector.queue_stats("default")).paused
    assert not any(s.overridden for s in await app.inspector.list_limits())


async def test_every_mutation_needs_csrf_and_same_origin(guard, client, app) -> None:
    token = await login(client)
    mutations = [(m, t) for m, t in route_table(guard) if m != "GET" and (m, t) not in PUBLIC]
    assert len(mutations) >= 12
    for method, template in mutations:
        url = CONCRETE[template]
        is_api = template.startswith("/api")
        # No token at all.
        r = await client.request(method, url, data=None if is_api else {})
        assert r.status_code == 403, ("no token", method, template, r.status_code)
        # The right token, from another site.
        kwargs = {"headers": {"X-CSRF-Token": token}} if is_api else {"data": {"csrf_token": token}}
        kwargs.setdefault("headers", {})["Origin"] = "https://evil.example"
        r = await client.request(method, url, **kwargs)
        assert r.status_code == 403, ("foreign origin", method, template, r.status_code)
        # A wrong token from the right site.
        kwargs["headers"]["Origin"] = "http://testserver"
        if is_api:
            kwargs["headers"]["X-CSRF-Token"] = "0" * len(token)
        else:
            kwargs["data"] = {"csrf_token": "0" * len(token)}
        r = await client.request(method, url, **kwargs)
        assert r.status_code == 403, ("wrong token", method, template, r.status_code)
    info = await app.inspector.get_task_info("default", "evil-1")
    assert info.state.value == "scheduled"
    assert not (await app.inspector.queue_stats("default")).paused
    assert not any(s.overridden for s in await app.inspector.list_limits())


async def test_html_in_task_data_and_errors_is_escaped_on_every_page(guard, client, app) -> None:
    # Give the task an error message and a result containing markup too, and a limit key.
    await app.inspector.run_task("default", "evil-1")
    limited = await app.enqueue(
        "evil:task", {"html": EVIL}, limit=durq.Limit("k:{html}", concurrency=1)
    )
    async with app.worker(queues=["default"], concurrency=1, poll_interval=0.05):
        import asyncio

        for _ in range(200):
            ids = ("evil-1", limited.id)
            states = [(await app.inspector.get_task_info("default", i)).state.value for i in ids]
            if states == ["archived", "archived"]:
                break
            await asyncio.sleep(0.02)
    info = await app.inspector.get_task_info("default", "evil-1")
    assert info.state.value == "archived" and EVIL in (info.last_error or "")
    await login(client)
    pages = [
        "/",
        "/workers",
        "/limits",
        f"/limits?queue={EVIL}",
        "/queues/default",
        "/queues/default?state=archived",
        f"/queues/default/search?q={EVIL}",
        "/queues/default/tasks/evil-1",
        f"/queues/default/tasks/{EVIL}",
        f"/queues/{EVIL}",
        f"/?notice={EVIL}",
        f"/login?next={EVIL_ATTR}",
        f"/nowhere/{EVIL}",
    ]
    for page in pages:
        r = await client.get(page)
        assert EVIL not in r.text and "<img src=x" not in r.text, (page, r.status_code)
        assert "onerror=alert" not in r.text or "&" in r.text, page
        ctype = r.headers.get("content-type", "")
        if r.status_code < 300 and page != "/metrics":
            assert ctype.startswith("text/html"), (page, ctype)
        csp = r.headers.get("content-security-policy", "")
        assert "default-src 'none'" in csp and "script-src 'self'" in csp, (page, csp)
        assert r.headers.get("x-content-type-options") == "nosniff", page
    detail = await client.get("/queues/default/tasks/evil-1")
    assert "&lt;script&gt;" in detail.text
    assert "k:&lt;script&gt;" in (await client.get("/limits")).text


async def test_api_errors_are_json_not_html(client) -> None:
    r = await client.get(
        f"/api/queues/default/tasks/{EVIL}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert r.status_code in (400, 404)
    assert r.headers["content-type"].startswith("application/json")
    assert "content-security-policy" in r.headers
    r = await client.get(
        "/api/queues/default/tasks?state=<b>", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert r.status_code in (400, 422)
    assert r.headers["content-type"].startswith("application/json")
