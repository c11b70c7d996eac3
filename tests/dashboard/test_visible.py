"""The partitions of a queue's fair limits and the unique keys its tasks hold, through the
dashboard's real ASGI stack on every broker: ``GET /api/queues/{queue}/partitions``,
``GET /api/queues/{queue}/unique`` and the queue page's two sections."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

import durq
from apptools import AppFactory
from durq.brokers.base import ClaimParams
from durq.clock import FakeClock, to_datetime
from durq.dashboard import create_dashboard

from .conftest import BEARER, TOKEN

TENANT = durq.Limit("tenant:{tenant}", concurrency=10, fair=True)
DEBOUNCE = durq.Debounce("account", wait=30, max_wait=120)


@pytest.fixture
async def client(make_app: AppFactory, clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    """Tenant a: 3 tasks, one running; b: 1; c: 2 (queue ``default``). Queue ``crm``: a
    debounced sync enqueued twice 10 s apart, and a mail unique for an hour."""
    app = await make_app()
    for tenant, n in (("a", 3), ("b", 1), ("c", 2)):
        for i in range(n):
            await app.enqueue("report", {"tenant": tenant, "i": i}, limit=TENANT)
    await (await app.broker()).claim(ClaimParams(["default"], 1, "w1", 30.0))
    await app.enqueue("crm:sync", {"account": 7}, queue="crm", unique=DEBOUNCE, task_id="sync-7")
    clock.advance(10)
    await app.enqueue("crm:sync", {"account": 7, "n": 2}, queue="crm", unique=DEBOUNCE)
    await app.enqueue("crm:mail", {"to": "x"}, queue="crm", unique=3600, task_id="mail-x")
    transport = httpx.ASGITransport(app=create_dashboard(app, token=TOKEN))
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=BEARER) as c:
        yield c


async def test_partitions_api(client: httpx.AsyncClient) -> None:
    r = await client.get("/api/queues/default/partitions", params={"top": 2})
    assert r.status_code == 200
    body = r.json()
    assert body["templates"] == [
        {"template": "tenant:{tenant}", "key": "", "pending": 5, "running": 1, "partitions": 3}
    ]
    assert [(p["key"], p["pending"], p["running"]) for p in body["top"]] == [
        ("tenant:a", 2, 1),
        ("tenant:c", 2, 0),
    ]
    assert (body["others"]["partitions"], body["others"]["pending"]) == (1, 1)
    empty = (await client.get("/api/queues/crm/partitions")).json()
    assert (empty["templates"], empty["top"], empty["others"]["partitions"]) == ([], [], 0)
    assert (await client.get("/api/queues/nope/partitions")).status_code == 404
    assert (await client.get("/api/queues/default/partitions?top=0")).status_code == 400
    assert (await client.get("/api/queues/default/partitions?top=1001")).status_code == 400


async def test_unique_api(client: httpx.AsyncClient, clock: FakeClock) -> None:
    r = await client.get("/api/queues/crm/unique")
    assert r.status_code == 200
    body = r.json()
    assert (body["queue"], body["total"], body["complete"]) == ("crm", 2, True)
    mail, sync = body["entries"]  # the mail is due now, the sync in 30 s
    start = clock.now() - 10
    assert (sync["task_id"], sync["state"], sync["debounced"]) == ("sync-7", "scheduled", True)
    assert (sync["wait"], sync["max_wait"], sync["until"]) == (30.0, 120.0, None)
    assert sync["due"] == to_datetime(start + 40).isoformat()  # moved by the twin
    assert sync["latest"] == to_datetime(start + 120).isoformat()
    assert (mail["task_id"], mail["debounced"], mail["latest"]) == ("mail-x", False, None)
    assert mail["until"] == to_datetime(start + 10 + 3600).isoformat()
    one = (await client.get("/api/queues/crm/unique", params={"limit": 1})).json()
    assert [e["task_id"] for e in one["entries"]] == ["mail-x"] and one["total"] == 2
    assert (await client.get("/api/queues/nope/unique")).status_code == 404
    assert (await client.get("/api/queues/crm/unique?limit=0")).status_code == 400


def rows(html: str, table: str) -> list[str]:
    """The rows of one table of the page, as text without tags and runs of spaces."""
    body = re.search(rf'<table class="{table}">(.*?)</table>', html, re.S)
    assert body, f"no {table} table"
    found = re.findall(r"<tr[^>]*>(.*?)</tr>", body.group(1), re.S)[1:]  # past the head
    return [" ".join(re.sub(r"<[^>]+>", " ", r).split()) for r in found]


async def test_queue_page_sections(client: httpx.AsyncClient) -> None:
    page = (await client.get("/queues/default")).text
    assert rows(page, "partitions") == [
        "tenant:{tenant} 5 1 3",
        "tenant:a 2 1 1",
        "tenant:c 2 0 1",
        "tenant:b 1 0 1",
    ]
    assert 'id="unique"' not in page  # no key held in this queue
    page = (await client.get("/queues/crm")).text
    assert 'id="partitions"' not in page  # no fair limit in this queue
    mail, sync = rows(page, "unique")
    assert sync.startswith("sync-7 crm:sync scheduled") and "30 s, at most 120 s" in sync
    assert "it finishes" in sync
    assert mail.startswith("mail-x crm:mail pending") and mail.endswith("- -")
