"""Overrides of a key's limit in the admin API and on the limits page: set, shown beside the
tasks' own limit, applied by the next claim, reset; JSON errors; the write endpoints behind
the same authentication, CSRF and read-only rules as every other."""

from __future__ import annotations

from urllib.parse import quote

import httpx

import durq
from durq.dashboard import create_dashboard

from .conftest import BEARER, TOKEN
from .test_security import csrf_of, login

KEY = "partner:{acme}"  # ':' and braces: escaped in the path
URL = f"/api/limits/default/{quote(KEY, safe='')}"


async def _held(app: durq.App) -> list[str]:
    """Three calls of one partner with a limit of one: a claim starts one, holds two."""

    @app.task("partner:call", limit=durq.Limit("partner:{{{p}}}", concurrency=1))
    async def call(payload: dict) -> None:
        return None

    ids = [(await call.enqueue({"p": "acme", "n": i})).id for i in range(3)]
    broker = await app.broker()
    from durq.brokers.base import ClaimParams

    leases = await broker.claim(ClaimParams(["default"], 10, "w1", 30.0))
    assert [x.task.id for x in leases] == ids[:1]
    return ids


async def _claim(app: durq.App) -> list[str]:
    from durq.brokers.base import ClaimParams

    broker = await app.broker()
    return [x.task.id for x in await broker.claim(ClaimParams(["default"], 10, "w1", 30.0))]


async def test_set_show_and_reset_an_override(app: durq.App, api: httpx.AsyncClient) -> None:
    ids = await _held(app)
    (row,) = (await api.get("/api/limits")).json()["limits"]
    assert (row["key"], row["concurrency"], row["waiting"], row["override"]) == (KEY, 1, 2, None)

    r = await api.put(URL, json={"concurrency": 2})
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["key"], got["concurrency"], got["running"]) == (KEY, 1, 1)
    assert got["override"] == {"concurrency": 2, "rate": None, "per": None}
    assert await _claim(app) == ids[1:2]  # the next claim applies it

    r = await api.put(URL, json={"concurrency": 0, "rate": "5/m"})
    assert r.json()["override"] == {"concurrency": 0, "rate": 5, "per": 60.0}
    (row,) = (await api.get("/api/limits", params={"queue": "default"})).json()["limits"]
    assert row["override"]["concurrency"] == 0

    r = await api.delete(URL)
    assert r.status_code == 204
    (row,) = (await api.get("/api/limits")).json()["limits"]
    assert row["override"] is None and row["concurrency"] == 1
    r = await api.delete(URL)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"

    doc = (await api.get("/api/openapi.json")).json()
    assert {"put", "delete"} <= set(doc["paths"]["/api/limits/{queue}/{key}"])


async def test_bad_input_and_unknown_queues_are_json_errors(
    app: durq.App, api: httpx.AsyncClient
) -> None:
    await _held(app)
    for body in (
        {},
        {"concurrency": -1},
        {"concurrency": "many"},
        {"rate": "fast"},
        {"rate": "0/s"},
        {"concurrency": 1, "other": 2},
    ):
        r = await api.put(URL, json=body)
        assert r.status_code == 400, (body, r.status_code)
        assert r.json()["error"]["code"] == "bad_request", body
    assert (await api.put(URL, content=b"not json")).status_code == 400
    r = await api.put(f"/api/limits/nowhere/{quote(KEY, safe='')}", json={"concurrency": 1})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await api.put(f"/api/limits/default/{'k' * 201}", json={"concurrency": 1})
    assert r.status_code == 400
    assert (await api.get("/api/limits")).json()["limits"][0]["override"] is None


async def test_writes_need_auth_csrf_and_a_writable_dashboard(
    app: durq.App, client: httpx.AsyncClient
) -> None:
    await _held(app)
    assert (await client.put(URL, json={"concurrency": 3})).status_code == 401
    await login(client)
    # A session cookie alone is not enough for a write: the CSRF header is needed.
    assert (await client.put(URL, json={"concurrency": 3})).status_code == 403
    token = csrf_of((await client.get("/queues/default")).text)
    r = await client.put(URL, json={"concurrency": 3}, headers={"X-CSRF-Token": token})
    assert r.status_code == 200
    assert (await client.delete(URL)).status_code == 403
    assert (await client.delete(URL, headers={"X-CSRF-Token": token})).status_code == 204

    dash = create_dashboard(app, token=TOKEN, read_only=True)
    transport = httpx.ASGITransport(app=dash)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=BEARER) as c:
        r = await c.put(URL, json={"concurrency": 3})
        assert r.status_code == 403 and "read-only" in r.json()["error"]["message"]
        assert (await c.get("/api/limits")).json()["limits"][0]["override"] is None


async def test_the_limits_page_form_sets_and_resets(
    app: durq.App, client: httpx.AsyncClient
) -> None:
    ids = await _held(app)
    await login(client)
    page = await client.get("/limits")
    assert 'class="filters override-form"' in page.text and "Reset</button>" not in page.text
    token = csrf_of(page.text)
    form = {"csrf_token": token, "key": KEY, "concurrency": "3", "rate": "", "do": "set"}
    r = await client.post("/limits/default/override", data=form)
    assert r.status_code == 303 and "overridden" in r.headers["location"]
    page = await client.get("/limits")
    assert "tasks' own: 1" in page.text and "Reset</button>" in page.text
    assert await _claim(app) == ids[1:]

    bad = {**form, "concurrency": "-1"}
    r = await client.post("/limits/default/override", data=bad)
    assert r.status_code == 303 and "not+saved" in r.headers["location"]
    r = await client.post("/limits/default/override", data={**form, "do": "reset"})
    assert r.status_code == 303 and "reset" in r.headers["location"]
    assert "Reset</button>" not in (await client.get("/limits")).text
    # Without the CSRF field the form is refused.
    r = await client.post("/limits/default/override", data={**form, "csrf_token": ""})
    assert r.status_code == 403

    dash = create_dashboard(app, token=TOKEN, read_only=True)
    transport = httpx.ASGITransport(app=dash)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        await login(c)
        assert "override-form" not in (await c.get("/limits")).text
