"""Dashboard hardening: the Host check against DNS rebinding in every mode, revocable and
short sessions, a per-client limit on failed authentication, only server-issued notices,
a truthful ``Allow``, and the server ``durq dash`` runs (timeouts on slow clients, Secure
cookies on request, forwarded headers only from named proxies)."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

import durq
from durq.dashboard import DashboardSettings, create_dashboard
from durq.dashboard.server import server_config

TOKEN = "hardening-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def client_for(asgi, client: tuple[str, int] = ("127.0.0.1", 50000)) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=asgi, client=client)
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8181")


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', html)
    assert match, html[:300]
    return match.group(1)


async def login(client: httpx.AsyncClient) -> str:
    page = await client.get("/login")
    r = await client.post("/login", data={"token": TOKEN, "csrf_token": csrf_of(page.text)})
    assert r.status_code == 303, r.text
    return r.headers["set-cookie"]


# -- Host ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["insecure", "token"])
async def test_a_foreign_host_is_refused_in_every_mode(app: durq.App, mode: str) -> None:
    """A DNS-rebinding page (its own name, now pointing at 127.0.0.1) can neither read the
    CSRF token nor act."""
    kwargs = {"insecure_no_auth": True} if mode == "insecure" else {"token": TOKEN}
    async with client_for(create_dashboard(app, **kwargs)) as client:
        evil = {"Host": "attacker.example:8181"}
        r = await client.get("/", headers=evil)
        assert r.status_code == 400 and "csrf" not in r.text.lower()
        assert r.headers["content-security-policy"]
        r = await client.get("/api/queues", headers={**evil, **BEARER})
        assert r.status_code == 400
        r = await client.post("/api/queues/default/pause", headers={**evil, **BEARER})
        assert r.status_code == 400
        for host in ("127.0.0.1:8181", "localhost:8181", "[::1]:8181", "10.1.2.3"):
            r = await client.get("/api/queues", headers={"Host": host, **BEARER})
            assert r.status_code == 200, host
    assert not (await app.inspector.list_queues()) or not any(
        q.paused for q in await app.inspector.list_queues()
    )
    settings = DashboardSettings(allowed_hosts=(".example.com",))
    async with client_for(create_dashboard(app, token=TOKEN, settings=settings)) as client:
        r = await client.get("/api/queues", headers={"Host": "ops.example.com", **BEARER})
        assert r.status_code == 200
        r = await client.get("/api/queues", headers={"Host": "example.com.evil", **BEARER})
        assert r.status_code == 400


# -- sessions --------------------------------------------------------------------------------


async def test_logout_revokes_the_session_and_sessions_are_short(app: durq.App) -> None:
    guard = create_dashboard(app, token=TOKEN)
    async with client_for(guard) as client:
        cookie = await login(client)
        max_age = int(re.search(r"Max-Age=(\d+)", cookie).group(1))
        assert 0 < max_age <= 3600
        session = client.cookies.get("durq_session")
        assert (await client.get("/")).status_code == 200
        page = await client.get("/")
        r = await client.post("/logout", data={"csrf_token": csrf_of(page.text)})
        assert r.status_code == 303
    # A copy of the old cookie (stolen, or kept by the browser) no longer works.
    async with client_for(guard) as replay:
        replay.cookies.set("durq_session", session)
        r = await replay.get("/")
        assert r.status_code == 303 and "/login" in r.headers["location"]


# -- failed authentication -------------------------------------------------------------------


async def test_failed_authentication_is_limited_per_client(app: durq.App) -> None:
    guard = create_dashboard(app, token=TOKEN)
    attacker = client_for(guard, client=("198.51.100.7", 40000))
    other = client_for(guard, client=("198.51.100.8", 40000))
    async with attacker, other:
        statuses = []
        for i in range(30):
            r = await attacker.get("/api/queues", headers={"Authorization": f"Bearer guess{i}"})
            statuses.append(r.status_code)
        assert statuses[:10] == [401] * 10
        assert set(statuses[10:]) == {429}
        assert int(r.headers["retry-after"]) >= 1
        # Blocked even with the right token (no free guesses), and on the login form.
        assert (await attacker.get("/api/queues", headers=BEARER)).status_code == 429
        page = await attacker.get("/login")
        r = await attacker.post("/login", data={"token": TOKEN, "csrf_token": csrf_of(page.text)})
        assert r.status_code == 429
        # Another client is not affected.
        assert (await other.get("/api/queues", headers=BEARER)).status_code == 200
        # Wrong tokens on the login form count too.
        for _ in range(10):
            page = await other.get("/login")
            r = await other.post(
                "/login", data={"token": "wrong", "csrf_token": csrf_of(page.text)}
            )
            assert r.status_code == 401
        assert (await other.get("/api/queues", headers=BEARER)).status_code == 429


# -- notices and Allow -----------------------------------------------------------------------


async def test_only_notices_the_server_issued_are_shown(app: durq.App) -> None:
    async with client_for(create_dashboard(app, insecure_no_auth=True)) as client:
        r = await client.get("/?notice=Your+session+expired,+call+555-0100")
        assert "555-0100" not in r.text
        await app.enqueue("report:build", {})
        page = await client.get("/queues/default")
        r = await client.post("/queues/default/pause", data={"csrf_token": csrf_of(page.text)})
        assert r.status_code == 303
        shown = await client.get(r.headers["location"])
        assert "queue default paused" in shown.text
        forged = r.headers["location"].replace("paused", "deleted")
        assert "queue default deleted" not in (await client.get(forged)).text


async def test_allow_names_every_method_of_the_path(app: durq.App) -> None:
    await app.enqueue("report:build", {}, task_id="t1")
    async with client_for(create_dashboard(app, token=TOKEN)) as client:
        r = await client.options("/api/queues/default/tasks/t1", headers=BEARER)
        assert r.status_code == 405
        assert {m.strip() for m in r.headers["allow"].split(",")} >= {"GET", "DELETE"}
        r = await client.put("/api/queues/default/tasks/t1", headers=BEARER)
        assert r.status_code == 405 and "DELETE" in r.headers["allow"]
        # An action is POST only: a GET is not read as a task whose id ends in /run.
        r = await client.get("/api/queues/default/tasks/t1/run", headers=BEARER)
        assert r.status_code == 405 and r.headers["allow"] == "POST"


# -- the server of durq dash -----------------------------------------------------------------


@contextmanager
def serve(config: uvicorn.Config) -> Iterator[int]:
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def closed_by_server(sock: socket.socket, limit: float = 10.0) -> bool:
    sock.settimeout(limit)
    try:
        return sock.recv(1024) == b""
    except (TimeoutError, ConnectionResetError):
        return False


def test_slow_and_silent_clients_are_disconnected(app: durq.App) -> None:
    config = server_config(
        create_dashboard(app, token=TOKEN), host="127.0.0.1", port=0, header_timeout=0.5
    )
    with serve(config) as port:
        partial = socket.create_connection(("127.0.0.1", port))
        partial.sendall(b"GET /api/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        silent = socket.create_connection(("127.0.0.1", port))
        assert closed_by_server(partial) and closed_by_server(silent)
        partial.close()
        silent.close()
        # A whole request is answered, without a Server header.
        r = httpx.get(f"http://127.0.0.1:{port}/api/queues", headers=BEARER)
        assert r.status_code == 200 and "server" not in r.headers


@pytest.mark.parametrize(
    ("trusted", "cookie_secure", "secure"),
    [(None, None, False), ("127.0.0.1", None, True), ("10.9.9.9", None, False), (None, True, True)],
)
def test_secure_cookies_and_forwarded_headers_from_named_proxies_only(
    app: durq.App, trusted: str | None, cookie_secure: bool | None, secure: bool
) -> None:
    settings = DashboardSettings(cookie_secure=cookie_secure)
    config = server_config(
        create_dashboard(app, token=TOKEN, settings=settings),
        host="127.0.0.1",
        port=0,
        forwarded_allow_ips=trusted,
    )
    with serve(config) as port:
        r = httpx.get(
            f"http://127.0.0.1:{port}/login",
            headers={"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.5"},
        )
    assert r.status_code == 200
    assert ("Secure" in r.headers["set-cookie"]) is secure
