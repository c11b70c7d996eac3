"""Turning task rows into :class:`~durq.task.TaskInfo`, and the sans-IO enqueue plan.

The enqueue plan is a generator that yields ``(query name, params)`` and receives the rows, so
one piece of logic drives the broker's pool, a caller's async connection and a caller's sync
connection (E8) alike."""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from typing import Any

from durq.brokers.base import EnqueueOutcome, EnqueueParams
from durq.clock import to_datetime
from durq.errors import DuplicateTaskError, TaskIDConflictError
from durq.states import TaskState
from durq.task import TaskInfo

Row = dict[str, Any]
#: One statement to run: a query name from ``queries.sql`` and its parameters.
Step = tuple[str, dict[str, Any]]
EnqueuePlan = Generator[Step, list[Row], list[EnqueueOutcome]]

# Rounds of insert -> explain refusals -> free stale rows -> insert again. Each round makes
# progress unless another client keeps taking the same id at the same moment.
_MAX_ROUNDS = 4


def row_to_info(row: Row) -> TaskInfo:
    """A task row (``SELECT t.*``) as the user sees it."""
    result = row["result"]
    return TaskInfo(
        id=row["id"],
        queue=row["queue"],
        type=row["type"],
        raw_payload=bytes(row["payload"]),
        state=TaskState(row["state"]),
        max_retry=row["max_retry"],
        retried=row["retried"],
        last_error=row["last_error"],
        timeout=row["timeout"],
        deadline=to_datetime(row["deadline"]),
        next_process_at=to_datetime(row["next_process_at"]),
        enqueued_at=to_datetime(row["enqueued_at"]),
        completed_at=to_datetime(row["completed_at"]),
        raw_result=None if result is None else bytes(result),
        retention=row["retention"],
        lost=row["lost"],
        headers=dict(row["headers"] or {}),
        started_at=to_datetime(row["started_at"]),
        lease_expires_at=to_datetime(row["lease_expires_at"]),
        worker_id=row["worker_id"],
        cancel_requested=row["cancel_requested"],
    )


def _f(value: float | None) -> float | None:
    return None if value is None else float(value)


def insert_params(
    items: Sequence[EnqueueParams], now: float, channel: str | None
) -> dict[str, Any]:
    """Column arrays for the ``enqueue`` statement (one multi-row insert); ``channel``: notify
    in the same statement (``None``: the caller notifies after commit)."""
    states: list[str] = []
    next_at: list[float] = []
    for p in items:
        due = p.process_at is None or p.process_at <= now
        states.append(TaskState.PENDING.value if due else TaskState.SCHEDULED.value)
        next_at.append(float(now if p.process_at is None else p.process_at))
    return {
        "queues": [p.queue for p in items],
        "ids": [p.id for p in items],
        "types": [p.type for p in items],
        "payloads": [bytes(p.payload) for p in items],
        "states": states,
        "max_retries": [int(p.max_retry) for p in items],
        "timeouts": [_f(p.timeout) for p in items],
        "deadlines": [_f(p.deadline) for p in items],
        "next_process_ats": next_at,
        "retentions": [float(p.retention) for p in items],
        "unique_keys": [p.unique_key for p in items],
        "unique_untils": [
            None if p.unique_key is None or p.unique_ttl is None else float(now + p.unique_ttl)
            for p in items
        ],
        "headers": [json.dumps(dict(p.headers)) for p in items],
        "now": float(now),
        "channel": channel,
    }


def _id_is_stale(row: Row, now: float) -> bool:
    return bool(row["state"] == TaskState.COMPLETED.value and row["expires_at"] <= now)


def _key_is_stale(row: Row, now: float) -> bool:
    if row["state"] in (TaskState.COMPLETED.value, TaskState.ARCHIVED.value):
        return True
    return row["unique_until"] is not None and row["unique_until"] <= now


def enqueue_plan(items: Sequence[EnqueueParams], now: float, channel: str | None) -> EnqueuePlan:
    """Create ``items``; the database's constraints decide every refusal (E3, E4, E9).

    Round: insert everything left with ON CONFLICT DO NOTHING; for the refused items read the
    rows that hold their id or key; a holder that no longer counts (completed past retention,
    key past its ttl) is removed by a conditional statement and the item is tried again."""
    outcomes: list[EnqueueOutcome | None] = [None] * len(items)
    todo = list(range(len(items)))
    for _ in range(_MAX_ROUNDS):
        if not todo:
            break
        batch = [items[i] for i in todo]
        inserted = yield ("enqueue", insert_params(batch, now, channel))
        created: dict[tuple[str, str], Row] = {(r["queue"], r["id"]): r for r in inserted}
        refused: list[int] = []
        for i in todo:
            row = created.pop((items[i].queue, items[i].id), None)
            if row is not None:
                outcomes[i] = EnqueueOutcome(items[i], info=row_to_info(row))
            else:
                refused.append(i)
        if not refused:
            todo = []
            break
        holders = yield (
            "enqueue_conflicts",
            {
                "queues": [items[i].queue for i in refused],
                "ids": [items[i].id for i in refused],
                "keys": [items[i].unique_key for i in refused if items[i].unique_key],
            },
        )
        by_id = {(r["queue"], r["id"]): r for r in holders if r["via"] == "id"}
        by_key = {r["unique_key"]: r for r in holders if r["via"] == "key"}
        stale_ids: list[int] = []
        stale_keys: list[int] = []
        again: list[int] = []
        for i in refused:
            p = items[i]
            holder = by_id.get((p.queue, p.id))
            if holder is not None:
                if _id_is_stale(holder, now):
                    stale_ids.append(i)
                else:
                    outcomes[i] = EnqueueOutcome(
                        p, error=TaskIDConflictError(existing=row_to_info(holder))
                    )
                continue
            key_holder = by_key.get(p.unique_key) if p.unique_key else None
            if key_holder is not None:
                if _key_is_stale(key_holder, now):
                    stale_keys.append(i)
                else:
                    outcomes[i] = EnqueueOutcome(
                        p, error=DuplicateTaskError(existing_id=key_holder["id"])
                    )
                continue
            # The row that refused us is gone already (finished, deleted): just try again.
            again.append(i)
        if stale_ids:
            yield (
                "enqueue_drop_stale_ids",
                {
                    "queues": [items[i].queue for i in stale_ids],
                    "ids": [items[i].id for i in stale_ids],
                    "now": float(now),
                },
            )
        if stale_keys:
            yield (
                "enqueue_drop_stale_keys",
                {"keys": [items[i].unique_key for i in stale_keys], "now": float(now)},
            )
        todo = sorted(stale_ids + stale_keys + again)
    for i in todo:
        outcomes[i] = EnqueueOutcome(
            items[i],
            error=TaskIDConflictError("the task id is being taken concurrently; try again"),
        )
    return [o if o is not None else EnqueueOutcome(items[i]) for i, o in enumerate(outcomes)]
