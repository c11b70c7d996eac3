"""Signed webhooks: signing, verification, and durable delivery on every broker."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from apptools import AppFactory
from durq import webhooks
from durq.backoff import fixed
from durq.errors import ValidationError
from durq.states import TaskState
from durq.webhooks import WebhookVerificationError, sign, verify

SECRET = "whsec_test_0123456789"
FAST = {"poll_interval": 0.1, "promote_interval": 0.05, "shutdown_timeout": 5.0}


# -- a real receiver on loopback ----------------------------------------------------------------


@dataclass
class Receiver:
    """Answers 500 to the first ``fail`` requests, then 200; records every request."""

    fail: int = 0
    requests: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)
    url: str = ""
    got: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.requests.append((body, dict(self.headers.items())))
            failing = len(state.requests) <= state.fail
            self.send_response(500 if failing else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            if not failing:
                state.got.set()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/durq"
    yield state
    server.shutdown()
    server.server_close()


async def wait_event(event: threading.Event, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not event.is_set():
        assert time.monotonic() < deadline, "no successful delivery in time"
        await asyncio.sleep(0.02)


# -- signing and verification (no broker) -------------------------------------------------------


def test_sign_and_verify_round_trip() -> None:
    body = b'{"event":"task.completed","result":{"n":42}}'
    headers = sign(body, SECRET, 1_800_000_000)
    assert headers["Durq-Timestamp"] == "1800000000"
    assert headers["Durq-Signature"].startswith("v1=")
    data = verify(body, headers, SECRET, now=1_800_000_100)
    assert data["result"] == {"n": 42}
    # Header names are case-insensitive; a rotated secret list accepts the old key.
    lower = {k.lower(): v for k, v in headers.items()}
    assert verify(body, lower, ["new-secret", SECRET], now=1_800_000_000)["event"]


def test_tampered_body_fails_verification() -> None:
    body = b'{"event":"task.completed","result":{"amount":10}}'
    headers = sign(body, SECRET, 1_800_000_000)
    tampered = body.replace(b"10", b"99")
    with pytest.raises(WebhookVerificationError, match="signature does not match"):
        verify(tampered, headers, SECRET, now=1_800_000_000)
    with pytest.raises(WebhookVerificationError, match="signature does not match"):
        verify(body, headers, "another-secret", now=1_800_000_000)
    # Moving the timestamp (to dodge the replay check) breaks the signature too.
    moved = {**headers, "Durq-Timestamp": "1800000500"}
    with pytest.raises(WebhookVerificationError, match="signature does not match"):
        verify(body, moved, SECRET, now=1_800_000_500)


def test_replayed_or_unsigned_requests_fail() -> None:
    body = b"{}"
    headers = sign(body, SECRET, 1_800_000_000)
    with pytest.raises(WebhookVerificationError, match="tolerance 300s"):
        verify(body, headers, SECRET, now=1_800_000_301)
    with pytest.raises(WebhookVerificationError, match="missing"):
        verify(body, {"Durq-Timestamp": "1800000000"}, SECRET, now=1_800_000_000)
    with pytest.raises(WebhookVerificationError, match="not an integer"):
        verify(body, {**headers, "Durq-Timestamp": "soon"}, SECRET, now=1_800_000_000)


@pytest.mark.parametrize(
    "url",
    ["ftp://example.com/x", "javascript:alert(1)", "example.com/hook", "https://", "", 42, None],
)
def test_webhook_urls_must_be_http(url: Any) -> None:
    with pytest.raises(ValidationError):
        webhooks.check_url(url)


# -- enqueue and delivery on every broker -------------------------------------------------------


async def test_enqueue_validates_and_stores_the_webhook(make_app: AppFactory) -> None:
    app = await make_app()
    with pytest.raises(ValidationError, match="http:// or https://"):
        await app.enqueue("report:build", {}, webhook="ftp://partner.example/in")
    with pytest.raises(ValidationError):
        await app.enqueue("report:build", {}, headers={"durq-webhook": "file:///etc/passwd"})
    assert all(q.size == 0 for q in await app.inspector.list_queues())  # nothing written
    info = await app.enqueue("report:build", {}, webhook="https://partner.example/in")
    assert info.headers["durq-webhook"] == "https://partner.example/in"
    # The result must outlive completion long enough for the hook to read it.
    assert info.retention >= webhooks.MIN_RETENTION


async def test_delivery_retries_until_the_receiver_accepts(
    make_app: AppFactory, receiver: Receiver
) -> None:
    """The receiver fails twice; the third attempt delivers a validly signed result."""
    receiver.fail = 2
    app = await make_app(fake_clock=False, webhook_secret=SECRET)
    webhooks.install(app, SECRET, retry_delay=fixed(0.05), timeout=5)

    @app.task("report:build")
    async def build(payload: dict[str, Any]) -> dict[str, Any]:
        return {"rows": payload["n"] * 2}

    async with app.worker(**FAST):
        info = await build.enqueue({"n": 21}, webhook=receiver.url)
        await wait_event(receiver.got)
    assert len(receiver.requests) == 3
    body, headers = receiver.requests[-1]
    event = verify(body, headers, SECRET)
    assert event["event"] == "task.completed"
    assert event["task"]["id"] == info.id and event["task"]["type"] == "report:build"
    assert event["result"] == {"rows": 42}
    delivery_id = webhooks.delivery_task_id(info.id, "completed")
    assert headers["Durq-Delivery"] == delivery_id and headers["Durq-Event"] == "task.completed"
    # Every attempt was signed afresh; the failed ones were as authentic as the last.
    for raw, sent in receiver.requests:
        assert json.loads(raw) == event
        verify(raw, sent, SECRET)
    delivery = await app.inspector.get_task_info("default", delivery_id)
    assert delivery.state is TaskState.COMPLETED and delivery.retried == 2
    assert "HTTP 500" in (delivery.last_error or "")
    assert delivery.result == {"status": 200}


async def test_final_error_is_delivered_once(make_app: AppFactory, receiver: Receiver) -> None:
    app = await make_app(fake_clock=False, webhook_secret=SECRET)

    @app.task("charge:card", queue="billing", max_retry=0)
    def charge(payload: dict[str, Any]) -> None:
        raise RuntimeError("card declined")

    async with app.worker(**FAST):
        info = await charge.enqueue({}, webhook=receiver.url)
        await wait_event(receiver.got)
        archived = await app.inspector.get_task_info("billing", info.id)
        # A second enqueue of the same delivery (a hook that ran twice) is refused by its id.
        hooks = next(h for h in app.worker_hooks if isinstance(h, webhooks.WebhookHooks))
        await hooks._enqueue_once(archived, "task.archived", receiver.url)
        await asyncio.sleep(0.3)
    assert archived.state is TaskState.ARCHIVED
    assert len(receiver.requests) == 1
    event = verify(*receiver.requests[0], SECRET)
    assert event["event"] == "task.archived"
    assert event["error"] == "RuntimeError: card declined"
    assert "result" not in event
    delivery_id = webhooks.delivery_task_id(info.id, "archived")
    delivery = await app.inspector.get_task_info("billing", delivery_id)
    assert delivery.state is TaskState.COMPLETED


async def test_without_a_secret_nothing_is_installed(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(webhooks.SECRET_ENV, raising=False)
    app = await make_app()
    assert webhooks.TASK_TYPE not in app.tasks
    assert not any(isinstance(h, webhooks.WebhookHooks) for h in app.worker_hooks)
    monkeypatch.setenv(webhooks.SECRET_ENV, SECRET)
    app2 = await make_app()
    assert webhooks.TASK_TYPE in app2.tasks
    assert sum(isinstance(h, webhooks.WebhookHooks) for h in app2.worker_hooks) == 1
    webhooks.install(app2, "other")  # reinstalling replaces, never duplicates
    assert sum(isinstance(h, webhooks.WebhookHooks) for h in app2.worker_hooks) == 1
