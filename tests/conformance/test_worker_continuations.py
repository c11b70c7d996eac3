"""Continuations with real workers on every broker: the follow-up gets the task, its payload
and its result (or error), and survives a worker killed around the completion."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

import durq
from conformance.apps import (
    FAST,
    exists,
    signal_on_marker,
    wait_for_state,
    worker_process,
)
from durq.errors import InvalidNameError, ValidationError
from durq.states import TaskState

HERE = Path(__file__).parent


async def test_follow_up_receives_task_payload_and_result(app: durq.App) -> None:
    got: list[dict[str, Any]] = []
    done = asyncio.Event()

    @app.task("pdf:render", retention=60)
    async def render(payload: dict[str, Any]) -> dict[str, Any]:
        return {"pages": payload["doc"] * 2}

    @app.task("mail:send", queue="mail")
    async def send(payload: dict[str, Any], ctx: durq.TaskContext) -> None:
        got.append({**payload, "_headers": ctx.headers})
        done.set()

    info = await render.enqueue({"doc": 7}, then=durq.Then("mail:send", retention=60))
    assert "durq-then" in info.headers
    async with app.worker(queues=["default", "mail"], **FAST):
        await asyncio.wait_for(done.wait(), 10)
    (payload,) = got
    assert payload["task"] == {
        "id": info.id,
        "queue": "default",
        "type": "pdf:render",
        "state": "completed",
    }
    assert payload["payload"] == {"doc": 7} and payload["result"] == {"pages": 14}
    assert payload["_headers"]["durq-then-of"] == info.id
    follow = await app.inspector.get_task_info("mail", f"then:{info.id}")
    assert follow.type == "mail:send"  # the registered queue of the follow-up type


async def test_on_archived_follow_up_receives_the_error(app: durq.App) -> None:
    got: list[dict[str, Any]] = []
    done = asyncio.Event()

    @app.task("charge:card", max_retry=0)
    def charge(payload: dict[str, Any]) -> None:
        raise RuntimeError("card declined")

    @app.task("charge:failed")
    def failed(payload: dict[str, Any]) -> None:
        got.append(payload)
        done.set()

    @app.task("charge:skip")
    def skip(payload: dict[str, Any]) -> None:
        raise durq.SkipRetry("not this one")

    quiet = await skip.enqueue({}, then="charge:failed")  # completion only: nothing
    info = await charge.enqueue({"n": 1}, then=durq.Then("charge:failed", on_archived=True))
    async with app.worker(**FAST):
        await asyncio.wait_for(done.wait(), 10)
        await wait_for_state(app, "default", quiet.id, TaskState.ARCHIVED)
    assert got == [
        {
            "task": {"id": info.id, "queue": "default", "type": "charge:card", "state": "archived"},
            "payload": {"n": 1},
            "error": "RuntimeError: card declined",
        }
    ]
    with pytest.raises(durq.TaskNotFoundError):
        await app.inspector.get_task_info("default", f"then:{quiet.id}")


async def test_then_is_validated_at_enqueue(app: durq.App) -> None:
    with pytest.raises(InvalidNameError):
        await app.enqueue("a:b", {}, then=durq.Then("bad type!"))
    with pytest.raises(InvalidNameError):
        await app.enqueue("a:b", {}, then=durq.Then("ok:type", queue="no spaces"))
    with pytest.raises(ValidationError):
        await app.enqueue("a:b", {}, then=durq.Then("ok:type", max_retry=-1))
    with pytest.raises(ValidationError):
        await app.enqueue("a:b", {}, then=42)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        await app.enqueue("a:b", {}, headers={"durq-then": "not json"})
    assert all(q.size == 0 for q in await app.inspector.list_queues())  # nothing written
    # Through enqueue_many too, and a header given by hand is resolved like then=.
    (outcome,) = await app.enqueue_many(
        [durq.EnqueueRequest("a:b", {}, then=durq.Then("ok:type", queue="q2", max_retry=2))]
    )
    assert outcome.info is not None
    assert '"queue":"q2"' in outcome.info.headers["durq-then"]


async def test_continuation_survives_a_worker_killed_right_after_the_handler(
    app: durq.App, broker_url: str, tmp_path: Path
) -> None:
    """SIGKILL the moment the handler returned: whatever instant the kill lands in, the parent
    is completed exactly when its follow-up exists; after recovery both exist, once."""
    marker = tmp_path / "marker.txt"
    then = durq.Then("test:after", queue="after", retention=60)
    with worker_process(broker_url, marker, lease=1.5) as proc:
        info = await app.enqueue("test:returns", {"n": 5}, queue="kill", retention=60, then=then)
        await signal_on_marker(proc, marker, "return", signal.SIGKILL)
    # On a Redis Cluster a follow-up into another queue's slot is written to the completing
    # queue's outbox with the outcome and moved to its queue right after; a kill in between
    # leaves it to the next maintenance pass of any worker, which this is.
    await (await app.broker()).promote_due()
    parent = await app.inspector.get_task_info("kill", info.id)
    follow_up = await exists(app, "after", f"then:{info.id}")
    assert parent.state in (TaskState.ACTIVE, TaskState.COMPLETED)
    assert follow_up == (parent.state is TaskState.COMPLETED), parent  # both or neither

    runs: list[dict[str, Any]] = []

    @app.task("test:returns", queue="kill", retention=60)
    def returns(payload: dict[str, Any]) -> dict[str, Any]:
        return {"n": payload["n"]}

    @app.task("test:after", queue="after", retention=60)
    def after(payload: dict[str, Any]) -> None:
        runs.append(payload)

    async with app.worker(queues=["kill", "after"], lease_seconds=2, **FAST):
        await wait_for_state(app, "kill", info.id, TaskState.COMPLETED, timeout=20)
        await wait_for_state(app, "after", f"then:{info.id}", TaskState.COMPLETED, timeout=20)
        await asyncio.sleep(0.3)  # a duplicate would show up here
    assert len(runs) == 1 and runs[0]["result"] == {"n": 5}


async def test_continuation_created_once_after_a_kill_mid_run(
    app: durq.App, broker_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "marker.txt"
    then = durq.Then("test:after", queue="after", retention=60)
    with worker_process(broker_url, marker, lease=1.5) as proc:
        info = await app.enqueue(
            "test:sleepy", {"seconds": 60}, queue="kill", retention=60, then=then
        )
        await signal_on_marker(proc, marker, "start", signal.SIGKILL)
    assert not await exists(app, "after", f"then:{info.id}")
    runs: list[dict[str, Any]] = []

    @app.task("test:sleepy", queue="kill", retention=60)
    async def sleepy(payload: dict[str, Any]) -> str:
        return "second life"

    @app.task("test:after", queue="after", retention=60)
    def after(payload: dict[str, Any]) -> None:
        runs.append(payload)

    async with app.worker(queues=["kill", "after"], lease_seconds=2, **FAST):
        await wait_for_state(app, "kill", info.id, TaskState.COMPLETED, timeout=20)
        await wait_for_state(app, "after", f"then:{info.id}", TaskState.COMPLETED, timeout=20)
        await asyncio.sleep(0.3)
    assert len(runs) == 1 and runs[0]["result"] == "second life"
    parent = await app.inspector.get_task_info("kill", info.id)
    assert parent.retried == 1 and parent.last_error == "lease expired"
