"""The admin API's request and response bodies as pydantic models. The handlers return them
and FastAPI generates the OpenAPI document from them, so the document says what the
handlers do."""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from durq.lifecycle import SELECTION_MAX
from durq.names import NAME_MAX, NAME_PATTERN, TASK_ID_MAX, TASK_ID_PATTERN
from durq.states import TaskState

#: Task states as the API spells them.
State = Enum("State", {s.name: s.value for s in TaskState}, type=str)  # type: ignore[misc]


Overlap = Literal["allow", "skip", "buffer_one", "cancel_other"]
Source = Literal["code", "stored"]
ScheduleState = Literal["active", "paused"]
#: Task types, queue and schedule names.
TypeName = Annotated[
    str, StringConstraints(pattern=NAME_PATTERN, min_length=1, max_length=NAME_MAX)
]


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
    waiting: int = Field(
        0, description="waiting for other tasks to finish (after=) or for a signal"
    )


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
    unique_keys: int = Field(0, description="unique keys its unfinished tasks hold now")


class QueueList(_Model):
    queues: list[Queue]


class ScalingQueue(_Model):
    """One queue's figures for an autoscaler."""

    pending: int = Field(description="Tasks ready to run now")
    active: int = Field(description="Tasks running now")
    scheduled: int
    retry: int
    oldest_pending_seconds: float = Field(
        description="Seconds since the oldest pending task became ready (0 when none)"
    )
    paused: bool


class Scaling(_Model):
    """Every queue's figures for an autoscaler (KEDA's metrics-api scaler reads one with
    ``valueLocation: queues.<queue>.oldest_pending_seconds``)."""

    queues: dict[str, ScalingQueue]
    pending: int = Field(description="Pending tasks of all queues")
    oldest_pending_seconds: float = Field(description="The largest of the queues'")
    age: float = Field(description="Seconds since these figures were read from the broker")


class TaskLimit(_Model):
    """One flow-control limit a task counts against."""

    key: str
    concurrency: int | None
    rate: int | None = Field(description="Starts allowed per `per` seconds")
    per: float | None


class TaskProgress(_Model):
    """The latest progress a task's handler reported (``ctx.progress``)."""

    attempt: int = Field(description="The attempt that reported it (1 for the first)")
    fraction: float = Field(ge=0, le=1, description="Done so far, from 0 to 1")
    message: str | None
    at: str | None = Field(json_schema_extra={"format": "date-time"})


class TaskLogLine(_Model):
    """One line a task's handler logged (``ctx.log``)."""

    attempt: int
    at: str | None = Field(json_schema_extra={"format": "date-time"})
    level: str = Field(description="debug, info, warning or error")
    message: str


class TaskStep(_Model):
    """One durable step a task's handler recorded (``ctx.step``)."""

    name: str
    result: Any = Field(description="The step's stored JSON result")
    started: str | None = Field(json_schema_extra={"format": "date-time"})
    ended: str | None = Field(json_schema_extra={"format": "date-time"})
    duration: float = Field(description="Seconds the step ran")
    attempt: int = Field(description="The attempt that ran it (1 for the first)")
    sleep_until: str | None = Field(
        default=None,
        description="A durable sleep (ctx.sleep): when it ends; null for a step",
        json_schema_extra={"format": "date-time"},
    )


class _TaskFields(_Model):
    id: str
    queue: str
    type: str
    state: State  # type: ignore[valid-type]
    priority: int = Field(
        ge=-100, le=100, description="Higher is claimed first within the queue (default 0)"
    )
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
    limits: list[TaskLimit] = Field(default_factory=list)
    held_by: str | None = Field(
        default=None, description="The limit key a pending task waits on (no room when looked at)"
    )
    progress: TaskProgress | None = Field(
        default=None,
        description="The latest progress reported; a running attempt that has not reported "
        "yet shows none",
    )
    snoozes: int = Field(default=0, description="How often its handler snoozed it")
    unique_until: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="Until when it holds its unique key (twins refused), or until it "
        "finishes; a key held until it finishes shows about a century ahead",
    )


class GroupRef(_Model):
    """The group a task belongs to (``GET /api/queues/{queue}/groups/{id}``)."""

    id: str
    queue: str


class Task(_TaskFields):
    """One task with everything it holds."""

    payload: dict[str, Any] | str = Field(
        description='The payload, or "encrypted" when it is stored encrypted'
    )
    result: Any = Field(
        description='The handler\'s result while the task is retained ("encrypted" when '
        "it is stored encrypted)"
    )
    traceback: str | None = Field(
        default=None, description="The last failed attempt's traceback, with its chain"
    )
    headers: dict[str, str]
    logs: list[TaskLogLine] = Field(
        default_factory=list,
        description="The handler's last 50 log lines over all attempts, oldest first",
    )
    steps: list[TaskStep] = Field(
        default_factory=list,
        description="The durable steps its handler recorded, in the order first recorded",
    )
    group: GroupRef | None = Field(
        default=None, description="The group of a task enqueued with enqueue_group"
    )


