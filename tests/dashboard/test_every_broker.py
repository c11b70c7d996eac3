"""The admin API goes through the inspector only, so it works the same on every broker."""

from __future__ import annotations

import httpx

import durq
from durq.dashboard import create_dashboard

from .conftest import BEARER, TOKEN


async def test_api_round_trip(broker_url: str) -> None:
    app = durq.App(broker_url)
    try:
        fresh = app.new_broker()  # migrate before connecting (a SQL broker checks its schema)
        await fresh.migrate()
        await fresh.close()
        info = await app.enqueue("email:send", {"to": "x"}, process_in=600, task_id="rt-1")
        dash = create_dashboard(app, token=TOKEN)
        transport = httpx.ASGITransport(app=dash)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=BEARER) as c:
            queues = (await c.get("/api/queues")).json()["queues"]
            assert [q["sizes"]["scheduled"] for q in queues if q["name"] == "default"] == [1]
            page = (await c.get("/api/queues/default/tasks", params={"state": "scheduled"})).json()
            assert [t["id"] for t in page["tasks"]] == [info.id]
            assert (await c.post("/api/queues/default/tasks/rt-1/archive")).json()["state"] == (
                "archived"
            )
            assert (await c.post("/api/queues/default/tasks/rt-1/run")).json()["state"] == (
                "pending"
            )
            assert (await c.post("/api/queues/default/tasks/rt-1/run")).status_code == 409
            assert (await c.post("/api/queues/default/pause")).json()["paused"] is True
            assert (await c.get("/api/queues/default/tasks/nope")).status_code == 404
            assert (await c.get("/api/queues/none-such")).status_code == 404
            assert (await c.get("/queues/default/tasks/rt-1")).status_code == 200
            assert (await c.delete("/api/queues/default/tasks/rt-1")).status_code == 204
    finally:
        await app.close()


async def test_odd_search_values_are_the_same_400_on_every_broker(broker_url: str) -> None:
    """A NUL or another control character in a filter is refused before the broker, with
    durq's own message (never a database's), and a trailing newline ends no field name."""
    app = durq.App(broker_url)
    try:
        fresh = app.new_broker()
        await fresh.migrate()
        await fresh.close()
        await app.enqueue("email:send", {"partner": "acme"}, task_id="o-1")
        dash = create_dashboard(app, token=TOKEN)
        transport = httpx.ASGITransport(app=dash)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=BEARER) as c:
            for query, said in [
                ("payload.partner=acme%00", "control characters"),
                ("payload=partner%3Dacme%00", "control characters"),
                ("error=acme%00", "control characters"),
                ("error=%1B%5B31m", "control characters"),
                ("payload.partner%0A=acme", "payload field"),
            ]:
                r = await c.get(f"/api/queues/default/tasks?state=pending&{query}")
                assert r.status_code == 400, (query, r.text)
                error = r.json()["error"]
                assert error["code"] == "bad_request" and said in error["message"], query
            r = await c.get("/api/queues/default/tasks?payload.partner=acme")
            assert [t["id"] for t in r.json()["tasks"]] == ["o-1"]
    finally:
        await app.close()
