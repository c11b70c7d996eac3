"""The schedule editor's admin API (/api/schedules) and its forms on the periodic page:
create, edit, pause, resume, trigger, backfill and delete stored schedules; code entries are
read-only; JSON errors; the read-only mode and the CSRF check hold."""

from __future__ import annotations

import httpx
from tests.dashboard.conftest import BEARER, TOKEN
from tests.dashboard.test_security import csrf_of, login

import durq
from durq.dashboard import create_dashboard
from durq.states import TaskState

NEW = {
    "name": "report:eu",
    "schedule": "*/5 * * * *",
    "type": "email:send",
    "payload": {"to": "ops@example.com"},
    "tz": "Europe/Berlin",
    "overlap": "skip",
}


async def test_create_edit_pause_trigger_backfill_delete(
    app: durq.App, api: httpx.AsyncClient
) -> None:
    r = await api.post("/api/schedules", json=NEW)
    assert r.status_code == 201, r.text
    created = r.json()
    assert (created["source"], created["state"], created["version"]) == ("stored", "active", 1)
    assert created["queue"] is None and created["overlap"] == "skip"

    r = await api.patch("/api/schedules/report:eu", json={"schedule": "@every 30s", "queue": "q2"})
    assert r.status_code == 200, r.text
    edited = r.json()
    assert (edited["schedule"], edited["queue"], edited["version"]) == ("@every 30s", "q2", 2)
    assert edited["payload"] == NEW["payload"] and edited["overlap"] == "skip"  # kept

    assert (await api.post("/api/schedules/report:eu/pause")).json()["state"] == "paused"
    listed = (await api.get("/api/periodic")).json()["entries"]
    assert [(e["name"], e["source"], e["state"]) for e in listed] == [
        ("report:eu", "stored", "paused")
    ]
    assert (await api.post("/api/schedules/report:eu/resume")).json()["state"] == "active"

    run = await api.post("/api/schedules/report:eu/trigger")
    assert run.status_code == 200, run.text
    assert run.json()["id"].startswith("periodic:report:eu:run:") and run.json()["queue"] == "q2"

    window = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T00:01:00Z"}
    dry = await api.post("/api/schedules/report:eu/backfill", json={**window, "dry_run": True})
    assert dry.status_code == 200 and len(dry.json()["ticks"]) == 3
    done = (await api.post("/api/schedules/report:eu/backfill", json=window)).json()
    assert len(done["enqueued"]) == 3
    info = await app.inspector.get_task_info("q2", done["enqueued"][0])
    assert info.state is TaskState.PENDING

    assert (await api.delete("/api/schedules/report:eu")).status_code == 204
    gone = await api.get("/api/schedules/report:eu")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"


async def test_errors_are_json(app: durq.App, api: httpx.AsyncClient) -> None:
    app.add_periodic("@hourly", "email:send", name="code:entry")
    assert (await api.post("/api/schedules", json=NEW)).status_code == 201
    taken = await api.post("/api/schedules", json=NEW)
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "conflict"
    code = await api.post("/api/schedules/code:entry/pause")
    assert code.status_code == 409 and "declared in code" in code.json()["error"]["message"]
    bad = await api.post("/api/schedules", json={**NEW, "name": "x", "schedule": "61 * * * *"})
    assert bad.status_code == 400 and "cron" in bad.json()["error"]["message"]
    wide = await api.post(
        "/api/schedules/report:eu/backfill",
        json={"start": "2020-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"},
    )
    assert wide.status_code == 400 and "1000" in wide.json()["error"]["message"]
    missing = await api.post("/api/schedules/nope/resume")
    assert missing.status_code == 404
    listed = (await api.get("/api/periodic")).json()["entries"]
    assert [(e["name"], e["source"]) for e in listed] == [
        ("code:entry", "code"),
        ("report:eu", "stored"),
    ]


async def test_read_only_refuses_every_change(app: durq.App) -> None:
    dash = create_dashboard(app, token=TOKEN, read_only=True)
    transport = httpx.ASGITransport(app=dash)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://testserver", headers=BEARER
    ) as api:
        refused = await api.post("/api/schedules", json=NEW)
        assert refused.status_code == 403
        page = await api.get("/periodic")
        assert page.status_code == 200 and "New schedule" not in page.text
    assert await app.stored_schedules.list() == []


async def test_the_forms_need_the_csrf_token(app: durq.App, client: httpx.AsyncClient) -> None:
    await login(client)
    csrf = csrf_of((await client.get("/periodic")).text)
    fields = {"name": "x", "schedule": "@hourly", "type": "email:send", "overlap": "skip"}
    forged = await client.post("/periodic/new", data={**fields, "csrf_token": "f" * 40})
    assert forged.status_code == 403
    assert await app.stored_schedules.list() == []
    made = await client.post("/periodic/new", data={**fields, "csrf_token": csrf})
    assert made.status_code == 303 and "created" in made.headers["location"]
    (entry,) = await app.stored_schedules.list()
    assert (entry.name, entry.overlap, entry.payload) == ("x", "skip", {})
    bad = await client.post(
        "/periodic/x/edit", data={**fields, "schedule": "61 * * * *", "csrf_token": csrf}
    )
    assert bad.status_code == 303 and "not+saved" in bad.headers["location"]
    deleted = await client.post("/periodic/x/action/delete", data={"csrf_token": "f" * 40})
    assert deleted.status_code == 403 and len(await app.stored_schedules.list()) == 1
