"""The admin HTTP API: JSON over the inspector.

Each endpoint is a FastAPI route with typed parameters and a pydantic response model
(:mod:`.models`); the OpenAPI document is generated from these routes, so it cannot drift
from what the handlers accept and answer. The routes run inside the dashboard's Starlette app
(behind its authentication and CSRF guard)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Body, Path, Query
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import StringConstraints
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from durq import groups, periodic
from durq.brokers.views import (
    PARTITIONS_TOP_MAX,
    PAYLOAD_FIELD,
    UNIQUE_PAGE_MAX,
    WORKFLOW_PAGE_MAX,
    QueueStats,
    TaskFilter,
    TaskSearchResult,
    WorkerInfo,
)
from durq.dashboard import models
from durq.durations import MAX_DURATION
from durq.errors import TaskNotFoundError, ValidationError
from durq.inspector import SEARCH_FIELDS_MAX, SEARCH_TEXT_MAX, parse_state, task_filter
from durq.lifecycle import SelectionOutcome
from durq.limits import MAX_KEY
from durq.names import (
    GROUP_ID_PATTERN,
    NAME_MAX,
    NAME_PATTERN,
    TASK_ID_MAX,
    TASK_ID_PATTERN,
    WORKFLOW_ID_MAX,
    WORKFLOW_ID_PATTERN,
)
from durq.observability.snapshot import Snapshot
from durq.schedules import MAX_BACKFILL
from durq.states import TaskState

if TYPE_CHECKING:
    from durq.appview import AdminView
    from durq.dashboard.app import Dashboard
    from durq.inspector import Inspector

DEFAULT_PAGE_SIZE = 20
#: Seconds ``/api/scaling`` serves one read of the queues: autoscalers poll it often.
SCALING_TTL = 5.0
MAX_PAGE_SIZE = 200
MAX_PAGE = 100_000
#: Task actions: ``POST .../tasks/{id}/<action>``.
ACTIONS = ("run", "archive", "cancel")

QueueName = Annotated[
    str,
    Path(
        pattern=NAME_PATTERN,
        min_length=1,
        max_length=NAME_MAX,
        description="A queue",
        examples=["default"],
    ),
]
# In a path an id is one segment: the document leaves "/" out (such ids work unescaped,
# except ids ending in /run, /archive or /cancel, which name the actions).
TaskId = Annotated[
    str,
    Path(
        description="A task id",
        examples=["t0"],
        json_schema_extra={
            "pattern": TASK_ID_PATTERN.replace("/", ""),
            "minLength": 1,
            "maxLength": TASK_ID_MAX,
        },
    ),
]
SignalName = Annotated[
    str,
    Path(
        pattern=r"^[A-Za-z0-9_.:-]{1,100}$",
        description="A signal's name",
        examples=["partner-callback"],
    ),
]
LimitKey = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_KEY,
        description="A limit key as tasks resolve it, URL-escaped",
        examples=["partner:acme"],
    ),
]
OptionalState = Annotated[
    models.State | None,  # type: ignore[valid-type]
    Query(description="Task state [default: pending]"),
]
GroupId = Annotated[
    str,
    Path(
        pattern=GROUP_ID_PATTERN,
        min_length=1,
        max_length=NAME_MAX,
        description="A group id (durq.Group.id)",
    ),
]
WorkflowId = Annotated[
    str,
    Path(
        pattern=WORKFLOW_ID_PATTERN,
        min_length=1,
        max_length=WORKFLOW_ID_MAX,
        description="A workflow id (durq.WorkflowInfo.id)",
    ),
]
#: A listing's cursor, as :func:`durq.brokers.views.workflow_cursor` spells it.
CURSOR_PATTERN = (
    r"^[0-9]{13}\.[0-9]{6}:"
    + WORKFLOW_ID_PATTERN.removeprefix("^").removesuffix("+$")
    + f"{{1,{WORKFLOW_ID_MAX}}}$"
)
WorkflowStateFilter = Annotated[
    Literal["running", "succeeded", "failed", "cancelled"] | None,
    Query(description="Only workflows in this state"),
]
Age = Annotated[
    float | None,
    Query(ge=0, le=MAX_DURATION, description="Seconds"),
]
ScheduleName = Annotated[
    str,
    Path(
        pattern=NAME_PATTERN,
        min_length=1,
        max_length=NAME_MAX,
        description="A schedule's name",
        examples=["report:eu"],
    ),
]
RequiredState = Annotated[models.State, Query(description="Task state")]  # type: ignore[valid-type]
Page = Annotated[int, Query(ge=1, le=MAX_PAGE)]
PageSize = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)]
TypeFilter = Annotated[
    str | None,
    Query(
        pattern=NAME_PATTERN,
        max_length=NAME_MAX,
        description="Only tasks of this type",
        examples=["email:send"],
    ),
]
QueueFilter = Annotated[
    str | None,
    Query(
        pattern=NAME_PATTERN,
        min_length=1,
        max_length=NAME_MAX,
        description="Only the keys of this queue",
        examples=["default"],
    ),
]
ErrorFilter = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=SEARCH_TEXT_MAX,
        description="Only tasks whose last error contains this text (ASCII case-insensitive)",
    ),
]
PAYLOAD_PAIR = PAYLOAD_FIELD.pattern.removesuffix("$") + f"=.{{0,{SEARCH_TEXT_MAX}}}$"
PayloadFilter = Annotated[
    list[Annotated[str, StringConstraints(pattern=PAYLOAD_PAIR)]] | None,
    Query(
        max_length=SEARCH_FIELDS_MAX,
        description="Only tasks whose payload has this value at this field: `field=value`, "
        "repeatable, dotted paths for nested objects (`customer.id=7`); also written "
        "`payload.<field>=<value>`. A string matches its text, a boolean `true`/`false`, a "
        "number any JSON number of the same double (`7` finds `7.0`). No control characters.",
        examples=[["partner=acme"]],
    ),
]
#: Query parameters of the task list; anything else (but ``payload.<field>``) is refused.
TASK_LIST_PARAMS = frozenset({"state", "page", "page_size", "type", "error", "payload"})


def iso(ts: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC (``None`` for 0 / missing)."""
    return datetime.fromtimestamp(ts, UTC).isoformat() if ts else None


