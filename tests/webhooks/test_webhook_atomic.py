"""Webhook delivery as a built-in continuation, on every broker: the ``durq:webhook`` task is
created in the same atomic step as the outcome (a worker killed the instant its handler
returns leaves both or neither), and archives decided outside a worker (the inspector, the
rescuer's "worker lost") deliver an ``archived`` event too."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

from webhook_receiver import SECRET, Receiver, wait_event

import durq
from apptools import AppFactory
from conformance.apps import exists, signal_on_marker, wait_for_state, worker_process
from conformance.brokerkit import LEASE, claim
from durq import lifecycle, webhooks
from durq.clock import FakeClock
from durq.states import TaskState
from durq.webhooks import verify

FAST = {
    "poll_interval": 0.1,
    "promote_interval": 0.05,
    "rescue_interval": 0.2,
    "shutdown_timeout": 5.0,
}


async def test_delivery_survives_a_worker_killed_right_after_the_handler(
    make_app: AppFactory, broker_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    """SIGKILL the moment the handler returned: whatever instant the kill lands in, the parent
    is completed exactly when its delivery task exists; after recovery exactly one signed
    delivery reaches the receiver. The killed worker's app has no secret: creating the
    delivery needs none, only sending it does."""
    app = await make_app(fake_clock=False, webhook_secret=SECRET)
    marker = tmp_path / "marker.txt"
    with worker_process(broker_url, marker, lease=1.5) as proc:
        info = await app.enqueue(
            "test:returns", {"n": 5}, queue="kill", retention=60, webhook=receiver.url
        )
        await signal_on_marker(proc, marker, "return", signal.SIGKILL)
    delivery_id = webhooks.delivery_task_id(info.id, "completed")
    parent = await app.inspector.get_task_info("kill", info.id)
    delivery = await exists(app, "kill", delivery_id)
    assert parent.state in (TaskState.ACTIVE, TaskState.COMPLETED)
    assert delivery == (parent.state is TaskState.COMPLETED), parent  # both or neither
    assert not receiver.requests

    @app.task("test:returns", queue="kill", retention=60)
    def returns(payload: dict[str, Any]) -> dict[str, Any]:
        return {"n": payload["n"]}

    async with app.worker(queues=["kill"], lease_seconds=2, **FAST):
        await wait_for_state(app, "kill", info.id, TaskState.COMPLETED, timeout=20)
        await wait_event(receiver.got, timeout=20)
        await wait_for_state(app, "kill", delivery_id, TaskState.COMPLETED)
        await asyncio.sleep(0.3)  # a duplicate would show up here
    (request,) = receiver.requests
    event = verify(*request, SECRET)
    assert event["event"] == "task.completed" and event["result"] == {"n": 5}
    assert event["task"]["id"] == info.id and event["task"]["state"] == "completed"
    assert event["task"]["completed_at"] and event["task"]["enqueued_at"]
    assert request[1]["webhook-id"] == delivery_id


async def test_inspector_archive_and_cancel_deliver_an_archived_event(
    make_app: AppFactory, receiver: Receiver
) -> None:
    """Tasks archived or cancelled by an operator while waiting never reach a worker; the
    delivery is created by the broker with the archive."""
    app = await make_app(fake_clock=False, webhook_secret=SECRET)
    archived = await app.enqueue("report:build", {"id": 1}, webhook=receiver.url)
    cancelled = await app.enqueue("report:build", {"id": 2}, webhook=receiver.url, process_in=3600)
    await app.inspector.archive_task("default", archived.id)
    await app.inspector.cancel_task("default", cancelled.id)
    for parent in (archived, cancelled):
        hook = await app.inspector.get_task_info(
            "default", webhooks.delivery_task_id(parent.id, "archived")
        )
        assert hook.type == webhooks.TASK_TYPE and hook.max_retry == 10
        assert hook.payload["url"] == receiver.url
    async with app.worker(queues=["default"], **FAST):
        while len(receiver.requests) < 2:
            await wait_event(receiver.got)
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
    events = {e["task"]["id"]: e for e in (verify(*r, SECRET) for r in receiver.requests)}
    assert set(events) == {archived.id, cancelled.id} and len(receiver.requests) == 2
    assert all(e["event"] == "task.archived" and "result" not in e for e in events.values())
    assert events[cancelled.id]["error"] == "cancelled"
    stored = await app.inspector.get_task_info("default", archived.id)
    assert events[archived.id]["error"] == (stored.last_error or "archived")


async def test_rescuer_worker_lost_archive_delivers(
    make_app: AppFactory, clock: FakeClock, receiver: Receiver
) -> None:
    """A task whose worker died is archived by the rescuer ("worker lost"); the broker creates
    both follow-ups the headers ask for (the continuation and the webhook delivery), and a
    worker delivers the event."""
    clock.set(time.time() - 600)  # in the past: a real-clock worker finds the delivery due
    app = await make_app(webhook_secret=SECRET)
    webhooks.install(app, SECRET, queue="hooks", max_retry=4)
    info = await app.enqueue(
        "report:build",
        {"id": 7},
        webhook=receiver.url,
        then=durq.Then("report:failed", on_archived=True),
    )
    broker = await app.broker()
    (lease,) = await claim(broker)
    assert lease.task.id == info.id
    clock.advance(LEASE + 1)
    rescued = await lifecycle.rescue_expired(broker, 1)
    assert [(t.id, t.state) for t in rescued] == [(info.id, TaskState.ARCHIVED)]
    hook = await broker.admin.get_task("hooks", webhooks.delivery_task_id(info.id, "archived"))
    assert hook.type == webhooks.TASK_TYPE and hook.max_retry == 4
    assert hook.headers["durq-then-of"] == info.id
    body = hook.payload["body"]
    assert body["event"] == "task.archived" and body["error"] == "worker lost"
    assert body["task"]["retried"] == 1 and body["task"]["state"] == "archived"
    then = await broker.admin.get_task("default", f"then:{info.id}")
    assert then.payload["error"] == "worker lost"

    sender = await make_app(fake_clock=False, webhook_secret=SECRET)
    webhooks.install(sender, SECRET, queue="hooks")
    async with sender.worker(queues=["hooks"], **FAST):
        await wait_event(receiver.got)
    (request,) = receiver.requests
    event = verify(*request, SECRET)
    assert event == body
    assert json.loads(request[0]) == body
