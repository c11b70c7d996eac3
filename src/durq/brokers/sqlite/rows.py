"""Decoding ``durq_tasks`` rows into :class:`~durq.task.TaskInfo`."""

from __future__ import annotations

import json
import sqlite3

from durq.clock import to_datetime
from durq.states import TaskState
from durq.task import TaskInfo


def row_to_info(row: sqlite3.Row) -> TaskInfo:
    """A ``durq_tasks`` row as the :class:`TaskInfo` users see."""
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
        timeout=None if row["timeout"] is None else float(row["timeout"]),
        deadline=to_datetime(row["deadline"]),
        next_process_at=to_datetime(row["next_process_at"]),
        enqueued_at=to_datetime(row["enqueued_at"]),
        completed_at=to_datetime(row["completed_at"]),
        raw_result=None if result is None else bytes(result),
        retention=float(row["retention"]),
        lost=row["lost"],
        headers=json.loads(row["headers"] or "{}"),
        started_at=to_datetime(row["started_at"]),
        lease_expires_at=to_datetime(row["lease_expires_at"]),
        worker_id=row["worker_id"],
        cancel_requested=bool(row["cancel_requested"]),
        traceback=row["traceback"] if "traceback" in row.keys() else None,
    )
