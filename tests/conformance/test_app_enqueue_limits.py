"""One enqueue never breaks the operator's view: hostile times, durations, retry counts,
headers and payloads are refused before any broker sees them, with the same typed error on
every broker, nothing is stored, and every listing still answers. The largest accepted
values are held by every broker and read back through the inspector and the API."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import durq
from apptools import AppFactory
from conformance.apps import wait_for_state
from durq import options, webhooks
from durq.errors import ConfigurationError, PayloadError, ValidationError
from durq.states import TaskState


def nested(depth: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return {"deep": value}


HOSTILE: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("process_in huge", {"process_in": 99999999999 * 3600}, ValidationError),
    ("process_in huge text", {"process_in": "99999999999h"}, ValidationError),
    ("process_in 1e308", {"process_in": 1e308}, ValidationError),
    ("process_in inf", {"process_in": math.inf}, ValidationError),
    ("process_at 1e308", {"process_at": 1e308}, ValidationError),
    ("process_at year 9999", {"process_at": datetime(9999, 12, 31, tzinfo=UTC)}, ValidationError),
    ("deadline 1e308", {"deadline": 1e308}, ValidationError),
    ("deadline negative", {"deadline": -1e20}, ValidationError),
    ("retention inf", {"retention": math.inf}, ValidationError),
    ("retention 1e308", {"retention": 1e308}, ValidationError),
    ("retention timedelta max", {"retention": timedelta.max}, ValidationError),
    ("timeout inf", {"timeout": math.inf}, ValidationError),
    ("unique nan", {"unique": math.nan}, ValidationError),
    ("max_retry 10**30", {"max_retry": 10**30}, ValidationError),
    ("max_retry 2**31", {"max_retry": 2**31}, ValidationError),
    ("header NUL key", {"headers": {"a\x00b": "x"}}, ValidationError),
    ("header NUL value", {"headers": {"k": "a\x00"}}, ValidationError),
    ("header empty key", {"headers": {"": "x"}}, ValidationError),
    ("header control key", {"headers": {"a\nb": "x"}}, ValidationError),
    ("header 1 MB value", {"headers": {"k": "x" * 2**20}}, ValidationError),
    ("header 10k keys", {"headers": {f"k{i}": "v" for i in range(10_000)}}, ValidationError),
    ("payload 3000 deep", {"payload": nested(3000)}, PayloadError),
    ("payload 990 deep", {"payload": nested(990)}, PayloadError),
    ("payload 5000 digits", {"payload": {"n": 10**5000}}, PayloadError),
]


async def assert_view_intact(app: Any) -> None:
    """Every listing and every task answers, through the inspector and as JSON."""
    for queue in await app.inspector.list_queues():
        for state in TaskState:
            for task in await app.inspector.list_tasks(queue.name, state, limit=50):
                info = await app.inspector.get_task_info(queue.name, task.id)
                json.dumps(info.to_dict(), allow_nan=False)
                json.dumps(task.to_dict(), allow_nan=False)


@pytest.mark.parametrize(("case", "given", "error"), HOSTILE, ids=[c for c, _, _ in HOSTILE])
async def test_hostile_options_are_one_typed_error_on_every_broker(
    make_app: AppFactory, case: str, given: dict[str, Any], error: type[Exception]
) -> None:
    app = await make_app()
    given = dict(given)
    payload = given.pop("payload", {"n": 1})
    with pytest.raises(error):
        await app.enqueue("report:build", payload, task_id="hostile-1", **given)
    # Refused before the broker: nothing stored, the id still free, every view intact.
    assert sum(q.size for q in await app.inspector.list_queues()) == 0
    await app.enqueue("report:build", {}, task_id="hostile-1")
    await assert_view_intact(app)


async def test_the_largest_accepted_values_are_held_by_every_broker(
    make_app: AppFactory,
) -> None:
    app = await make_app()
    now = app.clock.now()
    far = options.MAX_EPOCH - 1
    info = await app.enqueue(
        "report:build",
        {"deep": nested(50)["deep"]},
        task_id="far",
        process_at=far,
        deadline=far,
        retention=options.MAX_DURATION,
        timeout=options.MAX_DURATION,
        unique=options.MAX_DURATION,
        max_retry=options.MAX_RETRY,
        headers={f"k{i}": "v" * 100 for i in range(options.MAX_HEADERS - 10)},
    )
    assert info.state is TaskState.SCHEDULED and info.max_retry == options.MAX_RETRY
    later = await app.enqueue("report:build", {}, task_id="later", process_in=options.MAX_DURATION)
    assert later.next_process_at is not None
    assert later.next_process_at.timestamp() == pytest.approx(now + options.MAX_DURATION)
    await assert_view_intact(app)


async def test_header_bytes_are_bounded_and_configurable(make_app: AppFactory) -> None:
    app = await make_app(max_header_bytes=1000)
    with pytest.raises(ValidationError, match="headers"):
        await app.enqueue("report:build", {}, headers={"k": "x" * 1000})
    await app.enqueue("report:build", {}, headers={"k": "x" * 900})
    with pytest.raises(ValueError):
        await make_app(max_header_bytes=0)


async def test_results_are_bounded_and_lists_carry_previews(make_app: AppFactory) -> None:
    """A result over ``max_result`` fails the attempt (nothing stored); a page of tasks
    carries previews of payloads and results, the task itself the whole."""
    app = await make_app(fake_clock=False, max_result=10_000, max_payload=200_000)

    @app.task("big:result", max_retry=0, retention=3600)
    async def big(payload: dict[str, Any]) -> dict[str, Any]:
        return {"blob": "r" * payload["n"]}

    small = await big.enqueue({"n": 9_000, "pad": "p" * 100_000})
    huge = await big.enqueue({"n": 20_000})
    async with app.worker(poll_interval=0.05, shutdown_timeout=5):
        await wait_for_state(app, "default", small.id, TaskState.COMPLETED)
        await wait_for_state(app, "default", huge.id, TaskState.ARCHIVED)
    refused = await app.inspector.get_task_info("default", huge.id)
    assert refused.raw_result is None
    assert "result is" in (refused.last_error or "") and "over the limit of 10000" in (
        refused.last_error or ""
    )
    (listed,) = await app.inspector.list_tasks("default", TaskState.COMPLETED)
    row = listed.summary()
    assert "payload" not in row and "result" not in row and "headers" not in row
    assert row["payload_bytes"] > 100_000 and len(row["payload_preview"]) == 200
    assert row["result_bytes"] > 9_000 and row["result_preview"].startswith('{"blob":"rrr')
    assert len(json.dumps(row)) < 2_000
    whole = (await app.inspector.get_task_info("default", small.id)).to_dict()
    assert whole["result"] == {"blob": "r" * 9_000} and len(whole["payload"]["pad"]) == 100_000


async def test_follow_up_options_are_bounded_like_the_task_itself(make_app: AppFactory) -> None:
    """A continuation or webhook delivery is created when its task finishes: an option no
    broker holds would break that outcome, so it is refused at enqueue (or install)."""
    app = await make_app()
    for then in (
        durq.Then("report:next", max_retry=10**30),
        durq.Then("report:next", retention=math.inf),
        durq.Then("report:next", timeout=1e308),
    ):
        with pytest.raises(ValidationError):
            await app.enqueue("report:build", {}, then=then)
    with pytest.raises(ConfigurationError):
        webhooks.install(app, None, max_retry=10**30)
    with pytest.raises(ConfigurationError):
        webhooks.install(app, None, retention=math.inf)
    assert sum(q.size for q in await app.inspector.list_queues()) == 0
