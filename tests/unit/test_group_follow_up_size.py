"""The follow-up of a group of the maximum size runs: its payload carries every member's
entry, a share of the payload limit each (at least 256 bytes) and the member's names, so
it can be larger than ``max_payload``; the worker decodes it up to ``groups.payload_limit``."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import durq
from durq import EnqueueRequest, groups, lifecycle, names
from durq.brokers.base import ClaimParams
from durq.states import TaskState


async def test_the_follow_up_of_the_largest_group_with_the_longest_names_runs() -> None:
    app = durq.App(f"memory://{uuid.uuid4().hex}")
    queue = "q" * names.NAME_MAX
    member_type = "t" * names.NAME_MAX
    runs: list[dict[str, Any]] = []

    @app.task("m:merge", queue=queue)
    async def merge(payload: dict[str, Any]) -> None:
        runs.append(payload)

    size = groups.MAX_MEMBERS
    ids = [f"{i:06d}".ljust(names.TASK_ID_MAX, "x") for i in range(size)]
    try:
        broker = await app.broker()
        group = await app.enqueue_group(
            [EnqueueRequest(member_type, {}, queue=queue, task_id=i) for i in ids],
            then=durq.Then("m:merge", queue=queue),
        )
        # Results of 200 bytes: within a member's share (256 bytes) when the names are
        # short, left out here (the names alone take more).
        result = json.dumps("r" * 198).encode()
        now = broker.clock.now()
        done = 0
        while done < size:
            leases = await broker.claim(ClaimParams([queue], 1000, "w", 600))
            assert leases
            await broker.complete_many([lifecycle.completed(x, result, now=now) for x in leases])
            done += len(leases)
        follow = await app.inspector.get_task_info(queue, f"group:{group.id}")
        assert (
            app.max_payload
            < len(follow.raw_payload)
            <= groups.payload_limit(follow, app.max_payload)
        )
        async with app.worker(queues=[queue], poll_interval=0.1):
            for _ in range(300):
                follow = await app.inspector.get_task_info(queue, f"group:{group.id}")
                if follow.state in (TaskState.COMPLETED, TaskState.ARCHIVED):
                    break
                await asyncio.sleep(0.05)
        assert follow.state is TaskState.COMPLETED, follow.last_error
        (payload,) = runs
        assert [m["id"] for m in payload["members"]] == ids
        assert payload["members"][0]["omitted"] == ["result"]
    finally:
        await app.close()


def test_only_a_group_follow_up_gets_a_larger_limit() -> None:
    def info(headers: dict[str, str]) -> durq.TaskInfo:
        return durq.TaskInfo(
            id="x",
            queue="default",
            type="t",
            raw_payload=b"{}",
            state=TaskState.ACTIVE,
            max_retry=0,
            headers=headers,
        )

    spec = json.dumps({"id": "g", "queue": "default", "size": 10})
    assert groups.payload_limit(info({}), 1000) == 1000
    assert groups.payload_limit(info({groups.HEADER: spec}), 1000) == 1000
    ten = groups.payload_limit(info({groups.FOLLOWS_HEADER: spec}), 1000)
    assert 1000 + 10 * 486 <= ten < 1000 + 10 * 600
    # A forged size counts as the maximum at most.
    huge = json.dumps({"id": "g", "queue": "default", "size": 10**9})
    assert groups.payload_limit(info({groups.FOLLOWS_HEADER: huge}), 1000) < 10_000_000
