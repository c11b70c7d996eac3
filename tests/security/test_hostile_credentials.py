"""Hostile credentials never crash the dashboard before authentication: non-ASCII cookies,
tokens and CSRF fields get a 4xx (or a login redirect), and any 500 the dashboard can still
produce carries the same security headers as a normal page."""

from __future__ import annotations

import httpx

from durq.dashboard import create_dashboard
from durq.dashboard import security as dash_security

TOKEN = "hostile-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
# Header values travel as latin-1 bytes; these decode to non-ASCII text.
NON_ASCII = ["é", "1.é", "²³.abc", "\u00ff" * 50, "1.\u00e9\u00e9"]


def client_for(asgi) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=asgi, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


def raw_headers(**values: str) -> list[tuple[bytes, bytes]]:
    return [(k.replace("_", "-").encode(), v.encode("latin-1")) for k, v in values.items()]


async def test_non_ascii_session_cookie_is_refused_not_a_crash(app) -> None:
    async with client_for(create_dashboard(app, token=TOKEN)) as client:
        for value in NON_ASCII:
            for path in ("/", "/api/queues", "/queues/default", "/metrics"):
                r = await client.get(
                    path, headers=raw_headers(cookie=f"{dash_security.SESSION_COOKIE}={value}")
                )
                assert r.status_code in (303, 401), (value, path, r.status_code)
                assert "content-security-policy" in r.headers


async def test_non_ascii_bearer_and_csrf_are_refused_not_a_crash(app) -> None:
    async with client_for(create_dashboard(app, token=TOKEN)) as client:
        for value in NON_ASCII:
            r = await client.get(
                "/api/queues", headers=raw_headers(authorization=f"Bearer {value}")
            )
            assert r.status_code == 401, value
            page = await client.get("/login")
            assert page.status_code == 200
            r = await client.post("/login", data={"token": value, "csrf_token": value})
            assert r.status_code == 403, value
            r = await client.post(
                "/api/queues/default/pause",
                headers=raw_headers(x_csrf_token=value, cookie=f"durq_csrf={value}"),
            )
            assert r.status_code == 401, value
    async with client_for(create_dashboard(app, insecure_no_auth=True)) as client:
        await client.get("/")
        for value in NON_ASCII:
            r = await client.post(
                "/api/queues/default/pause", headers=raw_headers(x_csrf_token=value)
            )
            assert r.status_code == 403, value
            r = await client.post("/queues/default/pause", data={"csrf_token": value})
            assert r.status_code == 403, value
            r = await client.post("/login", data={"token": value, "csrf_token": value})
            assert r.status_code == 403, value


async def test_a_wrong_token_with_non_ascii_text_on_login_is_refused(app) -> None:
    async with client_for(create_dashboard(app, token=TOKEN)) as client:
        page = await client.get("/login")
        csrf = page.text.split('name="csrf_token" value="')[1].split('"')[0]
        r = await client.post("/login", data={"token": "é" * 30, "csrf_token": csrf})
        assert r.status_code == 401


async def test_every_500_carries_the_security_headers(app) -> None:
    async def broken(*args, **kwargs):
        raise RuntimeError("the broker exploded")

    guard = create_dashboard(app, token=TOKEN)
    app.inspector.list_queues = broken  # a fault below the dashboard, not a mock of it
    async with client_for(guard) as client:
        for path in ("/api/queues", "/"):
            r = await client.get(path, headers=BEARER)
            assert r.status_code == 500, path
            for name, value in dash_security.SECURITY_HEADERS.items():
                assert r.headers.get(name) == value, (path, name)
            assert "the broker exploded" not in r.text


async def test_a_fault_in_the_guard_itself_answers_500_with_the_headers(app) -> None:
    guard = create_dashboard(app, token=TOKEN)

    def explode(request, now):
        raise RuntimeError("session store exploded")

    object.__setattr__(guard.dash.auth, "session_id", explode)
    async with client_for(guard) as client:
        r = await client.get("/", headers=raw_headers(cookie="durq_session=x"))
        assert r.status_code == 500
        for name, value in dash_security.SECURITY_HEADERS.items():
            assert r.headers.get(name) == value, name
        assert "exploded" not in r.text
