"""durq.web for WSGI apps: Flask triples through the sync face, a worker thread for the
monolith, and a plain WSGI answer."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

import durq
from durq.web import unavailable
from durq.web.wsgi import BackgroundWorker, enqueue_response, init_app, wsgi_response


def test_flask_monolith_202_200_and_the_worker_thread(tmp_path: Path) -> None:
    """H1, H2, H5 through the sync face: 202, then 200 already_accepted; a worker thread."""
    flask = pytest.importorskip("flask")
    app = durq.App(f"sqlite:///{tmp_path / 'q.sqlite3'}")
    ran = threading.Event()

    @app.task("mail:send", retention=60)  # kept after success: a repeat conflicts (E3)
    def send(payload: dict[str, Any]) -> None:  # a sync handler, as Flask code would write
        ran.set()

    web = flask.Flask(__name__)
    init_app(web, app, worker={"poll_interval": 0.05, "shutdown_timeout": 1})

    @web.post("/mail/<mail_id>")
    def create(mail_id: str) -> Any:
        from durq.web.wsgi import get_durq

        return enqueue_response(
            get_durq(), "mail:send", {"to": "a@b.c"}, task_id=mail_id, location=f"/mail/{mail_id}"
        )

    try:
        client = web.test_client()
        first = client.post("/mail/m-1")
        assert first.status_code == 202
        assert first.headers["Location"] == "/mail/m-1"
        assert first.get_json()["status"] == "queued"
        again = client.post("/mail/m-1")
        assert again.status_code == 200
        assert again.get_json() == {
            "status": "already_accepted",
            "task_id": "m-1",
            "state": again.get_json()["state"],
        }
        assert ran.wait(10)
    finally:
        web.extensions["durq_worker"].stop()
        app.close_sync()


def test_sync_enqueue_503_when_the_broker_is_down(tmp_path: Path) -> None:
    """H3 through the sync face: 503 with Retry-After and a JSON error."""
    app = durq.App(f"sqlite:///{tmp_path / 'missing' / 'q.sqlite3'}")
    try:
        body, status, headers = enqueue_response(app, "mail:send", {"to": "x"})
    finally:
        app.close_sync()
    assert status == 503
    assert headers["Retry-After"] == "5" and headers["Content-Type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "broker_unavailable"


def test_a_refused_payload_is_a_422_through_flask(tmp_path: Path) -> None:
    """Bad input from the client is answered 422 in FastAPI's shape, never a 500, and
    nothing is enqueued."""
    flask = pytest.importorskip("flask")
    app = durq.App(f"sqlite:///{tmp_path / 'q.sqlite3'}")

    @app.task("mail:send")
    def send(payload: dict[str, Any]) -> None:
        pass

    web = flask.Flask(__name__)

    @web.post("/mail")
    def create() -> Any:
        return enqueue_response(app, "mail:send", {"to": object()})

    try:
        answer = web.test_client().post("/mail")
        assert answer.status_code == 422
        assert answer.headers["Content-Type"] == "application/json"
        (problem,) = answer.get_json()["detail"]
        assert problem["loc"] == ["payload"] and "JSON" in problem["msg"]
        with pytest.raises(durq.QueueNotFoundError):  # no task ever reached the queue
            app.run_sync(lambda: app.inspector.list_tasks("default", "pending"))
    finally:
        app.close_sync()


def test_background_worker_start_error_is_raised(tmp_path: Path) -> None:
    app = durq.App(f"sqlite:///{tmp_path / 'missing' / 'q.sqlite3'}")
    with pytest.raises(durq.BrokerUnavailableError):
        BackgroundWorker(app).start()


def test_plain_wsgi_answer() -> None:
    seen: list[Any] = []
    body = wsgi_response(unavailable(retry_after=3))(
        {}, lambda status, headers: seen.extend([status, headers])
    )
    assert seen[0] == "503 Service Unavailable"
    assert ("Retry-After", "3") in seen[1]
    assert json.loads(b"".join(body))["error"]["code"] == "broker_unavailable"
