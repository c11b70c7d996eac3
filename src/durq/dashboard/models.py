"""The admin API's request and response bodies as pydantic models. The handlers return them
and FastAPI generates the OpenAPI document from them, so the document says what the
handlers do."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from durq.states import TaskState

#: Task states as the API spells them.
State = Enum("State", {s.name: s.value for s in TaskState}, type=str)  # type: ignore[misc]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(_Model):
    code: str = Field(description="A stable, machine-readable error code")
    message: str


class Error(_Model):
    """Every error answer."""

    error: ErrorDetail


class QueueSizes(_Model):
    pending: int
    scheduled: int
    active: int
    retry: int
    archived: int
    completed: int


class Queue(_Model):
    name: str
    paused: bool
    size: int
    sizes: QueueSizes
    oldest_pending_age: float = Field(description="seconds")
    processed_today: int
    failed_today: int
    processed_total: int
    failed_total: int


class QueueList(_Model):
    queues: list[Queue]


class _TaskFields(_Model):
    id: str
    queue: str
    type: str
    state: State  # type: ignore[valid-type]
    max_retry: int
    retried: int
    last_error: str | None
    timeout: float | None
    deadline: str | None = Field(json_schema_extra={"format": "date-time"})
    next_process_at: str | None = Field(json_schema_extra={"format": "date-time"})
    enqueued_at: str | None = Field(json_schema_extra={"format": "date-time"})
    completed_at: str | None = Field(json_schema_extra={"format": "date-time"})
    started_at: str | None = Field(json_schema_extra={"format": "date-time"})
    retention: float
    lost: int
    worker_id: str | None
    cancel_requested: bool = Field(description="An active task asked to cancel")


class Task(_TaskFields):
    """One task with everything it holds."""

    payload: dict[str, Any]
    result: Any = Field(description="The handler's result while the task is retained")
    traceback: str | None = Field(
        default=None, description="The last failed attempt's traceback, with its chain"
    )
    headers: dict[str, str]


class TaskSummary(_TaskFields):
    """A task in a list: previews of the payload and result, not the whole."""

    payload_bytes: int
    payload_preview: str | None
    result_bytes: int
    result_preview: str | None
    header_count: int


class TaskPage(_Model):
    queue: str
    state: State  # type: ignore[valid-type]
    page: int
    page_size: int
    total: int
    tasks: list[TaskSummary]


class BulkResult(_Model):
    queue: str
    state: State  # type: ignore[valid-type]
    count: int


class Worker(_Model):
    id: str
    host: str
    pid: int
    queues: dict[str, int]
    concurrency: int
    active: int
    strict: bool
    started_at: str | None = Field(json_schema_extra={"format": "date-time"})
    last_heartbeat: str | None = Field(json_schema_extra={"format": "date-time"})


class WorkerList(_Model):
    workers: list[Worker]


class HistoryPoint(_Model):
    t: float
    processed: float
    failed: float


class History(_Model):
    queue: str | None
    interval: float
    window: float
    unit: str
    points: list[HistoryPoint]
