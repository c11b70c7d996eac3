"""The FastAPI pattern of docs/web.md (``durq_lifespan`` with a worker, ``Depends(get_durq)``),
tested with the kit as a FastAPI developer would: httpx's ``ASGITransport`` (which runs no
lifespan) and Starlette's ``TestClient``, inside and outside its ``with`` block."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import pytest
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

import durq
import durq.testing
from durq.web.asgi import durq_lifespan, enqueue_response, get_durq

tasks = durq.App("sqlite:///never-used-by-these-tests.sqlite3")
BUILT: list[str] = []


@tasks.task("report:build", queue="reports", retention="1d")
async def build_report(payload: dict[str, str]) -> dict[str, str]:
    BUILT.append(payload["name"])
    return {"name": payload["name"]}


# As documented: the lifespan opens the client and runs a worker in the web process.
api = FastAPI(lifespan=durq_lifespan(tasks, worker=True))


@api.post("/reports/{name}")
async def create_report(name: str, client: durq.App = Depends(get_durq)) -> JSONResponse:
    return await enqueue_response(client, "report:build", {"name": name}, task_id=f"report-{name}")


@pytest.fixture
def durq_app() -> Iterator[durq.App]:
    """The kit's fixture, overridden: our app on a fresh memory:// broker, and an ASGI app
    whose lifespan never ran (a lifespan leaves the app on ``api.state``)."""
    BUILT.clear()
    if hasattr(api.state, "durq"):
        del api.state.durq
    with durq.testing.in_memory(tasks) as app:
        yield app


async def test_asgi_transport_without_lifespan(durq_worker: durq.testing.TestWorker) -> None:
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        first = await http.post("/reports/q3")
        again = await http.post("/reports/q3")
    assert (first.status_code, again.status_code) == (202, 200)
    ran = await durq_worker.drain()
    assert ran.outcomes == [("report:build", "completed")]
    assert BUILT == ["q3"]


def test_test_client_inside_the_with_block(
    durq_worker_sync: durq.testing.SyncTestWorker,
) -> None:
    with TestClient(api) as http:
        assert http.post("/reports/q1").status_code == 202
        # The lifespan's own worker leaves the tasks to the test: drain() sees them all.
        assert durq_worker_sync.drain().outcomes == [("report:build", "completed")]
        assert http.post("/reports/q2").status_code == 202
    assert durq_worker_sync.drain().outcomes == [("report:build", "completed")]
    assert BUILT == ["q1", "q2"]


def test_test_client_outside_the_with_block(
    durq_worker_sync: durq.testing.SyncTestWorker,
) -> None:
    http = TestClient(api)  # no lifespan: get_durq finds the app without it
    assert http.post("/reports/q4").status_code == 202
    assert http.post("/reports/q4").json()["status"] == "already_accepted"
    assert durq_worker_sync.drain().outcomes == [("report:build", "completed")]
    assert BUILT == ["q4"]


def test_the_sync_worker_drains_after_the_lifespan_closed_the_client(
    durq_worker_sync: durq.testing.SyncTestWorker,
) -> None:
    with TestClient(api) as http:
        assert http.post("/reports/q5").status_code == 202
    # The lifespan closed the app's client (and its sync face) on the way out.
    assert durq_worker_sync.drain().outcomes == [("report:build", "completed")]
    with TestClient(api) as http:
        assert http.post("/reports/q6").status_code == 202
    assert durq_worker_sync.drain().outcomes == [("report:build", "completed")]
    assert BUILT == ["q5", "q6"]


def test_an_async_worker_drains_from_another_thread_and_loop() -> None:
    """The async worker started on one loop answers a drain from another loop's thread."""
    with durq.testing.in_memory(tasks):
        BUILT.clear()
        w = durq.testing.worker(tasks)
        home = asyncio.new_event_loop()
        thread = threading.Thread(target=home.run_forever, daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(w.start(), home).result(10)
            tasks.enqueue_sync("report:build", {"name": "q7"})
            ran = asyncio.run(w.drain())  # another loop, another thread
            assert ran.outcomes == [("report:build", "completed")]
            asyncio.run_coroutine_threadsafe(w.stop(), home).result(10)
        finally:
            home.call_soon_threadsafe(home.stop)
            thread.join(5)
            home.close()
    assert BUILT == ["q7"]