class GroupMember(_Model):
    id: str
    queue: str
    type: str
    state: str | None = Field(
        description="completed, archived or deleted once finished; else the task's state "
        "(null when it is gone)"
    )
    finished: bool


class Group(_Model):
    """A group's progress: its members by state, and its fan-in follow-up."""

    id: str
    queue: str
    total: int
    finished: int
    by_state: dict[str, int]
    created_at: float = Field(description="Epoch seconds")
    finished_at: float | None = Field(description="When the last member finished")
    then_id: str | None = Field(description="The follow-up's task id, null for none")
    then_queue: str | None
    members: list[GroupMember]


class WorkflowNode(_Model):
    name: str
    type: str
    queue: str
    task_id: str
    on_failure: str = Field(description="cancel, skip or continue")
    after: list[str] = Field(description="The names of the nodes it runs after")
    state: str = Field(description="Its task's state, or gone (deleted, or past retention)")
    attempts: int = Field(description="Finished attempts (failed ones, and a success)")
    last_error: str | None


class WorkflowSummary(_Model):
    """A workflow's progress: its state and its nodes by state."""

    id: str
    name: str
    created_at: float = Field(description="Epoch seconds")
    state: str = Field(description="running, succeeded, failed or cancelled")
    total: int
    finished: int
    by_state: dict[str, int]


class Workflow(WorkflowSummary):
    """A workflow's progress and each node, in the order they were created."""

    nodes: list[WorkflowNode]


class WorkflowList(_Model):
    workflows: list[WorkflowSummary] = Field(description="Newest first")
    cursor: str | None = Field(description="Pass as cursor= for the next page; null: last")


class WorkflowCancelled(_Model):
    id: str
    cancelled: int = Field(description="Nodes cancelled (running ones by their workers)")


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
    total: int = Field(description="Tasks of the state, or those that match the filters")
    tasks: list[TaskSummary]
    complete: bool = Field(
        default=True,
        description="False when the broker read only the first `scanned` tasks of the state "
        "to filter them (Redis): more may match",
    )
    scanned: int | None = Field(default=None, description="Tasks read to filter (Redis)")


class SignalResult(_Model):
    queue: str
    id: str
    name: str
    delivered: bool = Field(
        description="True: delivered now (a task waiting for it can run at once); false: a "
        "signal of this name was delivered before, and nothing changed"
    )


class BulkResult(_Model):
    queue: str
    state: State  # type: ignore[valid-type]
    count: int


#: Task ids as a request body names them.
TaskIdText = Annotated[
    str, StringConstraints(pattern=TASK_ID_PATTERN, min_length=1, max_length=TASK_ID_MAX)
]


class SelectionAction(StrEnum):
    run = "run"
    archive = "archive"
    delete = "delete"
    cancel = "cancel"


class Selection(_Model):
    """An action on tasks picked by id."""

    action: SelectionAction
    ids: list[TaskIdText] = Field(min_length=1, max_length=SELECTION_MAX)


class SelectionItem(_Model):
    id: str
    ok: bool
    state: State | None = Field(  # type: ignore[valid-type]
        description="The state after the action; null when deleted or refused"
    )
    error: ErrorDetail | None


class SelectionResult(_Model):
    queue: str
    action: SelectionAction
    done: int
    failed: int
    results: list[SelectionItem]


class PeriodicEntry(_Model):
    """One schedule of the app the dashboard serves, with its next runs and last tick."""

    name: str
    schedule: str = Field(description="A cron expression or @every <duration>")
    tz: str
    type: str
    queue: str = Field(description="The queue its ticks go to")
    paused: bool = Field(description="That queue is paused: ticks are enqueued, not run")
    payload: dict[str, Any]
    missed: str
    tolerance: float
    retention: float
    next_run: str = Field(json_schema_extra={"format": "date-time"})
    next_runs: list[str]
    last_tick: str | None = Field(json_schema_extra={"format": "date-time"})
    last_task_id: str | None
    last_enqueued_at: str | None = Field(json_schema_extra={"format": "date-time"})
    last_state: State | None  # type: ignore[valid-type]
    overlap: Overlap = Field(description="What a tick does while the previous run is unfinished")
    source: Source = Field(
        description="code: declared in the app (read-only); stored: kept in "
        "the broker, editable here"
    )
    state: ScheduleState = Field(description="paused: the schedule does not tick")
    version: int = Field(description="The stored record's version (0 for code entries)")
    updated_at: str | None = Field(json_schema_extra={"format": "date-time"})