def queue_json(stats: QueueStats) -> dict[str, Any]:
    return stats.to_dict()


def scaling_json(stats: QueueStats) -> dict[str, Any]:
    sizes = stats.sizes
    return {
        "pending": sizes.get(TaskState.PENDING, 0),
        "active": sizes.get(TaskState.ACTIVE, 0),
        "scheduled": sizes.get(TaskState.SCHEDULED, 0),
        "retry": sizes.get(TaskState.RETRY, 0),
        "oldest_pending_seconds": stats.oldest_pending_age,
        "paused": stats.paused,
    }


def worker_json(info: WorkerInfo) -> dict[str, Any]:
    data = dataclasses.asdict(info)
    data["started_at"] = iso(info.started_at)
    data["last_heartbeat"] = iso(info.last_heartbeat)
    return data


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError(f"{name} must be an integer") from None
    if not low <= value <= high:
        raise ValidationError(f"{name} must be between {low} and {high}")
    return value


def paging(request: Request) -> tuple[int, int]:
    """``(page, page_size)`` from the query string, validated (for the HTML pages)."""
    page = _int_param(request, "page", 1, 1, MAX_PAGE)
    size = _int_param(request, "page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    return page, size


def filter_from_query(query: QueryParams, known: frozenset[str]) -> TaskFilter:
    """The task filter of a query string (``type``, ``error``, ``payload=field=value`` or
    ``payload.field=value``); ValidationError for a malformed one or any parameter not in
    ``known``, so a misspelt filter is an error rather than a list that ignores it."""
    unknown = sorted({k for k in query if k not in known and not k.startswith("payload.")})
    if unknown:
        raise ValidationError(
            f"unknown query parameter(s) {', '.join(map(repr, unknown))}: filter with type, "
            "error and payload.<field>=<value>"
        )
    pairs: list[tuple[str, str]] = []
    for key, value in query.multi_items():
        if key.startswith("payload."):
            pairs.append((key.removeprefix("payload."), value))
        elif key == "payload" and value:
            field, equals, text = value.partition("=")
            if not equals:
                raise ValidationError(f"payload filter {value[:80]!r} must be field=value")
            pairs.append((field.strip(), text))
    return task_filter(
        type=query.get("type") or None, error=query.get("error") or None, payload=pairs
    )


def _error(description: str) -> dict[str, Any]:
    return {"model": models.Error, "description": description}


COMMON: dict[int | str, dict[str, Any]] = {
    400: _error("Invalid name, state or paging parameter"),
    401: _error("Missing or wrong bearer token"),
    429: _error("Too many failed authentications from this client"),
    503: _error("The broker cannot be reached"),
}
NOT_FOUND = {404: _error("Unknown queue or task")}
LIMIT_NOT_FOUND = {404: _error("No override on that key")}
WORKFLOW_NOT_FOUND = {404: _error("Unknown workflow")}
MUTATION = {**COMMON, 403: _error("Read-only mode, or CSRF check failed (cookie sessions)")}
CONFLICT = {409: _error("The task's state does not allow this")}
SCHEDULE_CONFLICT = {
    409: _error("The name is taken, declared in code (read-only), or changed meanwhile")
}


class AdminAPI:
    """Endpoints of ``/api``; every failure becomes a JSON error in :mod:`.app`."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash
        self.inspector = dash.app.inspector
        self.scaling_figures = Snapshot(self.inspector.list_queues, ttl=SCALING_TTL)
        self._routes: list[APIRoute] | None = None
        self._document: dict[str, Any] | None = None

    # -- the routes and their document ------------------------------------------------------

    def routes(self) -> list[APIRoute]:
        """The API's routes (documented ones; the document itself is served too)."""
        if self._routes is None:
            self._routes = self._build_routes()
        return [*self._routes, APIRoute("/api/openapi.json", self.openapi, methods=["GET"])]

    def _build_routes(self) -> list[APIRoute]:
        q = "/api/queues/{queue}"
        t = q + "/tasks/{task_id:path}"
        sch = "/api/schedules/{name}"

        def route(path: str, endpoint: Any, method: str, summary: str, **kw: Any) -> APIRoute:
            return APIRoute(
                path,
                endpoint,
                methods=[method],
                summary=summary,
                response_model_exclude_unset=False,
                **kw,
            )

        routes = [
            route("/api/queues", self.list_queues, "GET", "Every queue", responses=COMMON),
            route(q, self.get_queue, "GET", "One queue", responses={**COMMON, **NOT_FOUND}),
            route(
                q + "/pause",
                self.pause,
                "POST",
                "Pause a queue",
                responses={**MUTATION, **NOT_FOUND},
            ),
            route(
                q + "/unpause",
                self.unpause,
                "POST",
                "Resume a queue",
                responses={**MUTATION, **NOT_FOUND},
            ),
            route(
                q + "/tasks",
                self.list_tasks,
                "GET",
                "Tasks of a queue in one state, a page at a time, with previews of payloads "
                "and results; filtered by type, last error text and payload fields",
                description="The SQL brokers filter in the database. Redis reads the "
                "state's tasks in order up to a bound and filters them: `complete` is false "
                "when it stopped before the end. Unknown query parameters are refused (400).",
                responses={**COMMON, **NOT_FOUND},
            ),
            route(
                q + "/groups/{group_id}",
                self.get_group,
                "GET",
                "A group's progress (total, finished, members by state) and its follow-up",
                responses={**COMMON, **NOT_FOUND},
            ),
            route(
                "/api/workflows",
                self.list_workflows,
                "GET",
                "Workflows newest first, by state and age, a page at a time",
                description="A listing by state reads at most 5000 records per call; "
                "`cursor` goes on from where it stopped (also when the page is short).",
                responses=COMMON,
            ),
            route(
                "/api/workflows/{workflow_id}",
                self.get_workflow,
                "GET",
                "A workflow's progress and each node (state, attempts, dependencies)",
                responses={**COMMON, **WORKFLOW_NOT_FOUND},
            ),
            route(
                "/api/workflows/{workflow_id}/cancel",
                self.cancel_workflow,
                "POST",
                "Cancel every unfinished node (running ones by their workers)",
                responses={**MUTATION, **WORKFLOW_NOT_FOUND},
            ),
            route(
                q + "/tasks:bulk",
                self.selection,
                "POST",
                "Run, archive, delete or cancel the tasks picked by id, each as its own "
                "action would; one result per task",
                responses={**MUTATION, **NOT_FOUND},
            ),
            route(
                q + "/tasks:run_all",
                self.run_all,
                "POST",
                "Run every scheduled, retry or archived task of the state now",
                responses={**MUTATION, **NOT_FOUND, **CONFLICT},
            ),
            route(
                q + "/tasks:delete_all",
                self.delete_all,
                "POST",
                "Delete every task of the state (not active)",
                responses={**MUTATION, **NOT_FOUND, **CONFLICT},
            ),
            route(
                q + "/partitions",
                self.queue_partitions,
                "GET",
                "The fair limits of one queue: each template, the partitions with the most "
                "tasks waiting and running, the rest summed",
                responses={**COMMON, **NOT_FOUND},
            ),
            route(
                q + "/unique",
                self.queue_unique,
                "GET",
                "Unique keys the tasks of one queue hold, soonest due first; debounced tasks "
                "with when they run at the latest",
                responses={**COMMON, **NOT_FOUND},
            ),
            route(
                q + "/history",
                self.queue_history,
                "GET",
                "Throughput and failures of one queue over the last hour",
                responses={**COMMON, **NOT_FOUND},
            ),
            route(
                t + "/signals/{name}",
                self.signal_task,
                "POST",
                "Deliver a signal to a task that waits, or will wait, for it "
                "(ctx.wait_for); the body is the signal's payload, any JSON value",
                responses={**MUTATION, **NOT_FOUND, **CONFLICT},
            ),
            # Action routes first: ".../x/run" is the action on x.
            *[
                route(
                    f"{t}/{action}",
                    self.task_action(action),
                    "POST",
                    f"{action.capitalize()} a task",
                    responses={**MUTATION, **NOT_FOUND, **CONFLICT},
                )
                for action in ACTIONS
            ],
            route(t, self.get_task, "GET", "One task, whole", responses={**COMMON, **NOT_FOUND}),
            route(
                t,
                self.delete_task,
                "DELETE",
                "Delete a task that is not active",
                status_code=204,
                response_class=Response,
                responses={**MUTATION, **NOT_FOUND, **CONFLICT},
            ),
            route("/api/workers", self.list_workers, "GET", "Live workers", responses=COMMON),
            route(
                "/api/periodic",
                self.list_periodic,
                "GET",
                "The app's periodic schedules: next runs, the last tick found in the broker, "
                "whether their queue is paused",
                responses=COMMON,
            ),
            route(
                "/api/schedules",
                self.create_schedule,
                "POST",
                "Store a new periodic schedule; schedulers tick it within seconds",
                status_code=201,
                responses={**MUTATION, **SCHEDULE_CONFLICT},
            ),
            route(
                sch,
                self.get_schedule,
                "GET",
                "One schedule, code or stored",
                responses={**COMMON, **NOT_FOUND},
            ),
            route(
                sch,
                self.edit_schedule,
                "PATCH",
                "Change the given fields of a stored schedule",
                responses={**MUTATION, **NOT_FOUND, **SCHEDULE_CONFLICT},
            ),
            route(
                sch,
                self.delete_schedule,
                "DELETE",
                "Delete a stored schedule (its runs already enqueued go on)",
                status_code=204,
                response_class=Response,
                responses={**MUTATION, **NOT_FOUND, **SCHEDULE_CONFLICT},
            ),
            *[
                route(
                    f"{sch}/{verb}",
                    self.schedule_action(verb),
                    "POST",
                    f"{verb.capitalize()} a stored schedule",
                    responses={**MUTATION, **NOT_FOUND, **SCHEDULE_CONFLICT},
                )
                for verb in ("pause", "resume")
            ],
            route(
                sch + "/trigger",
                self.trigger_schedule,
                "POST",
                "Enqueue one run of a schedule now, with its own task id",
                responses={**MUTATION, **NOT_FOUND},
            ),
            route(
                sch + "/backfill",
                self.backfill_schedule,
                "POST",
                f"Enqueue the ticks between two instants (at most {MAX_BACKFILL}), each under "
                "its tick's id; a tick that ran already is left alone",
                responses={**MUTATION, **NOT_FOUND},
            ),
            route(
                "/api/limits",
                self.list_limits,
                "GET",
                "Flow-control keys: running, limit, tokens left, tasks waiting",
                responses=COMMON,
            ),
            route(
                "/api/limits/{queue}/{key:path}",
                self.set_limit,
                "PUT",
                "Override one key's limit at run time (every worker applies it at its next "
                "claim); a part left out keeps the limit the key's tasks carry",
                description="The key is the last path segment, URL-escaped "
                "(`partner%3Aacme`); each PUT replaces the key's override.",
                responses={**MUTATION, **NOT_FOUND},
            ),
            route(
                "/api/limits/{queue}/{key:path}",
                self.reset_limit,
                "DELETE",
                "Remove a key's override: the limit its tasks carry applies again",
                status_code=204,
                response_class=Response,
                responses={**MUTATION, **LIMIT_NOT_FOUND},
            ),
            route(
                "/api/scaling",
                self.scaling,
                "GET",
                "Per queue: tasks pending and running, age of the oldest pending task; for "
                "autoscalers (KEDA's metrics-api scaler)",
                description=f"One read of the queues serves every request for "
                f"{SCALING_TTL:g} seconds (`age` tells how old it is).",
                responses=COMMON,
            ),
            route(
                "/api/history",
                self.history,
                "GET",
                "Throughput and failures of all queues over the last hour",
                responses=COMMON,
            ),
        ]
        return routes

    def document(self, root_path: str = "") -> dict[str, Any]:
        """The OpenAPI document, generated from the routes."""
        if self._document is None:
            self._routes = self._routes or self._build_routes()
            doc = get_openapi(
                title="durq admin API",
                version="1",
                openapi_version="3.1.0",
                description="Queues, tasks and workers of a durq broker. Authenticate with "
                "`Authorization: Bearer <token>`.",
                routes=self._routes,
            )
            doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            doc["security"] = [{"bearer": []}]
            self._document = doc
        return {**self._document, "servers": [{"url": root_path or "/"}]}

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(self.document(request.scope.get("root_path", "")))

    # -- endpoints --------------------------------------------------------------------------

    async def list_queues(self) -> models.QueueList:
        queues = await self.inspector.list_queues()
        return models.QueueList.model_validate({"queues": [queue_json(q) for q in queues]})

    async def get_queue(self, queue: QueueName) -> models.Queue:
        return models.Queue.model_validate(queue_json(await self.inspector.queue_stats(queue)))

    async def pause(self, queue: QueueName) -> models.Queue:
        await self.inspector.queue_stats(queue)  # 404 for an unknown queue
        await self.inspector.pause_queue(queue)
        return await self.get_queue(queue)

    async def unpause(self, queue: QueueName) -> models.Queue:
        await self.inspector.queue_stats(queue)
        await self.inspector.unpause_queue(queue)
        return await self.get_queue(queue)

    async def list_tasks(
        self,
        request: Request,
        queue: QueueName,
        state: OptionalState = None,
        page: Page = 1,
        page_size: PageSize = DEFAULT_PAGE_SIZE,
        type: TypeFilter = None,
        error: ErrorFilter = None,
        payload: PayloadFilter = None,
    ) -> models.TaskPage:
        # The declared filters document and check the common forms; the query string itself
        # is read for payload.<field> and to refuse unknown parameters.
        where = filter_from_query(request.query_params, TASK_LIST_PARAMS)
        wanted = parse_state(state.value) if state is not None else TaskState.PENDING
        page_of = await task_page(self.inspector, queue, wanted, where, page, page_size)
        return models.TaskPage.model_validate(
            {
                "queue": queue,
                "state": wanted.value,
                "page": page,
                "page_size": page_size,
                "total": page_of.total,
                "tasks": [t.summary() for t in page_of.tasks],
                "complete": page_of.complete,
                "scanned": page_of.scanned,
            }
        )

    async def selection(
        self, queue: QueueName, body: Annotated[models.Selection, Body()]
    ) -> models.SelectionResult:
        await self.inspector.queue_stats(queue)
        outcomes = await self.inspector.steer_selection(queue, body.ids, body.action.value)
        results = [selection_item(o, body.action.value) for o in outcomes]
        done = sum(1 for o in outcomes if o.ok)
        return models.SelectionResult.model_validate(
            {
                "queue": queue,
                "action": body.action.value,
                "done": done,
                "failed": len(outcomes) - done,
                "results": results,
            }
        )

    async def run_all(self, queue: QueueName, state: RequiredState) -> models.BulkResult:
        wanted = parse_state(state.value)
        await self.inspector.queue_stats(queue)
        count = await self.inspector.run_all(queue, wanted)
        return models.BulkResult(queue=queue, state=state, count=count)

    async def delete_all(self, queue: QueueName, state: RequiredState) -> models.BulkResult:
        wanted = parse_state(state.value)
        await self.inspector.queue_stats(queue)
        count = await self.inspector.delete_all(queue, wanted)
        return models.BulkResult(queue=queue, state=state, count=count)

    async def get_task(self, queue: QueueName, task_id: TaskId) -> models.Task:
        _not_an_action(task_id)
        info = await self.inspector.get_task_info(queue, task_id)
        member_of = groups.member_of(info)
        group = None if member_of is None else {"id": member_of[0], "queue": member_of[1]}
        return models.Task.model_validate({**info.to_dict(), "group": group})

    async def get_group(self, queue: QueueName, group_id: GroupId) -> models.Group:
        info = await self.inspector.get_group(queue, group_id)
        return models.Group.model_validate(info.to_dict())

    async def list_workflows(
        self,
        state: WorkflowStateFilter = None,
        newer_than: Age = None,
        older_than: Age = None,
        limit: Annotated[int, Query(ge=1, le=WORKFLOW_PAGE_MAX)] = 50,
        cursor: Annotated[
            str | None,
            Query(
                pattern=CURSOR_PATTERN,
                description="The cursor of the previous page (the last workflow's creation "
                "time and id)",
            ),
        ] = None,
    ) -> models.WorkflowList:
        page = await self.inspector.list_workflows(
            state=state, newer_than=newer_than, older_than=older_than, limit=limit, cursor=cursor
        )
        return models.WorkflowList.model_validate(
            {"workflows": [w.to_dict(nodes=False) for w in page.workflows], "cursor": page.cursor}
        )

    async def get_workflow(self, workflow_id: WorkflowId) -> models.Workflow:
        info = await self.inspector.get_workflow(workflow_id)
        return models.Workflow.model_validate(info.to_dict())

    async def cancel_workflow(self, workflow_id: WorkflowId) -> models.WorkflowCancelled:
        cancelled = await self.inspector.cancel_workflow(workflow_id)
        return models.WorkflowCancelled(id=workflow_id, cancelled=cancelled)

    async def delete_task(self, queue: QueueName, task_id: TaskId) -> Response:
        _not_an_action(task_id)
        await self.inspector.delete_task(queue, task_id)
        return Response(status_code=204)

    async def signal_task(
        self,
        queue: QueueName,
        task_id: TaskId,
        name: SignalName,
        payload: Annotated[Any, Body()] = None,
    ) -> models.SignalResult:
        delivered = await self.dash.app.signal(task_id, name, payload, queue=queue)
        return models.SignalResult(queue=queue, id=task_id, name=name, delivered=delivered)

    def task_action(self, action: str) -> Any:
        method = {
            "run": self.inspector.run_task,
            "archive": self.inspector.archive_task,
            "cancel": self.inspector.cancel_task,
        }[action]

        async def endpoint(queue: QueueName, task_id: TaskId) -> models.Task:
            info = await method(queue, task_id)
            return models.Task.model_validate(info.to_dict())

        endpoint.__name__ = f"{action}_task"
        return endpoint

    async def list_periodic(self) -> models.PeriodicList:
        entries = await periodic_rows(self.dash.app)
        return models.PeriodicList.model_validate({"entries": entries})

    async def create_schedule(self, body: Annotated[models.NewSchedule, Body()]) -> models.Schedule:
        fields = body.model_dump(exclude_none=True)
        entry = await self.dash.app.stored_schedules.add(
            fields.pop("name"), fields.pop("schedule"), fields.pop("type"), **fields
        )
        return models.Schedule.model_validate(entry.to_dict())

    async def get_schedule(self, name: ScheduleName) -> models.Schedule:
        entry = await self.dash.app.stored_schedules.get(name)
        return models.Schedule.model_validate(entry.to_dict())

    async def edit_schedule(
        self, name: ScheduleName, body: Annotated[models.ScheduleFields, Body()]
    ) -> models.Schedule:
        entry = await self.dash.app.stored_schedules.update(
            name, **body.model_dump(exclude_unset=True)
        )
        return models.Schedule.model_validate(entry.to_dict())

    async def delete_schedule(self, name: ScheduleName) -> Response:
        await self.dash.app.stored_schedules.remove(name)
        return Response(status_code=204)

    def schedule_action(self, verb: str) -> Any:
        async def endpoint(name: ScheduleName) -> models.Schedule:
            entry = await getattr(self.dash.app.stored_schedules, verb)(name)
            return models.Schedule.model_validate(entry.to_dict())

        endpoint.__name__ = f"{verb}_schedule"
        return endpoint

    async def trigger_schedule(self, name: ScheduleName) -> models.Task:
        info = await self.dash.app.stored_schedules.trigger(name)
        return models.Task.model_validate(info.to_dict())

    async def backfill_schedule(
        self, name: ScheduleName, body: Annotated[models.BackfillRequest, Body()]
    ) -> models.BackfillResult:
        result = await self.dash.app.stored_schedules.backfill(
            name, body.start, body.end, dry_run=body.dry_run
        )
        return models.BackfillResult.model_validate(result.to_dict())

    async def list_workers(self) -> models.WorkerList:
        workers = await self.inspector.list_workers()
        return models.WorkerList.model_validate({"workers": [worker_json(w) for w in workers]})

    async def list_limits(self, queue: QueueFilter = None) -> models.LimitList:
        limits = await self.inspector.list_limits(queue)
        return models.LimitList.model_validate({"limits": [s.to_dict() for s in limits]})

    async def set_limit(
        self,
        queue: QueueName,
        key: LimitKey,
        body: Annotated[models.LimitOverrideRequest, Body()],
    ) -> models.Limit:
        stats = await self.inspector.set_limit(
            queue, key, concurrency=body.concurrency, rate=body.rate
        )
        return models.Limit.model_validate(stats.to_dict())

    async def reset_limit(self, queue: QueueName, key: LimitKey) -> Response:
        if not await self.inspector.reset_limit(queue, key):
            raise HTTPException(404, f"no override on limit {key!r} in queue {queue!r}")
        return Response(status_code=204)

    async def scaling(self) -> models.Scaling:
        queues = {q.name: scaling_json(q) for q in await self.scaling_figures.get()}
        return models.Scaling.model_validate(
            {
                "queues": queues,
                "pending": sum(q["pending"] for q in queues.values()),
                "oldest_pending_seconds": max(
                    (q["oldest_pending_seconds"] for q in queues.values()), default=0.0
                ),
                "age": self.scaling_figures.age or 0.0,
            }
        )

    async def history(self) -> models.History:
        return models.History.model_validate(await self.dash.history.series())

    async def queue_partitions(
        self, queue: QueueName, top: Annotated[int, Query(ge=1, le=PARTITIONS_TOP_MAX)] = 20
    ) -> models.Partitions:
        depth = await self.inspector.fair_partitions(queue, top)
        return models.Partitions.model_validate(depth.to_dict())

    async def queue_unique(
        self, queue: QueueName, limit: Annotated[int, Query(ge=1, le=UNIQUE_PAGE_MAX)] = 50
    ) -> models.UniqueKeyList:
        page = await self.inspector.list_unique(queue, limit=limit)
        return models.UniqueKeyList.model_validate({"queue": queue, **page.to_dict()})

    async def queue_history(self, queue: QueueName) -> models.History:
        await self.inspector.queue_stats(queue)
        return models.History.model_validate(await self.dash.history.series(queue))


async def task_page(
    inspector: Inspector,
    queue: str,
    state: TaskState,
    where: TaskFilter,
    page: int,
    page_size: int,
) -> TaskSearchResult:
    """One page of a queue's tasks in one state, filtered or not, with the total."""
    offset = (page - 1) * page_size
    if not where.empty:
        return await inspector.search_tasks(queue, state, where, limit=page_size, offset=offset)
    stats = await inspector.queue_stats(queue)
    tasks = await inspector.list_tasks(queue, state, limit=page_size, offset=offset)
    return TaskSearchResult(tasks, stats.sizes.get(state, 0))


#: Next runs shown per schedule.
UPCOMING_RUNS = 3


async def periodic_rows(app: AdminView) -> list[dict[str, Any]]:
    """The app's schedules, code then stored, as the API and the page show them:
    :func:`durq.periodic.status` with the next runs and whether the queue the ticks go to
    is paused."""
    entries = await app.stored_schedules.list()
    rows = await periodic.status(app, upcoming=UPCOMING_RUNS, entries=entries)
    paused = {q.name for q in await app.inspector.list_queues() if q.paused}
    return [{**row.to_dict(), "paused": row.queue in paused} for row in rows]


def selection_item(outcome: SelectionOutcome, action: str) -> dict[str, Any]:
    """One task's result in a selection, as the API and the notices show it."""
    error = None
    if outcome.error is not None:
        code = "not_found" if isinstance(outcome.error, TaskNotFoundError) else "invalid_state"
        error = {"code": code, "message": outcome.error.message}
    task = outcome.task
    state = None if task is None or action == "delete" else task.state.value
    return {"id": outcome.id, "ok": outcome.ok, "state": state, "error": error}


def _not_an_action(task_id: str) -> None:
    """``GET .../tasks/x/run`` is the wrong method for an action, not a task ``x/run``."""
    if task_id.rpartition("/")[2] in ACTIONS and "/" in task_id:
        raise HTTPException(405, "this action takes POST")
