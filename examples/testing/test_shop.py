"""Testing the shop (docs/testing.md): the real worker runs every task, time is moved."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

import durq.testing
from examples.testing import shop


async def test_the_endpoint_enqueues_and_the_quote_arrives(
    durq_worker: durq.testing.TestWorker,
) -> None:
    transport = httpx.ASGITransport(app=shop.api)
    async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
        answer = await client.post("/quotes", json={"ref": "Q-1", "email": "a@b.c"})
    assert answer.status_code == 202

    ran = await durq_worker.drain()  # the first poll: not ready
    assert ran.outcomes == [("quote:poll", "retry")]
    durq_worker.clock.advance("5m")
    assert (await durq_worker.drain()).outcomes == [("quote:poll", "retry")]
    durq_worker.clock.advance("5m")
    ran = await durq_worker.drain()  # ready: the task completes, its continuation runs
    assert ran.outcomes == [("quote:poll", "completed"), ("quote:notify", "completed")]
    assert ran[0].result == {"ref": "Q-1", "price": 99.5}
    assert shop.SENT == [{"to": "a@b.c", "price": 99.5}]


async def test_retries_wait_for_the_clock(durq_worker: durq.testing.TestWorker) -> None:
    info = await shop.app.enqueue("quote:poll", {"ref": "Q-2", "email": "a@b.c"})
    await durq_worker.drain()
    durq_worker.clock.advance("4m59s")
    assert await durq_worker.drain() == []  # the retry is not due yet
    task = await durq_worker.get(info)
    assert task.state.value == "retry" and task.last_error == "the partner is still pricing"


def test_the_endpoint_with_starlettes_test_client(
    durq_worker_sync: durq.testing.SyncTestWorker,
) -> None:
    shop.partner.polls = 0  # the quote is ready at once
    with TestClient(shop.api) as client:  # the lifespan runs, and starts no worker in a test
        answer = client.post("/quotes", json={"ref": "Q-4", "email": "e@f.g"})
    assert answer.status_code == 202
    ran = durq_worker_sync.drain()  # inside the with block or after it
    assert ran.outcomes == [("quote:poll", "completed"), ("quote:notify", "completed")]
    assert shop.SENT == [{"to": "e@f.g", "price": 99.5}]


def test_the_flask_view_enqueues(durq_worker_sync: durq.testing.SyncTestWorker) -> None:
    shop.partner.polls = 0  # the quote is ready at once
    answer = shop.web.test_client().post("/quotes", json={"ref": "Q-3", "email": "c@d.e"})
    assert answer.status_code == 202
    ran = durq_worker_sync.drain()
    assert ran.outcomes == [("quote:poll", "completed"), ("quote:notify", "completed")]
    assert shop.SENT == [{"to": "c@d.e", "price": 99.5}]


@pytest.mark.durq_worker(scheduler=True)  # periodic tasks run only in tests that ask
async def test_the_daily_report_runs_at_six(durq_worker: durq.testing.TestWorker) -> None:
    assert await durq_worker.drain() == []  # 05:00: nothing due
    durq_worker.clock.advance("1h")
    ran = await durq_worker.drain()
    assert ran.outcomes == [("report:daily", "completed")]
    assert ran[0].result == {"quotes_sent": 0}
    durq_worker.clock.advance("23h59m")
    assert await durq_worker.drain() == []
    durq_worker.clock.advance("1m")
    assert (await durq_worker.drain()).outcomes == [("report:daily", "completed")]
