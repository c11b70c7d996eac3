"""Turning task rows into :class:`~durq.task.TaskInfo`, and the sans-IO enqueue plan.

The enqueue plan is a generator that yields ``(query name, params)`` and receives the rows, so
one piece of logic drives the broker's pool, a caller's async connection and a caller's sync
connection (E8) alike."""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from datetime import datetime
from typing import Any

from durq.brokers.params import EnqueueOutcome, EnqueueParams
from durq.brokers.sqlrows import headers_of, limits_of, row_to_info
from durq.clock import to_datetime
from durq.errors import DuplicateTaskError, TaskIDConflictError
from durq.states import TaskState
from durq.steps import decode_steps
from durq.task import TaskInfo, limits_to_json, make_info

Row = dict[str, Any]
#: One statement to run: a query name from ``queries.sql`` and its parameters.
Step = tuple[str, dict[str, Any]]
#: The driver sends each step's rows back; ``None`` when a unique violation refused an
#: ``enqueue_fresh`` statement (nothing of it was written).
EnqueuePlan = Generator[Step, list[Row] | None, list[EnqueueOutcome]]

# Rounds of insert -> explain refusals -> free stale rows -> insert again. Each round makes
# progress unless another client keeps taking the same id at the same moment.
_MAX_ROUNDS = 4


#: The columns ``claim`` returns, in order (see :func:`claimed_info`).
CLAIM_COLUMNS = (
    "id", "queue", "type", "payload", "max_retry", "retried", "last_error", "timeout",
    "deadline", "next_process_at", "enqueued_at", "retention", "lost", "headers",
    "lease_token", "seq", "started_at", "lease_expires_at", "priority", "limits", "steps",
)  # fmt: skip
_CLAIM_INDEXED = ("queue", "next_process_at", "lease_token", "seq", "started_at",
                  "lease_expires_at", "priority")  # fmt: skip
CLAIM_QUEUE, CLAIM_NEXT_AT, CLAIM_TOKEN, CLAIM_SEQ, CLAIM_STARTED, CLAIM_UNTIL, CLAIM_PRIORITY = (
    CLAIM_COLUMNS.index(c) for c in _CLAIM_INDEXED
)
CLAIM_LIMITS, CLAIM_ID = CLAIM_COLUMNS.index("limits"), CLAIM_COLUMNS.index("id")
CLAIM_STEPS = CLAIM_COLUMNS.index("steps")
#: ``claim`` and ``complete_claim`` add two columns (W13): whether due tasks carry limits (the
#: broker then claims them in Python), and the counters of keys with held tasks and no
#: running attempt in the way (JSON: ``[now, running, concurrency, rate, per, tokens,
#: refilled_at]`` each), for the limiter to say whether one has room or when a token comes.
CLAIM_LIMITED, CLAIM_HELD = len(CLAIM_COLUMNS), len(CLAIM_COLUMNS) + 1
#: ``complete_claim`` adds, after those two, the leases it completed (queues, ids), the queues
#: whose freed limit keys hold tasks, whether due scheduled/retry rows wait, the ids of the
#: completed tasks someone waits for, and whether a row it locked had moved (not leased).
CLAIM_DONE_QUEUES, CLAIM_DONE_IDS, CLAIM_DONE_WAKE, CLAIM_DUE, CLAIM_DONE_WATCHED, CLAIM_MOVED = (
    len(CLAIM_COLUMNS) + i for i in range(2, 8)
)


def claimed_info(
    row: tuple[Any, ...],
    started: datetime | None,
    lease_until: datetime | None,
    worker_id: str,
) -> TaskInfo:
    """A claimed row (``CLAIM_COLUMNS``, a tuple) as the active task the handler gets; the
    fields the claim itself set are passed in rather than decoded once per row."""
    (task_id, queue, type_, payload, max_retry, retried, last_error, timeout, deadline,
     next_at, enqueued_at, retention, lost, headers, _token, _seq, _started, _until,
     priority, *_) = row  # fmt: skip
    return make_info(
        id=task_id,
        queue=queue,
        type=type_,
        raw_payload=bytes(payload),
        state=TaskState.ACTIVE,
        max_retry=max_retry,
        retried=retried,
        last_error=last_error,
        timeout=timeout,
        deadline=to_datetime(deadline),
        next_process_at=to_datetime(next_at),
        enqueued_at=to_datetime(enqueued_at),
        completed_at=None,
        raw_result=None,
        retention=retention,
        lost=lost,
        headers=headers_of(headers),
        started_at=started,
        lease_expires_at=lease_until,
        worker_id=worker_id,
        cancel_requested=False,
        priority=priority,
        limits=limits_of(row[CLAIM_LIMITS]),
        steps=decode_steps(row[CLAIM_STEPS]),
    )


