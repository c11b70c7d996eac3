"""Signed webhooks: signing, verification, and durable delivery on every broker."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from webhook_receiver import SECRET, Receiver, wait_event

from apptools import AppFactory
from conformance.apps import wait_for_state
from durq import EnqueueRequest, continuations, webhooks
from durq.backoff import fixed
from durq.errors import ValidationError
from durq.states import TaskState
from durq.task import TaskInfo
from durq.webhooks import WebhookVerificationError, sign, verify

FAST = {"poll_interval": 0.1, "promote_interval": 0.05, "shutdown_timeout": 5.0}


# -- signing and verification (no broker) -------------------------------------------------------


def test_sign_and_verify_round_trip() -> None:
    body = b'{"event":"task.completed","result":{"n":42}}'
    headers = sign(body, SECRET, 1_800_000_000, "msg_1")
    assert headers["webhook-timestamp"] == "1800000000" and headers["webhook-id"] == "msg_1"
    assert headers["webhook-signature"].startswith("v1,")
    data = verify(body, headers, SECRET, now=1_800_000_100)
    assert data["result"] == {"n": 42}
    # Header names are case-insensitive; a rotated secret list accepts the old key.
    lower = {k.lower(): v for k, v in headers.items()}
    assert verify(body, lower, ["new-secret", SECRET], now=1_800_000_000)["event"]


def test_tampered_body_fails_verification() -> None:
    body = b'{"event":"task.completed","result":{"amount":10}}'
    headers = sign(body, SECRET, 1_800_000_000, "msg_1")
    tampered = body.replace(b"10", b"99")
    with pytest.raises(WebhookVerificationError, match="signature does not match"):
        verify(tampered, headers, SECRET, now=1_800_000_000)
    with pytest.raises(WebhookVerificationError, match="signature does not match"):
        verify(body, headers, "another-secret", now=1_800_000_000)
    # Moving the timestamp (to dodge the replay check) breaks the signature too.
    moved = {**headers, "webhook-timestamp": "1800000500"}
    with pytest.raises(WebhookVerificationError, match="signature does not match"):
        verify(body, moved, SECRET, now=1_800_000_500)


def test_replayed_or_unsigned_requests_fail() -> None:
    body = b"{}"
    headers = sign(body, SECRET, 1_800_000_000, "msg_1")
    with pytest.raises(WebhookVerificationError, match=r"old \(tolerance 300s"):
        verify(body, headers, SECRET, now=1_800_000_301)
    with pytest.raises(WebhookVerificationError, match="missing"):
        verify(body, {"webhook-timestamp": "1800000000"}, SECRET, now=1_800_000_000)
    with pytest.raises(WebhookVerificationError, match="not an integer"):
        verify(body, {**headers, "webhook-timestamp": "soon"}, SECRET, now=1_800_000_000)


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
    # The delivery options travel with the task: whoever records its outcome (a worker, the
    # rescuer, the inspector) creates the delivery task with them, in the same atomic step.
    assert json.loads(info.headers[webhooks.HEADER_OPTIONS]) == {
        "queue": None,
        "max_retry": 10,
        "timeout": 20.0,
        "retention": 86400.0,
    }
    # The result rides in the delivery's payload: the task keeps its own retention.
    assert info.retention == 3600  # the default (an hour), not the delivery's
    webhooks.install(app, None, queue="hooks", max_retry=3, timeout=2, retention=60)
    (outcome,) = await app.enqueue_many(
        [EnqueueRequest("report:build", {}, headers={"durq-webhook": "https://p.example/x"})]
    )
    assert outcome.info is not None
    assert json.loads(outcome.info.headers[webhooks.HEADER_OPTIONS]) == {
        "queue": "hooks",
        "max_retry": 3,
        "timeout": 4.0,
        "retention": 60.0,
    }


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
    assert headers["webhook-id"] == delivery_id
    # Every attempt was signed afresh; the failed ones were as authentic as the last.
    for raw, sent in receiver.requests:
        assert json.loads(raw) == event
        verify(raw, sent, SECRET)
    delivery = await app.inspector.get_task_info("default", delivery_id)
    assert delivery.state is TaskState.COMPLETED and delivery.retried == 2
    assert "no 2xx answer" in (delivery.last_error or "")
    assert delivery.result == {"status": 200}


async def test_final_error_is_delivered_once(make_app: AppFactory, receiver: Receiver) -> None:
    app = await make_app(fake_clock=False, webhook_secret=SECRET)
    runs: list[int] = []

    @app.task("charge:card", queue="billing", max_retry=0)
    def charge(payload: dict[str, Any]) -> None:
        runs.append(1)
        raise RuntimeError("card declined")

    async with app.worker(**FAST):
        info = await charge.enqueue({}, webhook=receiver.url)
        await wait_event(receiver.got)
        archived = await app.inspector.get_task_info("billing", info.id)
        # Archived a second time (an operator reran it): the delivery of that event exists
        # already, so the second archive creates none (one delivery per event).
        await app.inspector.run_task("billing", info.id)
        while len(runs) < 2:
            await asyncio.sleep(0.02)
        await wait_for_state(app, "billing", info.id, TaskState.ARCHIVED)
        await asyncio.sleep(0.3)
    assert archived.state is TaskState.ARCHIVED
    assert len(receiver.requests) == 1
    event = verify(*receiver.requests[0], SECRET)
    assert event["event"] == "task.archived"
    assert event["error"] == "RuntimeError: card declined"
    assert event["task"]["state"] == "archived" and event["task"]["retried"] == 1
    assert "result" not in event
    delivery_id = webhooks.delivery_task_id(info.id, "archived")
    delivery = await app.inspector.get_task_info("billing", delivery_id)
    assert delivery.state is TaskState.COMPLETED
    assert delivery.headers["durq-then-of"] == info.id


async def test_without_a_secret_nothing_is_installed(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(webhooks.SECRET_ENV, raising=False)
    app = await make_app()
    assert webhooks.TASK_TYPE not in app.tasks
    assert app.worker_hooks == []  # delivery is a continuation, not a worker hook
    assert webhooks.install(app, None, max_retry=2) is False
    assert webhooks.TASK_TYPE not in app.tasks and app.webhook_options.max_retry == 2
    monkeypatch.setenv(webhooks.SECRET_ENV, SECRET)
    app2 = await make_app()
    assert webhooks.TASK_TYPE in app2.tasks
    assert webhooks.install(app2, "other", max_retry=4)  # reinstalling replaces the handler
    assert app2.tasks[webhooks.TASK_TYPE].defaults.max_retry == 4
    assert app2.worker_hooks == []


# -- the delivery as a follow-up (pure functions, no broker) ------------------------------------


def _finished(headers: dict[str, str], **fields: Any) -> TaskInfo:
    return TaskInfo(
        id="t1",
        queue="default",
        type="report:build",
        raw_payload=b'{"id":1}',
        state=TaskState.ACTIVE,
        max_retry=3,
        headers=headers,
        **fields,
    )


def test_delivery_rides_with_the_continuation() -> None:
    then = json.dumps({"type": "next:step", "queue": "default", "on_archived": True})
    task = _finished({"durq-webhook": "https://p.example/in", "durq-then": then})
    made = continuations.follow_ups(task, "completed", result=b'{"rows":2}', now=1_800_000_000)
    assert [p.id for p in made] == ["then:t1", "webhook:completed:t1"]
    hook = made[1]
    assert hook.type == webhooks.TASK_TYPE and hook.max_retry == 10 and hook.timeout == 20
    body = json.loads(hook.payload)["body"]
    assert body["result"] == {"rows": 2}
    assert body["task"]["completed_at"].startswith("2027-01-15")
    # Archived: the error, and the attempt the archive counts.
    (_, hook) = continuations.follow_ups(task, "archived", error="boom", retried=1)
    assert hook.id == "webhook:archived:t1"
    assert json.loads(hook.payload)["body"]["error"] == "boom"
    assert json.loads(hook.payload)["body"]["task"]["retried"] == 1


def test_a_malformed_header_costs_only_its_own_follow_up() -> None:
    then = json.dumps({"type": "next:step", "queue": "default"})
    bad_options = {"durq-webhook": "https://p.example/in", "durq-webhook-options": "[1"}
    made = continuations.follow_ups(_finished({**bad_options, "durq-then": then}), "completed")
    assert [p.id for p in made] == ["then:t1"]
    made = continuations.follow_ups(
        _finished({"durq-webhook": "https://p.example/in", "durq-then": "{"}), "completed"
    )
    assert [p.id for p in made] == ["webhook:completed:t1"]
    bad_url = _finished({"durq-webhook": "file:///etc/passwd"})
    assert continuations.for_archived(bad_url) == ()


def test_an_oversized_result_is_omitted_and_deliveries_have_no_delivery() -> None:
    task = _finished({"durq-webhook": "https://p.example/in"})
    big = json.dumps({"blob": "x" * 5000}).encode()
    (hook,) = continuations.follow_ups(task, "completed", result=big, max_payload=2000)
    body = json.loads(hook.payload)["body"]
    assert "result" not in body and body["result_omitted"] == "too large"
    assert len(hook.payload) < 2000
    delivery = _finished({"durq-webhook": "https://p.example/in"}).replace(type="durq:webhook")
    assert continuations.follow_ups(delivery, "archived", error="x") == ()


async def test_encrypted_result_is_delivered_in_the_clear(
    make_app: AppFactory, receiver: Receiver
) -> None:
    """With encryption on, the delivery task stores the result encrypted; the receiver gets
    the plain, validly signed result."""
    from durq import encryption as crypt
    from durq.encryption import Encryption

    keys = Encryption({"k1": Encryption.new_key()})
    app = await make_app(fake_clock=False, webhook_secret=SECRET, encryption=keys)
    webhooks.install(app, SECRET, timeout=5)

    @app.task("report:build")
    async def build(payload: dict[str, Any]) -> dict[str, Any]:
        return {"rows": f"secret-{payload['n']}"}

    async with app.worker(**FAST):
        info = await build.enqueue({"n": 21}, webhook=receiver.url)
        await wait_event(receiver.got)
    body, headers = receiver.requests[-1]
    event = verify(body, headers, SECRET)
    assert event["result"] == {"rows": "secret-21"}
    delivery_id = webhooks.delivery_task_id(info.id, "completed")
    delivery = await app.inspector.get_task_info("default", delivery_id)
    assert b"secret-21" not in delivery.raw_payload  # stored sealed inside the event
    assert crypt.has_sealed(delivery.raw_payload)
