"""The hot paths build TaskInfo without reading it back: what they build must equal the row."""

from __future__ import annotations

import json
import re

from durq.brokers.base import ClaimParams, EnqueueParams
from durq.brokers.postgres import PostgresBroker
from durq.brokers.postgres.rows import CLAIM_COLUMNS
from durq.brokers.postgres.storage import QUERIES
from durq.clock import FakeClock
from durq.states import TaskState


def task(task_id: str, **options: object) -> EnqueueParams:
    return EnqueueParams(
        id=task_id,
        queue="default",
        type="rows:check",
        payload=json.dumps({"id": task_id}).encode(),
        **options,  # type: ignore[arg-type]
    )


def test_claim_returns_the_columns_claimed_info_reads() -> None:
    text = QUERIES["claimed_columns"]
    columns = [re.sub(r"::\w+$", "", c.strip()).removeprefix("t.") for c in text.split(",")]
    assert tuple(columns) == CLAIM_COLUMNS
    for name in ("claim_work", "claim_limited"):
        assert "RETURNING {claimed_columns}" in QUERIES[name]


async def test_enqueue_answers_what_the_row_holds(pg: PostgresBroker, clock: FakeClock) -> None:
    now = clock.now()
    one = await pg.enqueue(
        task("one", timeout=30.0, deadline=now + 600, retention=60.0, headers={"tp": "x"})
    )
    later = await pg.enqueue(task("later", process_at=now + 50, max_retry=2))
    many = await pg.enqueue_many(
        [task("m1"), task("m2", unique_key="k", unique_ttl=30.0), task("m1")]
    )
    assert [o.created for o in many] == [True, True, False]
    for info in [one, later, many[0].info, many[1].info]:
        assert info is not None
        assert info == await pg.get_task("default", info.id)
    assert later.state is TaskState.SCHEDULED


async def test_claim_answers_what_the_row_holds(pg: PostgresBroker) -> None:
    await pg.enqueue_many([task(f"c{i}", headers={"n": str(i)} if i % 2 else {}) for i in range(5)])
    leases = await pg.claim(ClaimParams(["default"], 10, "w1", 30.0))
    assert [lease.task.id for lease in leases] == [f"c{i}" for i in range(5)]
    for lease in leases:
        assert lease.task == await pg.get_task("default", lease.task.id)
        assert lease.task.state is TaskState.ACTIVE and lease.task.worker_id == "w1"
