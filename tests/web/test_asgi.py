"""durq.web for ASGI apps: the three answers from one call, the monolith lifespan, the
dependency, and an unreachable broker."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

import durq
from durq.web import Answer, answer_for_error, enqueue_answer, queued
from durq.web.asgi import durq_lifespan, enqueue_response, get_durq, get_worker


def make_app(url: str) -> tuple[durq.App, threading.Event]:
    app = durq.App(url)
    ran = threading.Event()

    @app.task("report:build", queue="reports", retention=60)  # kept: a repeat conflicts (E3)
    async def build(payload: dict[str, str]) -> dict[str, str]:
        ran.set()
        return {"built": payload["name"]}

    return app, ran


def test_starlette_monolith_answers_202_then_200_and_runs_the_task(tmp_path: Path) -> None:
    """H1, H2, H5: 202 with Location, then 200 already_accepted; the worker runs in-process."""
    app, ran = make_app(f"sqlite:///{tmp_path / 'q.sqlite3'}")

    async def create(request: Request) -> JSONResponse:
        name = request.path_params["name"]
        return await enqueue_response(
            get_durq(request),
            "report:build",
            {"name": name},
            task_id=f"report-{name}",
            location=lambda info: f"/reports/{info.id}",
        )

    async def mode(request: Request) -> JSONResponse:
        return JSONResponse({"monolith": get_worker(request) is not None})

    web = Starlette(
        routes=[Route("/reports/{name}", create, methods=["POST"]), Route("/mode", mode)],
        lifespan=durq_lifespan(app, worker={"poll_interval": 0.05, "shutdown_timeout": 1}),
    )
    with TestClient(web) as client:
        first = client.post("/reports/q3")
        assert first.status_code == 202
        assert first.headers["location"] == "/reports/report-q3"
        assert first.json() == {"status": "queued", "task_id": "report-q3", "queue": "reports"}
        again = client.post("/reports/q3")
        assert again.status_code == 200
        assert again.json()["status"] == "already_accepted"
        assert again.json()["task_id"] == "report-q3"
        assert client.get("/mode").json() == {"monolith": True}
        assert ran.wait(10)  # the worker inside the web process ran it


def test_fastapi_dependency_and_503_when_the_broker_is_down(tmp_path: Path) -> None:
    """H3: the broker is down, so 503 with Retry-After and a JSON error."""
    app, _ = make_app(f"sqlite:///{tmp_path / 'missing' / 'q.sqlite3'}")
    api = FastAPI(lifespan=durq_lifespan(app))  # split: no worker here

    @api.post("/reports")
    async def create(client: durq.App = Depends(get_durq)) -> JSONResponse:
        return await enqueue_response(client, "report:build", {"name": "x"}, retry_after=7)

    with TestClient(api) as http:
        answer = http.post("/reports")
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "7"
    assert answer.json()["error"]["code"] == "broker_unavailable"


async def test_delayed_task_answer_says_when(tmp_path: Path) -> None:
    app, _ = make_app(f"sqlite:///{tmp_path / 'q.sqlite3'}")
    async with app:
        info = await app.enqueue("report:build", {"name": "later"}, process_in=60)
    answer = queued(info, location="/r/1")
    assert answer.status_code == 202 and answer.headers == {"Location": "/r/1"}
    assert "process_at" in answer.body


def test_duplicate_by_content_is_already_accepted() -> None:
    """H2: a duplicate by content is answered like a repeated task id."""
    answer = answer_for_error(durq.DuplicateTaskError(existing_id="t-1"))
    assert answer == Answer(200, {"status": "already_accepted", "task_id": "t-1"}, {})
    assert answer_for_error(ValueError("other")) is None


async def test_E4_a_twin_by_chosen_fields_is_already_accepted(tmp_path: Path) -> None:
    """H2: a twin of a durq.Unique is answered 200 already_accepted with the twin's id, also
    when the Unique returns twins to plain enqueue calls."""
    app, _ = make_app(f"sqlite:///{tmp_path / 'q.sqlite3'}")
    once = durq.Unique(keys=["name"], on_conflict="return")
    async with app:
        first = await enqueue_answer(app, "report:build", {"name": "sales", "n": 1}, unique=once)
        twin = await enqueue_answer(app, "report:build", {"name": "sales", "n": 2}, unique=once)
    assert first.status_code == 202
    assert twin == Answer(200, {"status": "already_accepted", "task_id": first.body["task_id"]}, {})


def test_payload_errors_are_raised_by_the_answer_and_a_422_response(tmp_path: Path) -> None:
    """enqueue_answer leaves bad input to the caller; the ASGI response answers it as
    FastAPI does: 422 with {"detail": [...]}."""
    app, _ = make_app(f"sqlite:///{tmp_path / 'q.sqlite3'}")

    async def run() -> JSONResponse:
        async with app:
            with pytest.raises(durq.PayloadError):
                await enqueue_answer(app, "report:build", {"bad": object()})
            return await enqueue_response(app, "report:build", {"bad": object()})

    import asyncio

    response = asyncio.run(run())
    assert response.status_code == 422
    (problem,) = json.loads(bytes(response.body))["detail"]
    assert problem["loc"] == ["payload"] and "JSON" in problem["msg"]
