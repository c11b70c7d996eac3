"""The queue page's fair partitions and unique keys in a real browser (Debian's Chromium,
headless) over uvicorn, on a real SQLite broker: a tenant's backlog shows first among the
partitions, and a debounced task shows when it runs and when it runs at the latest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durq
from durq.brokers.base import ClaimParams
from durq.dashboard import create_dashboard

from .conftest import TOKEN
from .live import LiveServer
from .test_browser import browser, fresh_page, run_async, shot

__all__ = ["browser"]  # the module's Chromium, shared with these tests

TENANT = durq.Limit("tenant:{tenant}", concurrency=10, fair=True)


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")

    async def seed() -> None:
        await (await app.broker()).migrate()
        for tenant, n in (("acme", 40), ("globex", 3), ("initech", 1)):
            for i in range(n):
                await app.enqueue("report", {"tenant": tenant, "i": i}, limit=TENANT)
        await (await app.broker()).claim(ClaimParams(["default"], 2, "w1", 300.0))
        debounce = durq.Debounce("account", wait=60, max_wait=600)
        await app.enqueue(
            "crm:sync", {"account": 7}, queue="crm", unique=debounce, task_id="sync-7"
        )
        for edit in range(2):  # twins: the same task, moved
            await app.enqueue(
                "crm:sync", {"account": 7, "edit": edit}, queue="crm", unique=debounce
            )
        await app.close()

    run_async(seed)
    with LiveServer(create_dashboard(app, token=TOKEN)) as server:
        yield server.url


@pytest.fixture
def page(browser: Any, url: str) -> Iterator[Any]:
    yield from fresh_page(browser)


def test_queue_page_shows_partitions_and_unique_keys(page: Any, url: str) -> None:
    page.goto(url + "/queues/default")
    page.fill("#token", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(url + "/queues/default")
    section = page.locator("#partitions")
    assert section.is_visible()
    template = section.locator("tr.template td")
    assert template.all_inner_texts() == ["tenant:{tenant}", "42", "2", "3"]
    keys = section.locator("tr.partition td:first-child").all_inner_texts()
    assert keys == ["tenant:acme", "tenant:globex", "tenant:initech"]  # biggest first
    acme = section.locator('tr.partition[data-key="tenant:acme"] td').all_inner_texts()
    assert acme[1:3] == ["39", "1"]  # the two partitions took turns: one task each runs
    shot(page, "queue-partitions")

    page.goto(url + "/queues/crm")
    assert page.locator("#partitions").count() == 0
    row = page.locator('#unique tr[data-task="sync-7"]')
    assert row.locator("td").nth(2).inner_text() == "scheduled"
    assert row.locator(".debounce").inner_text() == "60 s, at most 600 s"
    due, latest = row.locator(".due").inner_text(), row.locator(".latest").inner_text()
    assert due.endswith("UTC") and latest.endswith("UTC") and due < latest
    shot(page, "queue-unique")
    row.locator("a").click()
    page.wait_for_url(url + "/queues/crm/tasks/sync-7")
    assert "durq-debounce" in page.content()  # the stored header the latest time comes from
