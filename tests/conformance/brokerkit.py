"""Helpers of the broker-level conformance tests: build tasks in given states through the
Broker protocol only, and read the whole ``{state: [ids]}`` picture through Admin."""

from __future__ import annotations

import json
from typing import Any

from durq.brokers import FullBroker
from durq.brokers.base import (
    ArchiveParams,
    ClaimParams,
    CompleteParams,
    EnqueueParams,
    Lease,
    RetryParams,
)
from durq.clock import FakeClock
from durq.states import TaskState

Q = "default"
TYPE = "test:task"
LEASE = 30.0
#: Far enough ahead that nothing waiting becomes due during a test.
LATER = 3600.0

P = TaskState.PENDING
S = TaskState.SCHEDULED
A = TaskState.ACTIVE
R = TaskState.RETRY
X = TaskState.ARCHIVED
C = TaskState.COMPLETED
W = TaskState.WAITING


def params(task_id: str, queue: str = Q, *, payload: Any = None, **options: Any) -> EnqueueParams:
    """An EnqueueParams with test defaults; ``payload`` is a dict, encoded here."""
    raw = json.dumps(payload if payload is not None else {"id": task_id}).encode()
    return EnqueueParams(
        id=task_id, queue=queue, type=options.pop("type", TYPE), payload=raw, **options
    )


async def claim(
    broker: FullBroker,
    queues: str | list[str] = Q,
    limit: int = 10,
    *,
    worker: str = "w1",
    lease: float = LEASE,
) -> list[Lease]:
    """Promote due tasks (forwarding backends need it), then claim."""
    await broker.promote_due()
    return await broker.claim(
        ClaimParams(
            queues=[queues] if isinstance(queues, str) else queues,
            limit=limit,
            worker_id=worker,
            lease_seconds=lease,
        )
    )


async def claim_ids(broker: FullBroker, queues: str | list[str] = Q, limit: int = 10) -> list[str]:
    return [lease.task.id for lease in await claim(broker, queues, limit)]


async def put(
    broker: FullBroker,
    clock: FakeClock,
    states: dict[str, TaskState],
    queue: str = Q,
    *,
    retention: float = LATER,
    **options: Any,
) -> dict[str, Lease]:
    """Create one task per ``id: state`` in ``queue``; returns the leases of active ones.

    Tasks that need a claim are made first, each claimed right after its enqueue while
    nothing else is claimable; retry tasks wait ``LATER`` s; completed ones are retained."""
    leases: dict[str, Lease] = {}
    need_claim = [i for i, s in states.items() if s not in (P, S)]
    waiting = [i for i, s in states.items() if s in (P, S)]
    for task_id in need_claim:
        state = TaskState(states[task_id])
        await broker.enqueue(params(task_id, queue, **options))
        got = await claim(broker, queue, 1)
        assert [lease.task.id for lease in got] == [task_id], got
        lease = got[0]
        if state is A:
            leases[task_id] = lease
        elif state is R:
            assert await broker.retry(RetryParams(lease.ref, "boom", LATER))
        elif state is X:
            assert await broker.archive(ArchiveParams(lease.ref, "boom"))
        elif state is C:
            assert await broker.complete(CompleteParams(lease.ref, b'"ok"', retention))
        else:  # pragma: no cover
            raise AssertionError(state)
    for task_id in waiting:
        at = clock.now() + LATER if states[task_id] is S else None
        await broker.enqueue(params(task_id, queue, process_at=at, **options))
    return leases


async def snapshot(broker: FullBroker, queue: str = Q) -> dict[TaskState, list[str]]:
    """Every task of ``queue`` as ``{state: sorted ids}``, empty states left out."""
    picture: dict[TaskState, list[str]] = {}
    for state in TaskState:
        ids: list[str] = []
        offset = 0
        while True:
            page = await broker.admin.list_tasks(queue, state, limit=100, offset=offset)
            ids.extend(task.id for task in page)
            if len(page) < 100:
                break
            offset += 100
        if ids:
            picture[state] = sorted(ids)
    return picture


def picture(**groups: str) -> dict[TaskState, list[str]]:
    """``picture(pending="a b", archived="c")`` -> ``{PENDING: ["a", "b"], ARCHIVED: ["c"]}``."""
    return {TaskState(k): sorted(v.split()) for k, v in groups.items() if v.split()}
