"""durq.web.signal_answer: an inbound webhook becomes a signal, through a real ASGI app (the
monolith lifespan runs the worker) and a WSGI one, with its answers for a sender that calls
twice, an unknown task, a finished one and a broker that is down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.testclient import TestClient

import durq
from durq.web import signal_answer, signal_answer_sync
from durq.web.asgi import durq_lifespan, get_durq, to_response
from durq.web.wsgi import flask_response


def make_app(url: str) -> durq.App:
    app = durq.App(url)

    @app.task("coverage:order", queue="coverage", retention=60)
    async def order(payload: dict[str, Any], ctx: durq.TaskContext) -> str:
        answer = await ctx.wait_for("partner-callback", timeout="1h")
        return str(answer["policy"])

    return app


def test_W19_a_webhook_delivers_the_signal_the_task_waits_for(tmp_path: Path) -> None:
    app = make_app(f"sqlite:///{tmp_path / 'q.sqlite3'}")
    api = FastAPI(lifespan=durq_lifespan(app, worker={"poll_interval": 0.2}))

    @api.post("/partner/callback/{order_id}")
    async def callback(order_id: str, request: Request) -> JSONResponse:
        body = await request.json()
        answer = await signal_answer(
            get_durq(request), f"coverage:{order_id}", "partner-callback", body, queue="coverage"
        )
        return to_response(answer)

    with TestClient(api) as client:
        info = app.enqueue_sync("coverage:order", {}, task_id="coverage:o1")
        r = client.post("/partner/callback/o1", json={"policy": "POL-1"})
        assert r.status_code == 200, r.text
        assert r.json() == {
            "status": "delivered",
            "task_id": "coverage:o1",
            "signal": "partner-callback",
        }
        r = client.post("/partner/callback/o1", json={"policy": "again"})
        assert r.status_code == 200 and r.json()["status"] == "already_delivered"
        assert app.wait_sync(info, timeout=30) == "POL-1"
        # The partner calls again after the end: still "already delivered".
        r = client.post("/partner/callback/o1", json={"policy": "late"})
        assert r.status_code == 200 and r.json()["status"] == "already_delivered"
        # Another signal to a finished task is refused.
        late = app.run_sync(lambda: signal_answer(app, info, "other", 1))
        assert late.status_code == 409 and late.body["error"]["code"] == "task_finished"
        r = client.post("/partner/callback/nope", json={})
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_W19_a_webhook_while_the_broker_is_down_asks_to_retry() -> None:
    from flask import Flask, request

    app = make_app("redis://127.0.0.1:1/0?connect_timeout=0.2")
    web = Flask(__name__)

    @web.post("/partner/callback/<order_id>")
    def callback(order_id: str) -> Any:
        answer = signal_answer_sync(
            app, f"coverage:{order_id}", "partner-callback", request.get_json(), queue="coverage"
        )
        return flask_response(answer)

    r = web.test_client().post("/partner/callback/o1", json={"policy": "POL-1"})
    assert r.status_code == 503 and r.headers["Retry-After"]
    r = web.test_client().post("/partner/callback/o1", json="a\u0000b")
    assert r.status_code == 422 and r.get_json()["error"]["code"] == "invalid_signal"
    app.close_sync()
