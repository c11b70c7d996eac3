"""A row of the task table as the :class:`~durq.task.TaskInfo` users see: SQLite and
PostgreSQL store tasks in the same columns (``durq_tasks`` / ``durq.tasks``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from durq.brokers.views import FairDepth, PartitionDepth, TaskOutcome, UniqueHold, UniqueHolds
from durq.clock import to_datetime
from durq.progress import decode_logs, progress_of
from durq.states import TaskState
from durq.steps import decode_steps
from durq.task import LimitSpec, TaskInfo, limits_from_json, make_info


def headers_of(raw: Any) -> dict[str, str]:
    """The headers column: JSON text (or a decoded object); the common ``{}`` costs nothing."""
    if raw is None or raw == "{}" or raw == "":
        return {}
    return dict(json.loads(raw) if isinstance(raw, str) else raw)


class TaskRow(Protocol):
    """What both drivers' rows offer: ``sqlite3.Row`` and psycopg's dict rows."""

    def __getitem__(self, key: str, /) -> Any: ...
    def keys(self) -> Iterable[str]: ...


def row_to_info(row: TaskRow) -> TaskInfo:
    """A whole task row (``SELECT *``; a ``sqlite3.Row`` or a psycopg dict row)."""
    result, timeout = row["result"], row["timeout"]
    keys = row.keys()
    return make_info(
        id=row["id"],
        queue=row["queue"],
        type=row["type"],
        raw_payload=bytes(row["payload"]),
        state=TaskState(row["state"]),
        max_retry=row["max_retry"],
        retried=row["retried"],
        last_error=row["last_error"],
        timeout=None if timeout is None else float(timeout),
        deadline=to_datetime(row["deadline"]),
        next_process_at=to_datetime(row["next_process_at"]),
        enqueued_at=to_datetime(row["enqueued_at"]),
        completed_at=to_datetime(row["completed_at"]),
        raw_result=None if result is None else bytes(result),
        retention=float(row["retention"]),
        lost=row["lost"],
        headers=headers_of(row["headers"]),
        started_at=to_datetime(row["started_at"]),
        lease_expires_at=to_datetime(row["lease_expires_at"]),
        worker_id=row["worker_id"],
        cancel_requested=bool(row["cancel_requested"]),
        # Statements that return chosen columns leave the (possibly long) traceback out.
        traceback=row["traceback"] if "traceback" in keys else None,
        priority=row["priority"],
        limits=limits_of(row["limits"]) if "limits" in keys else (),
        held_by=row["held_by"] if "held_by" in keys else None,
        progress=(
            progress_of(row["progress"], TaskState(row["state"]), row["retried"])
            if "progress" in keys
            else None
        ),
        logs=decode_logs(row["logs"]) if "logs" in keys else (),
        steps=decode_steps(row["steps"]) if "steps" in keys else (),
        snoozes=row["snoozes"] if "snoozes" in keys else 0,
        unique_until=to_datetime(row["unique_until"]) if "unique_until" in keys else None,
    )


def row_to_outcome(row: TaskRow) -> TaskOutcome:
    """A row of ``get_outcomes`` (id, state, result, last_error, headers)."""
    result = row["result"]
    return TaskOutcome(
        id=row["id"],
        state=TaskState(row["state"]),
        raw_result=None if result is None else bytes(result),
        last_error=row["last_error"],
        headers=headers_of(row["headers"]),
    )


def limits_of(raw: Any) -> tuple[LimitSpec, ...]:
    """The limits column: JSON text (SQLite, a claim's ``::text``) or decoded ``jsonb``."""
    if raw is None:
        return ()
    return limits_from_json(raw if isinstance(raw, str) else json.dumps(raw))


def fair_depth_of(queue: str, rows: Sequence[TaskRow]) -> FairDepth:
    """The rows of the ``fair_partitions`` statement: partitions first, then the
    templates' totals (``key`` NULL)."""
    depths = [
        PartitionDepth(r["template"], r["key"] or "", int(r["pending"]), int(r["running"]),
                       int(r["partitions"]))
        for r in rows
    ]  # fmt: skip
    templates = sorted((d for d in depths if not d.key), key=lambda d: d.template)
    return FairDepth(queue, tuple(templates), tuple(d for d in depths if d.key))


def unique_holds_of(rows: Sequence[TaskRow]) -> UniqueHolds:
    """The rows of the ``list_unique`` statement (each a task with its ``held`` total)."""
    holds = tuple(UniqueHold(r["unique_key"], row_to_info(r)) for r in rows)
    return UniqueHolds(holds, int(rows[0]["held"]) if rows else 0)