class PeriodicList(_Model):
    entries: list[PeriodicEntry]


class ScheduleFields(_Model):
    """The fields of a stored schedule an operator may set (all optional in an edit)."""

    schedule: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="A cron expression or @every <duration>",
        examples=["*/5 * * * *"],
    )
    type: TypeName | None = Field(None, description="The task type each tick enqueues")
    payload: dict[str, Any] | None = None
    queue: TypeName | None = Field(None, description="[default: the task type's queue]")
    tz: str | None = Field(
        None, min_length=1, max_length=64, description="IANA time zone [default: UTC]"
    )
    overlap: Overlap | None = None


class NewSchedule(ScheduleFields):
    """A stored schedule to create."""

    name: TypeName = Field(description="Its name: part of every tick's task id")
    schedule: str = Field(  # type: ignore[assignment]
        min_length=1, max_length=200, description="A cron expression or @every <duration>"
    )
    type: TypeName = Field(description="The task type each tick enqueues")  # type: ignore[assignment]
    paused: bool = False


class Schedule(_Model):
    """One schedule (code or stored) as stored or declared."""

    name: str
    schedule: str
    tz: str
    type: str
    queue: str | None = Field(description="null: the task type's queue")
    payload: dict[str, Any]
    missed: str
    tolerance: float
    retention: float
    overlap: Overlap
    source: Source
    state: ScheduleState
    version: int
    updated_at: str | None = Field(json_schema_extra={"format": "date-time"})


class BackfillRequest(_Model):
    start: str = Field(description="First instant, ISO 8601 (no offset: UTC)")
    end: str = Field(description="Last instant, included")
    dry_run: bool = Field(False, description="List the ticks; enqueue nothing")


class BackfillResult(_Model):
    name: str
    dry_run: bool
    ticks: list[str] = Field(description="Every tick of the range, oldest first")
    enqueued: list[str] = Field(description="Task ids created")
    existing: list[str] = Field(description="Task ids that existed already (left alone)")


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


class LimitOverride(_Model):
    """An operator's override of a key's limit: a part that is null keeps the tasks' own."""

    concurrency: int | None = Field(description="At most this many at once; 0 starts none")
    rate: int | None = Field(description="At most this many starts per `per` seconds")
    per: float | None


class Limit(_Model):
    """One flow-control key of a queue."""

    queue: str
    key: str
    running: int = Field(description="Attempts of the key running now")
    concurrency: int | None = Field(description="At most this many at once")
    rate: int | None = Field(description="At most this many starts per `per` seconds")
    per: float | None
    tokens: float | None = Field(description="Starts the rate allows right now")
    waiting: int = Field(description="Pending tasks held back on this key")
    override: LimitOverride | None = Field(
        description="An operator's override, winning over the tasks' own limit until reset "
        "(`concurrency`, `rate` and `per` above are the limit the last task carried)"
    )


class LimitOverrideRequest(_Model):
    """The override to set on a key; at least one part (each call replaces the last)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"minProperties": 1})

    concurrency: int | None = Field(
        None, ge=0, le=10**6, description="At most this many at once; 0 starts none for now"
    )
    rate: str | None = Field(
        None,
        min_length=1,
        max_length=40,
        description="At most this many starts per period",
        examples=["10/s"],
    )


class LimitList(_Model):
    limits: list[Limit]


class Partition(_Model):
    """A partition of a fair limit (its resolved key), a whole template (``key`` empty) or
    the partitions not listed (both empty)."""

    template: str
    key: str
    pending: int = Field(description="Tasks waiting (pending, held back ones too)")
    running: int = Field(description="Tasks running (active)")
    partitions: int = Field(description="Partitions counted (1 for one partition)")


class Partitions(_Model):
    """The fair limits of one queue: each template, the busiest partitions, the rest."""

    queue: str
    templates: list[Partition]
    top: list[Partition] = Field(description="Most tasks (pending + running) first")
    others: Partition = Field(description="The partitions not in `top`, summed")


class UniqueKey(_Model):
    """A unique key held now and its task."""

    key: str
    task_id: str
    type: str
    state: str
    due: str | None = Field(description="When the task is due (ISO 8601)")
    until: str | None = Field(
        description="Until when it holds the key at the latest; null: until it finishes"
    )
    debounced: bool = Field(description="Enqueued with durq.Debounce")
    wait: float | None = Field(description="Debounce wait, seconds")
    max_wait: float | None = Field(description="Debounce max_wait, seconds")
    latest: str | None = Field(description="When a debounced task runs at the latest")


class UniqueKeyList(_Model):
    queue: str
    entries: list[UniqueKey] = Field(description="Soonest due first")
    total: int = Field(description="Keys held in all")
    complete: bool = Field(description="False: the broker read only some of them (Redis)")


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
