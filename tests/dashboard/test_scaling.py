"""``GET /api/scaling`` over real HTTP: each queue's pending and running tasks and the age of
its oldest pending task, the figures KEDA's metrics-api scaler reads, behind the API's token
and served from one read of the broker every few seconds."""

from __future__ import annotations

from pathlib import Path

import httpx
from tests.dashboard.live import LiveServer

import durq
from durq.brokers.base import ClaimParams
from durq.clock import FakeClock
from durq.dashboard import create_dashboard

TOKEN = "scaling-token-0123456789"


async def _fill(app: durq.App, clock: FakeClock) -> None:
    broker = await app.broker()
    await broker.migrate()
    for _ in range(4):
        await app.enqueue("report:build", {}, queue="reports")
    await app.enqueue("mail:send", {}, queue="mail", process_in=600)
    clock.advance(30)
    await broker.claim(ClaimParams(["reports"], 1, "w1", 60.0))  # one of them runs


def test_scaling_figures_per_queue(tmp_path: Path) -> None:
    clock = FakeClock(1_000.0)
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}", clock=clock)
    app.run_sync(lambda: _fill(app, clock))
    try:
        with LiveServer(create_dashboard(app, token=TOKEN)) as live:
            refused = httpx.get(f"{live.url}/api/scaling")
            assert refused.status_code == 401
            assert refused.json()["error"]["code"]
            auth = {"Authorization": f"Bearer {TOKEN}"}
            r = httpx.get(f"{live.url}/api/scaling", headers=auth)
            assert r.status_code == 200, r.text
            body = r.json()
            app.run_sync(lambda: app.enqueue("report:build", {}, queue="reports"))
            again = httpx.get(f"{live.url}/api/scaling", headers=auth).json()
            doc = httpx.get(f"{live.url}/api/openapi.json", headers=auth).json()
    finally:
        app.close_sync()
    assert body["queues"]["reports"] == {
        "pending": 3,
        "active": 1,
        "scheduled": 0,
        "retry": 0,
        "oldest_pending_seconds": 30.0,
        "paused": False,
    }
    assert body["queues"]["mail"]["scheduled"] == 1
    assert body["queues"]["mail"]["oldest_pending_seconds"] == 0
    assert body["pending"] == 3 and body["oldest_pending_seconds"] == 30.0
    assert body["age"] >= 0
    # One read serves the requests of the next few seconds: the new task is not seen yet.
    assert again["queues"]["reports"]["pending"] == 3
    assert "/api/scaling" in doc["paths"]


def test_scaling_with_the_broker_down_is_a_json_503() -> None:
    app = durq.App("sqlite:////nonexistent/dir/durq.sqlite3")
    try:
        with LiveServer(create_dashboard(app, token=TOKEN)) as live:
            r = httpx.get(f"{live.url}/api/scaling", headers={"Authorization": f"Bearer {TOKEN}"})
    finally:
        app.close_sync()
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "broker_unavailable"
