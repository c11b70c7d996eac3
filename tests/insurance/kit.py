"""Helpers for the reference service's tests: servers, clients, storage counts."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # examples/ lives at the repository root
    sys.path.insert(0, str(ROOT))

from examples.insurance.config import Settings  # noqa: E402
from examples.insurance.serve import BackgroundServer  # noqa: E402

ALICE, BOB = "tok-alice", "tok-bob"


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy (HTTP state has no event to wait on)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(interval)


class Sim:
    """The running simulator and its control API."""

    def __init__(self, server: BackgroundServer) -> None:
        self.server = server
        self.url = server.url
        self.http = httpx.Client(base_url=server.url, timeout=5)

    def configure(self, **knobs: Any) -> None:
        current = self.http.get("/_sim/config").json()
        current.update(knobs)
        self.http.put("/_sim/config", json=current).raise_for_status()

    def stats(self) -> dict[str, Any]:
        return dict(self.http.get("/_sim/stats").json())


class Service:
    """The running API and an HTTP client per customer."""

    def __init__(self, server: BackgroundServer, app: Any, settings: Settings) -> None:
        self.server = server
        self.app = app
        self.settings = settings
        self.url = server.url
        self.alice = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ALICE}"})
        self.bob = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {BOB}"})
        self.anon = httpx.Client(base_url=server.url)

    def order(self, location: str, client: httpx.Client | None = None) -> dict[str, Any]:
        return dict((client or self.alice).get(location).json())

    def wait_status(self, location: str, status: str, timeout: float = 10.0) -> dict[str, Any]:
        return dict(
            wait_for(lambda: (o := self.order(location))["status"] == status and o, timeout)
        )

    def close(self) -> None:
        for c in (self.alice, self.bob, self.anon):
            c.close()
        self.server.stop()


ITEMS = {"items": [{"sku": "A-1", "qty": 2}]}


def counts(target: Settings | Service) -> tuple[int, int]:
    """(orders saved, durq tasks in the coverage queue), read straight from storage."""
    import sqlite3

    import durq

    settings = target.settings if isinstance(target, Service) else target
    path = settings.database_url.removeprefix("sqlite:///")
    try:
        conn = sqlite3.connect(path)
        try:
            orders = conn.execute("SELECT count(*) FROM orders").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.OperationalError:
        orders = 0
    app = durq.App(settings.broker_url)
    try:
        queues = app.run_sync(lambda: app.inspector.list_queues())
    finally:
        app.close_sync()
    tasks = sum(q.size for q in queues if q.name == "insurance")
    return int(orders), tasks
