"""The periodic page and /api/periodic: the app's schedules with their next runs, the last
tick found in the broker and whether the queue their ticks go to is paused."""

from __future__ import annotations

import httpx

import durq
from durq.clock import FakeClock
from durq.worker.periodic import PeriodicScheduler

START = 1_800_000_000.0  # a whole hour: both schedules tick now


async def test_schedules_with_next_runs_last_tick_and_paused(
    app: durq.App, api: httpx.AsyncClient
) -> None:
    app.clock = FakeClock(START)
    app.add_periodic("@every 1m", "email:send", name="mail:digest", queue="cron")
    app.add_periodic("0 * * * *", "email:send", name="mail:hourly", tz="Europe/Berlin")
    app.clock.advance(5)
    await PeriodicScheduler(app).tick()  # enqueues both ticks of START
    await app.inspector.pause_queue("cron")

    r = await api.get("/api/periodic")
    assert r.status_code == 200, r.text
    entries = {e["name"]: e for e in r.json()["entries"]}
    digest = entries["mail:digest"]
    assert digest["queue"] == "cron" and digest["paused"] is True
    assert digest["last_task_id"] == f"periodic:mail:digest:{int(START)}"
    assert digest["last_state"] == "pending"
    assert len(digest["next_runs"]) == 3
    assert digest["next_runs"][0] == digest["next_run"]
    hourly = entries["mail:hourly"]
    assert hourly["queue"] == "default" and hourly["paused"] is False
    assert hourly["tz"] == "Europe/Berlin" and hourly["next_run"].endswith("+01:00")
    assert [run[11:16] for run in hourly["next_runs"]] == ["10:00", "11:00", "12:00"]

    page = await api.get("/periodic")
    assert page.status_code == 200
    html = page.text
    assert 'data-entry="mail:digest"' in html and "paused" in html
    assert f"/queues/cron/tasks/periodic%3Amail%3Adigest%3A{int(START)}" in html


async def test_an_app_without_schedules_says_how_to_show_them(api: httpx.AsyncClient) -> None:
    assert (await api.get("/api/periodic")).json() == {"entries": []}
    assert "durq dash module:app" in (await api.get("/periodic")).text
