"""Take the dashboard screenshots shown in docs/observability.md.

Builds a small SQLite broker in a temporary directory (an hour of throughput written through
the broker with a moved clock, then tasks in every state made by a real worker), serves the
dashboard with uvicorn on loopback and photographs each screen with Chromium::

    .venv/bin/python docs/screenshots/make.py [--chromium /usr/bin/chromium]

Needs the ``dev`` extra (Playwright) and a Chromium. Writes docs/screenshots/*.png."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

import durq
from durq.brokers import open_broker
from durq.brokers.base import (
    ClaimParams,
    CompleteParams,
    EnqueueParams,
    RetryParams,
)
from durq.clock import FakeClock
from durq.dashboard import DashboardSettings, create_dashboard

HERE = Path(__file__).resolve().parent
TOKEN = secrets.token_hex(16)
PARTNERS = ["acme", "globex", "initech", "umbrella"]


def build_app(url: str) -> durq.App:
    app = durq.App(url)

    @app.task("invoice.send", queue="billing", retention="1d", retry_delay=lambda r, e: 1800)
    async def send_invoice(payload: dict[str, Any]) -> dict[str, Any]:
        if payload["partner"] == "globex":
            raise RuntimeError("partner API timed out after 30s (POST /v2/invoices)")
        return {"invoice": payload["invoice"], "status": "sent"}

    @app.task("email:send", queue="default", retention="1h")
    async def send_email(payload: dict[str, Any]) -> dict[str, Any]:
        return {"sent_to": payload["to"]}

    @app.task("report.build", queue="reports", retention="1d")
    async def build_report(payload: dict[str, Any]) -> dict[str, Any]:
        return {"rows": 1204, "region": payload["region"]}

    @app.task(
        "coverage.check",
        queue="partners",
        limit=[
            durq.Limit("partner:{partner}", concurrency=2),  # a bulkhead per partner
            durq.Limit("partner-api", rate="300/h"),  # the partners' gateway
        ],
    )
    async def check_coverage(payload: dict[str, Any]) -> dict[str, Any]:
        return {"covered": True}

    app.add_periodic("@every 5m", "email:send", name="digest:5m", payload={"to": "ops@x.io"})
    app.add_periodic(
        "0 6 * * 1-5",
        "report.build",
        name="report:weekday",
        tz="Europe/Berlin",
        payload={"region": "eu"},
        retention="1d",
    )
    app.add_periodic("@every 1h", "report.build", name="report:hourly", payload={"region": "us"})
    return app


async def write_history(url: str, now: float) -> None:
    """An hour of processed and failed tasks, one minute at a time, through the broker (the
    counters the chart reads are the broker's own)."""
    rng = random.Random(7)
    clock = FakeClock(now - 60 * 60)  # the hour before the current minute
    broker = open_broker(url, clock=clock)
    await broker.connect()
    try:
        for minute in range(60):
            done = int(14 + 8 * math.sin(minute / 7) + rng.randint(0, 4))
            failed = rng.choice([0, 0, 1, 1, 2]) + (6 if 38 <= minute <= 41 else 0)
            for i in range(done):
                queue = "billing" if i % 3 else "default"
                task_id = f"h{minute}-{i}"
                await broker.enqueue(
                    EnqueueParams(task_id, queue, "invoice.send", b'{"partner":"acme"}')
                )
                (lease,) = await broker.claim(ClaimParams([queue], 1, "history", 30.0))
                if i < failed:  # a failed attempt, then a successful one
                    await broker.retry(RetryParams(lease.ref, "partner API timed out"))
                    await broker.promote_due()
                    (lease,) = await broker.claim(ClaimParams([queue], 1, "history", 30.0))
                await broker.complete(CompleteParams(lease.ref, b"{}", 0))
            clock.advance(60)
    finally:
        await broker.close()


async def seed(app: durq.App) -> dict[str, str]:
    """Tasks in every state, made by a real worker; returns ids worth a picture."""
    for i in range(14):
        partner = PARTNERS[i % len(PARTNERS)]
        await app.enqueue(
            "invoice.send",
            {"partner": partner, "invoice": f"INV-2024-{1000 + i}", "amount": 120 + 17 * i},
            task_id=f"inv-{1000 + i}",
            max_retry=0 if i % 7 == 1 else 5,
        )
    for i in range(3):
        await app.enqueue("report.build", {"region": ["eu", "us", "apac"][i]})
    now = app.clock.now()
    for entry in app.schedules:  # the latest tick of each schedule, as the scheduler would
        tick = entry.schedule.latest(now)
        if tick is not None:
            await app.enqueue_request(entry.request(tick))
    async with app.worker(concurrency=4, poll_interval=0.05):
        for _ in range(400):
            stats = await app.inspector.queue_stats("billing")
            if stats.sizes[durq.TaskState.PENDING] == 0 and stats.sizes[durq.TaskState.ACTIVE] == 0:
                break
            await asyncio.sleep(0.05)
    # Waiting work, left for the pictures (no worker runs any more).
    for i in range(9):
        partner = PARTNERS[i % len(PARTNERS)]
        await app.enqueue(
            "invoice.send",
            {"partner": partner, "invoice": f"INV-2024-{2000 + i}", "amount": 80 + 9 * i},
            task_id=f"inv-{2000 + i}",
            process_in=3600 + 600 * i,
        )
    for i in range(27):
        await app.enqueue("email:send", {"to": f"user{i}@example.com", "template": "welcome"})
    # Partner calls in flight, claimed as a worker would and left running; the partner with
    # the most calls has its two slots taken and the rest wait on its limit.
    for i, partner in enumerate(["acme"] * 5 + ["initech"] * 2 + ["umbrella"]):
        await app.enqueue(
            "coverage.check",
            {"partner": partner, "policy": f"POL-{3000 + i}"},
            task_id=f"cov-{3000 + i}",
        )
    await (await app.broker()).claim(ClaimParams(["partners"], 8, "screens", 3600.0))
    await app.inspector.pause_queue("reports")
    await app.enqueue("report.build", {"region": "latam"})
    archived = await app.inspector.list_tasks("billing", "archived", limit=1)
    return {"archived": archived[0].id}


@contextmanager
def serve(asgi: Any) -> Iterator[str]:
    config = uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def photograph(url: str, ids: dict[str, str], chromium: str, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    screens = [
        ("overview", "/"),
        ("queue", "/queues/billing?state=retry"),
        ("task", f"/queues/billing/tasks/{ids['archived']}"),
        ("search", "/queues/billing?state=scheduled&payload.partner=acme"),
        ("periodic", "/periodic"),
        ("limits", "/limits"),
    ]
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(url + "/login")
        page.fill("#token", TOKEN)
        page.click("button[type=submit]")
        page.wait_for_url(url + "/")
        for name, path in screens:
            page.goto(url + path)
            if page.locator("details").count():
                page.click("details summary")  # the traceback folded: it names local paths
            if page.locator("#chart").count():
                page.wait_for_selector("#chart svg", state="attached")
            target = out / f"{name}.png"
            page.screenshot(path=str(target), full_page=True)
            written.append(target)
        browser.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    logging.getLogger("durq").setLevel(logging.CRITICAL)  # the handlers fail on purpose
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/durq.sqlite3"
        app = build_app(url)

        async def prepare() -> dict[str, str]:
            await (await app.broker()).migrate()
            await write_history(url, app.clock.now())
            try:
                return await seed(app)
            finally:
                await app.close()

        ids = asyncio.run(prepare())
        settings = DashboardSettings(title="durq", refresh_seconds=3600)
        with serve(create_dashboard(app, token=TOKEN, settings=settings)) as base:
            written = photograph(base, ids, args.chromium, args.out)
    print(json.dumps([str(path) for path in written], indent=2))


if __name__ == "__main__":
    main()
