"""S2: authentication, login cookie, CSRF, read-only mode, headers, escaping, mounting."""

from __future__ import annotations

import re

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

import durq
from durq.dashboard import create_dashboard

from .conftest import BEARER, TOKEN


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', html)
    assert match, "no CSRF field in the page"
    return match.group(1)


async def login(client: httpx.AsyncClient, prefix: str = "") -> httpx.Response:
    page = await client.get(f"{prefix}/login")
    return await client.post(
        f"{prefix}/login",
        data={"token": TOKEN, "csrf_token": csrf_of(page.text), "next": "/"},
    )


def test_a_token_or_the_insecure_flag_is_required(app: durq.App) -> None:
    with pytest.raises(ValueError, match="token"):
        create_dashboard(app)
    with pytest.raises(ValueError, match="not both"):
        create_dashboard(app, token=TOKEN, insecure_no_auth=True)
    with pytest.raises(ValueError, match="8 characters"):
        create_dashboard(app, token="short")


async def test_refused_without_credentials(client: httpx.AsyncClient) -> None:
    for path in ("/api/queues", "/api/openapi.json", "/metrics", "/api/workers"):
        r = await client.get(path)
        assert r.status_code == 401, path
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["error"]["code"] == "unauthorized"
    r = await client.get("/api/queues", headers={"Authorization": "Bearer wrong-token-123"})
    assert r.status_code == 401
    r = await client.post("/api/queues/default/pause")
    assert r.status_code == 401
    # pages send the browser to the login form, keeping where it wanted to go
    r = await client.get("/queues/default?state=retry")
    assert r.status_code == 303
    assert r.headers["location"] == "/login?next=/queues/default%3Fstate%3Dretry"
    assert (await client.get("/static/dash.css")).status_code == 200


async def test_login_sets_a_strict_httponly_cookie(client: httpx.AsyncClient) -> None:
    page = await client.get("/login")
    bad = await client.post(
        "/login", data={"token": "wrong", "csrf_token": csrf_of(page.text), "next": "/"}
    )
    assert bad.status_code == 401 and "wrong token" in bad.text
    r = await login(client)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = next(c for c in r.headers.get_list("set-cookie") if c.startswith("durq_session="))
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert (await client.get("/")).status_code == 200
    assert (await client.get("/api/queues")).status_code == 200  # the browser's fetch()


async def test_login_needs_its_csrf_token(client: httpx.AsyncClient) -> None:
    await client.get("/login")
    r = await client.post("/login", data={"token": TOKEN, "csrf_token": "0" * 40})
    assert r.status_code == 403
    assert "durq_session" not in r.headers.get("set-cookie", "")


async def test_login_next_never_leaves_the_site(client: httpx.AsyncClient) -> None:
    page = await client.get("/login")
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil"):
        r = await client.post(
            "/login", data={"token": TOKEN, "csrf_token": csrf_of(page.text), "next": target}
        )
        assert r.headers["location"] == "/"


async def test_cookie_mutations_need_csrf_and_same_origin(
    app: durq.App, client: httpx.AsyncClient
) -> None:
    await app.enqueue("email:send", {})
    await login(client)
    page = await client.get("/queues/default")
    token = csrf_of(page.text)
    # form without token, with a wrong one, and with the right one from another site
    assert (await client.post("/queues/default/pause", data={})).status_code == 403
    r = await client.post("/queues/default/pause", data={"csrf_token": "f" * 40})
    assert r.status_code == 403 and "CSRF" in r.text
    r = await client.post(
        "/queues/default/pause",
        data={"csrf_token": token},
        headers={"Origin": "https://evil.example"},
    )
    assert r.status_code == 403
    assert not (await app.inspector.queue_stats("default")).paused
    r = await client.post(
        "/queues/default/pause",
        data={"csrf_token": token},
        headers={"Origin": "http://testserver"},
    )
    assert r.status_code == 303
    assert (await app.inspector.queue_stats("default")).paused
    # the JSON API with the session cookie needs the header token
    assert (await client.post("/api/queues/default/unpause")).status_code == 403
    r = await client.post("/api/queues/default/unpause", headers={"X-CSRF-Token": token})
    assert r.status_code == 200 and r.json()["paused"] is False


