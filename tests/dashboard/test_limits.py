"""The limits page: each flow-control key of each queue with its running attempts, its limit,
tokens left and the tasks held on it; filtered by queue; an empty state that explains limits.
The page goes through the inspector only, so it is checked on every broker."""

from __future__ import annotations

import re

import httpx

import durq
from apptools import AppFactory
from durq.brokers.base import ClaimParams
from durq.dashboard import create_dashboard

from .conftest import BEARER, TOKEN


def row_of(html: str, queue: str, key: str) -> dict[str, str]:
    """The cells of one key's row, by ``data-field``, as text without tags."""
    match = re.search(
        rf'<tr data-queue="{re.escape(queue)}" data-key="{re.escape(key)}">(.*?)</tr>', html, re.S
    )
    assert match, f"no row for {queue}/{key}"
    cells = re.findall(r'<td class="n" data-field="(\w+)">(.*?)</td>', match.group(1), re.S)
    return {field: re.sub(r"<[^>]+>", "", text).strip() for field, text in cells}


async def hold(app: durq.App, queue: str, count: int, limit: durq.Limit) -> None:
    """``count`` tasks of one key; one claim takes the first and holds the rest back."""
    for i in range(count):
        await app.enqueue("call", {"partner": "acme", "n": i}, queue=queue, limit=limit)
    await (await app.broker()).claim(ClaimParams([queue], 10, "w1", 30.0))


async def test_keys_with_running_and_held_tasks_and_the_queue_filter(make_app: AppFactory) -> None:
    app = await make_app()  # on every broker, with a clock that stands still
    await hold(app, "partners", 3, durq.Limit("partner:{partner}", concurrency=1))
    await hold(app, "api", 2, durq.Limit("api", concurrency=5, rate="3/h"))
    transport = httpx.ASGITransport(app=create_dashboard(app, token=TOKEN))
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=BEARER) as c:
        r = await c.get("/limits")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert row_of(r.text, "partners", "partner:acme") == {
            "running": "1 full",
            "concurrency": "1",
            "rate": "-",
            "tokens": "-",
            "waiting": "2",
        }
        api = row_of(r.text, "api", "api")
        assert api["running"] == "2" and api["concurrency"] == "5" and api["waiting"] == "0"
        assert api["rate"] == "3/h" and api["tokens"] == "1.0"  # 3 at first, 2 taken
        assert '<span class="num" id="sum-waiting">2</span>' in r.text
        assert '<span class="num" id="sum-full">1</span>' in r.text
        assert 'href="/queues/partners?state=pending"' in r.text  # to the held tasks

        only = (await c.get("/limits", params={"queue": "api"})).text
        assert 'data-key="api"' in only and 'data-key="partner:acme"' not in only
        assert '<option value="api" selected>' in only
        none = (await c.get("/limits", params={"queue": "default"})).text
        assert "No limit key has been counted in queue <strong>default</strong>" in none


async def test_an_empty_page_says_what_limits_are(api: httpx.AsyncClient) -> None:
    r = await api.get("/limits")
    assert r.status_code == 200
    text = re.sub(r"\s+", " ", r.text)
    assert 'id="limits-empty"' in text and "<table" not in text
    assert "at most <em>N</em> tasks of one key running at once" in text
    assert "flow control guide</a>" in text and "docs/flow-control.md" in text
    assert 'class="on">Limits</a>' in text  # the nav shows where we are


async def test_a_wrong_filter_is_an_error_not_an_unfiltered_page(api: httpx.AsyncClient) -> None:
    assert (await api.get("/limits", params={"queue": "no spaces"})).status_code == 400
    r = await api.get("/limits", params={"queues": "default"})
    assert r.status_code == 400 and "unknown query parameter" in r.text
