"""The throughput chart comes from the broker's per-minute counters: two dashboards over one
broker, and a dashboard started again, show the same series (on every broker)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx

import durq
from durq.dashboard import create_dashboard
from durq.dashboard.history import History

from .conftest import BEARER, TOKEN


def make_app(url: str) -> durq.App:
    app = durq.App(url)

    @app.task("email:send", queue="default")
    async def send(payload: dict) -> None:
        if payload.get("fail"):
            raise RuntimeError("refused")

    return app


async def chart(app: durq.App, path: str = "/api/history") -> dict[str, Any]:
    """What a freshly created dashboard over ``app`` answers."""
    transport = httpx.ASGITransport(app=create_dashboard(app, token=TOKEN))
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=BEARER) as c:
        r = await c.get(path)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_every_dashboard_shows_the_same_history(broker_url: str) -> None:
    worker_app = make_app(broker_url)
    try:
        fresh = worker_app.new_broker()
        await fresh.migrate()
        await fresh.close()
        for i in range(3):
            await worker_app.enqueue("email:send", {"n": i})
        await worker_app.enqueue("email:send", {"fail": True}, max_retry=0)
        async with worker_app.worker(concurrency=2, poll_interval=0.05):
            for _ in range(400):
                stats = await worker_app.inspector.queue_stats("default")
                if stats.processed_total == 4:
                    break
                await asyncio.sleep(0.05)
        assert (stats.processed_total, stats.failed_total) == (4, 1)
    finally:
        await worker_app.close()

    # Two dashboards (two apps, as two processes would have), then one more after both
    # stopped: the same points, holding what the worker did.
    series = []
    for _ in range(3):
        app = make_app(broker_url)
        try:
            series.append((await chart(app), await chart(app, "/api/queues/default/history")))
        finally:
            await app.close()
    first, per_queue = series[0]
    assert len(first["points"]) == 60 and first["interval"] == 60
    assert sum(p["processed"] for p in first["points"]) == 4
    assert sum(p["failed"] for p in first["points"]) == 1
    assert per_queue["queue"] == "default"
    # The minute may turn between two reads: compare the counts, not the window's start.
    counted = [
        [(p["t"], p["processed"], p["failed"]) for p in s["points"] if p["processed"]]
        for pair in series
        for s in pair
    ]
    assert all(c == counted[0] for c in counted), counted


async def test_the_series_fills_the_window_minute_by_minute() -> None:
    app = durq.App("memory://history-window")
    try:
        broker = await app.broker()
        await broker.migrate()
        history = History(app, window=600)
        points = (await history.series())["points"]
        assert len(points) == 10
        assert [b["t"] - a["t"] for a, b in itertools.pairwise(points)] == [60] * 9
        assert all(p["processed"] == p["failed"] == 0 for p in points)
        assert points[-1]["t"] <= app.clock.now() < points[-1]["t"] + 60
    finally:
        await app.close()


async def test_history_of_an_unknown_queue_is_404(app: durq.App, api: httpx.AsyncClient) -> None:
    r = await api.get("/api/history")
    assert r.status_code == 200 and r.json()["unit"] == "tasks per minute"
    assert (await api.get("/api/queues/nope/history")).status_code == 404