def _f(value: float | None) -> float | None:
    return None if value is None else float(value)


_PENDING, _SCHEDULED = TaskState.PENDING, TaskState.SCHEDULED


def _state(p: EnqueueParams, now: float) -> TaskState:
    """The state a new task starts with (``now``: this process's estimate of the broker's
    clock; a delay is always scheduled, the statement adds it to the server's clock)."""
    if p.process_in:
        return _SCHEDULED
    if p.process_at is None or float(p.process_at) <= now:
        return _PENDING
    return _SCHEDULED


def _ttl(p: EnqueueParams) -> float | None:
    return None if p.unique_key is None or p.unique_ttl is None else float(p.unique_ttl)


def _headers_json(headers: dict[str, str]) -> str:
    return json.dumps(dict(headers)) if headers else "{}"


def _column(values: list[Any]) -> list[Any] | None:
    """An ``enqueue`` column, or ``None`` when every value is NULL (unnest pads it with
    NULLs): psycopg dumps no array for options a batch does not use (7 of 16 columns in a
    plain bulk enqueue; the dumps were a tenth of its client's instructions)."""
    return None if values.count(None) == len(values) else values


def insert_params(
    items: Sequence[EnqueueParams],
    now: float,
    channel: str | None,
    states: Sequence[TaskState] | None = None,
    sql_now: float | None = None,
) -> dict[str, Any]:
    """Column arrays for the ``enqueue`` statement (one multi-row insert); ``channel``: notify
    in the same statement (``None``: the caller notifies after commit). The arrays are sent in
    binary (``%(x)b`` in the statement): dumping them as text costs several times more.
    ``states``: each item's ``_state`` when the caller has it already; ``sql_now``: the
    statement's ``now`` parameter (``None``: the server's clock)."""
    if states is None:
        states = [_state(p, now) for p in items]
    return {
        "n": len(items),
        "queues": [p.queue for p in items],
        "ids": [p.id for p in items],
        "types": [p.type for p in items],
        "payloads": [bytes(p.payload) for p in items],
        "states": [state.value for state in states],
        "max_retries": [int(p.max_retry) for p in items],
        "timeouts": _column([_f(p.timeout) for p in items]),
        "deadlines": _column([_f(p.deadline) for p in items]),
        "process_ats": _column([_f(p.process_at) for p in items]),
        "process_ins": _column([_f(p.process_in or None) for p in items]),
        "retentions": [float(p.retention) for p in items],
        "unique_keys": _column([p.unique_key for p in items]),
        "unique_ttls": _column([_ttl(p) for p in items]),
        # NULL for none: the statement stores '{}'.
        "headers": _column([json.dumps(dict(p.headers)) if p.headers else None for p in items]),
        "priorities": [int(p.priority) for p in items],
        "now": sql_now,
        "limits": _column([limits_to_json(p.limits) for p in items]),
        "channel": channel,
    }


def insert_one_params(
    p: EnqueueParams, state: TaskState, channel: str | None, sql_now: float | None = None
) -> dict[str, Any]:
    """Parameters of the ``enqueue_one`` statement (one task, plain values)."""
    return {
        "queue": p.queue,
        "id": p.id,
        "type": p.type,
        "payload": bytes(p.payload),
        "state": state.value,
        "max_retry": int(p.max_retry),
        "timeout": _f(p.timeout),
        "deadline": _f(p.deadline),
        "process_at": _f(p.process_at),
        "process_in": _f(p.process_in or None),
        "retention": float(p.retention),
        "unique_key": p.unique_key,
        "unique_ttl": _ttl(p),
        "headers": _headers_json(p.headers),
        "priority": int(p.priority),
        "now": sql_now,
        "limits": limits_to_json(p.limits),
        "channel": channel,
    }