async def test_the_csrf_token_is_bound_to_the_session(
    app: durq.App, dashboard, client: httpx.AsyncClient
) -> None:
    """Another session's token, or a pre-session token (which anyone can get for a cookie of
    their choosing from the login page), does not pass with this session's cookie."""
    await app.enqueue("email:send", {})
    transport = httpx.ASGITransport(app=dashboard)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as other:
        await login(other)
        theirs = csrf_of((await other.get("/queues/default")).text)
        their_cookie = other.cookies["durq_csrf"]
    # Anonymously, the token the login page gives for a cookie chosen by the caller.
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as anon:
        anon.cookies.set("durq_csrf", "chosen-by-the-attacker")
        anonymous = csrf_of((await anon.get("/login")).text)
    await login(client)
    ours = csrf_of((await client.get("/queues/default")).text)
    assert ours not in (theirs, anonymous)
    for cookie, token in ((their_cookie, theirs), ("chosen-by-the-attacker", anonymous)):
        client.cookies.set("durq_csrf", cookie)
        r = await client.post("/queues/default/pause", data={"csrf_token": token})
        assert r.status_code == 403 and "CSRF" in r.text
        r = await client.post("/api/queues/default/pause", headers={"X-CSRF-Token": token})
        assert r.status_code == 403
    assert not (await app.inspector.queue_stats("default")).paused
    # The session's own token works whatever the CSRF cookie says, until logout.
    r = await client.post("/api/queues/default/pause", headers={"X-CSRF-Token": ours})
    assert r.status_code == 200 and r.json()["paused"] is True
    r = await client.post("/logout", data={"csrf_token": ours})
    assert r.status_code == 303
    assert (await client.get("/login")).status_code == 200


async def test_bearer_requests_need_no_csrf(app: durq.App, client: httpx.AsyncClient) -> None:
    await app.enqueue("email:send", {})
    r = await client.post("/api/queues/default/pause", headers=BEARER)
    assert r.status_code == 200


async def test_read_only_refuses_every_action(app: durq.App) -> None:
    info = await app.enqueue("email:send", {}, process_in=60)
    dash = create_dashboard(app, token=TOKEN, read_only=True)
    transport = httpx.ASGITransport(app=dash)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=BEARER) as c:
        r = await c.post(f"/api/queues/default/tasks/{info.id}/run")
        assert r.status_code == 403 and "read-only" in r.json()["error"]["message"]
        r = await c.delete(f"/api/queues/default/tasks/{info.id}")
        assert r.status_code == 403
        page = await c.get(f"/queues/default/tasks/{info.id}")
        assert page.status_code == 200 and "action-run" not in page.text
        assert "read-only" in page.text
    assert (await app.inspector.get_task_info("default", info.id)).state.value == "scheduled"


async def test_security_headers_and_escaping(app: durq.App, api: httpx.AsyncClient) -> None:
    evil = "<script>alert(1)</script>"
    info = await app.enqueue("email:send", {"to": evil}, task_id="x-1")
    r = await api.get(f"/queues/default/tasks/{info.id}")
    assert r.status_code == 200
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert evil not in r.text and "&lt;script&gt;" in r.text
    notice = await api.get("/", params={"notice": evil})
    assert evil not in notice.text


async def test_insecure_mode_still_checks_csrf(app: durq.App) -> None:
    await app.enqueue("email:send", {})
    dash = create_dashboard(app, insecure_no_auth=True)
    transport = httpx.ASGITransport(app=dash)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        page = await c.get("/queues/default")
        assert page.status_code == 200 and "no auth" in page.text
        r = await c.post("/queues/default/pause", data={}, headers={"Origin": "http://evil"})
        assert r.status_code == 403
        r = await c.post("/api/queues/default/pause", headers={"Origin": "http://evil"})
        assert r.status_code == 403
        r = await c.post("/queues/default/pause", data={"csrf_token": csrf_of(page.text)})
        assert r.status_code == 303
    assert (await app.inspector.queue_stats("default")).paused


async def test_mounted_under_a_prefix(app: durq.App) -> None:
    await app.enqueue("email:send", {"n": 1}, task_id="t-1")
    host = Starlette(routes=[Mount("/admin/durq", app=create_dashboard(app, token=TOKEN))])
    transport = httpx.ASGITransport(app=host)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.get("/admin/durq/queues/default")
        assert r.status_code == 303
        assert r.headers["location"] == "/admin/durq/login?next=/queues/default"
        r = await login(c, "/admin/durq")
        assert r.headers["location"] == "/admin/durq/"
        assert "Path=/admin/durq" in r.headers["set-cookie"]
        page = await c.get("/admin/durq/queues/default")
        assert page.status_code == 200
        assert 'href="/admin/durq/queues/default/tasks/t-1"' in page.text
        assert 'href="/admin/durq/static/dash.css"' in page.text
        assert (await c.get("/admin/durq/static/dash.js")).status_code == 200
        doc = (await c.get("/admin/durq/api/openapi.json")).json()
        assert doc["servers"] == [{"url": "/admin/durq"}]