def inserted_keys(rows: list[Row], batch: Sequence[EnqueueParams]) -> set[tuple[str, str]] | None:
    """Which items of ``batch`` the ``enqueue`` statement inserted: ``None`` means all of them
    (the statement names the inserted rows only when some were refused)."""
    row: Row = rows[0] if rows else {"n": 0}
    if row["n"] == len(batch):
        return None
    return set(zip(row.get("queues") or (), row.get("ids") or (), strict=True))


def _id_is_stale(row: Row, now: float) -> bool:
    return bool(row["state"] == TaskState.COMPLETED.value and row["expires_at"] <= now)


def _key_is_stale(row: Row, now: float) -> bool:
    if row["state"] in (TaskState.COMPLETED.value, TaskState.ARCHIVED.value):
        return True
    return row["unique_until"] is not None and row["unique_until"] <= now


def enqueue_plan(
    items: Sequence[EnqueueParams],
    now: float,
    channel: str | None,
    sql_now: float | None = None,
    *,
    alone: bool = False,
) -> EnqueuePlan:
    """Create ``items``; the database's constraints decide every refusal (E3, E4, E9).

    Round: insert everything left with ON CONFLICT DO NOTHING; for the refused items read the
    rows that hold their id or key; a holder that no longer counts (completed past retention,
    key past its ttl) is removed by a conditional statement and the item is tried again.
    ``now`` estimates the broker's clock (states, stale holders); the statements read the
    clock themselves unless ``sql_now`` (a test's clock) is given. ``alone``: the statements
    commit one by one (no caller's transaction, which a failed statement would abort), so a
    batch without unique keys first goes in with a plain insert (``enqueue_fresh``), and
    through the round above only if a conflict refused it."""
    now = float(now)
    outcomes: list[EnqueueOutcome | None] = [None] * len(items)
    todo = list(range(len(items)))
    fresh = alone and len(items) > 1 and not any(p.unique_key for p in items)
    for _ in range(_MAX_ROUNDS):
        if not todo:
            break
        batch = [items[i] for i in todo]
        states = [_state(p, now) for p in batch]
        inserted: list[Row] | None = None
        if len(batch) == 1:
            step = ("enqueue_one", insert_one_params(batch[0], states[0], channel, sql_now))
        else:
            step = ("enqueue", insert_params(batch, now, channel, states, sql_now))
            if fresh:
                fresh = False
                answer = yield ("enqueue_fresh", step[1])
                if answer is not None:  # every row went in
                    inserted = [{**answer[0], "n": len(batch)}]
        if inserted is None:
            inserted = yield step
            assert inserted is not None  # only enqueue_fresh may be refused whole
        created = inserted_keys(inserted, batch)
        # The clock the statement read: every row of it was stamped with this one value.
        stamped = float(inserted[0]["now"]) if inserted else now
        at = to_datetime(stamped)
        refused: list[int] = []
        for i, p, state in zip(todo, batch, states, strict=True):
            if created is not None:
                key = (p.queue, p.id)
                if key not in created:
                    refused.append(i)
                    continue
                # The same id twice in one batch: the first is inserted, the second refused.
                created.discard(key)
            outcomes[i] = EnqueueOutcome(p, info=p.created(state, stamped, at))
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
        assert holders is not None
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
                    "now": sql_now,
                },
            )
        if stale_keys:
            yield (
                "enqueue_drop_stale_keys",
                {"keys": [items[i].unique_key for i in stale_keys], "now": sql_now},
            )
        todo = sorted(stale_ids + stale_keys + again)
    for i in todo:
        outcomes[i] = EnqueueOutcome(
            items[i],
            error=TaskIDConflictError("the task id is being taken concurrently; try again"),
        )
    return [o if o is not None else EnqueueOutcome(items[i]) for i, o in enumerate(outcomes)]
