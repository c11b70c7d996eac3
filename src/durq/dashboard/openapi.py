"""The OpenAPI 3.0 document of the admin API, written by hand so it says exactly what the
endpoints in :mod:`.api` do (the schemathesis test fuzzes the API from it)."""

from __future__ import annotations

from typing import Any

from durq.states import TaskState

QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$"
TASK_ID_PATTERN = r"^[A-Za-z0-9_.:\-@+=/]+$"

_STATES = [s.value for s in TaskState]
_NULLABLE_STR = {"type": "string", "nullable": True}
_NULLABLE_TIME = {"type": "string", "format": "date-time", "nullable": True}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


_COMMON_ERRORS = {
    "400": _error("Invalid name, state or paging parameter"),
    "401": _error("Missing or wrong bearer token"),
    "503": _error("The broker cannot be reached"),
}
_MUTATION_ERRORS = {
    **_COMMON_ERRORS,
    "403": _error("Read-only mode, or CSRF check failed (cookie sessions)"),
}

_QUEUE_PARAM = {
    "name": "queue",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": QUEUE_PATTERN, "minLength": 1, "maxLength": 100},
}
_TASK_PARAM = {
    "name": "task_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": TASK_ID_PATTERN, "minLength": 1, "maxLength": 200},
}


def _state_param(required: bool) -> dict[str, Any]:
    return {
        "name": "state",
        "in": "query",
        "required": required,
        "schema": {"type": "string", "enum": _STATES},
    }


SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            }
        },
    },
    "Queue": {
        "type": "object",
        "required": ["name", "paused", "size", "sizes", "oldest_pending_age"],
        "properties": {
            "name": {"type": "string"},
            "paused": {"type": "boolean"},
            "size": {"type": "integer"},
            "sizes": {
                "type": "object",
                "properties": {s: {"type": "integer"} for s in _STATES},
            },
            "oldest_pending_age": {"type": "number", "description": "seconds"},
            "processed_today": {"type": "integer"},
            "failed_today": {"type": "integer"},
            "processed_total": {"type": "integer"},
            "failed_total": {"type": "integer"},
        },
    },
    "QueueList": {
        "type": "object",
        "required": ["queues"],
        "properties": {"queues": {"type": "array", "items": _ref("Queue")}},
    },
    "Task": {
        "type": "object",
        "required": ["id", "queue", "type", "state", "payload", "max_retry", "retried"],
        "properties": {
            "id": {"type": "string"},
            "queue": {"type": "string"},
            "type": {"type": "string"},
            "payload": {"type": "object"},
            "state": {"type": "string", "enum": _STATES},
            "max_retry": {"type": "integer"},
            "retried": {"type": "integer"},
            "last_error": _NULLABLE_STR,
            "timeout": {"type": "number", "nullable": True},
            "deadline": _NULLABLE_TIME,
            "next_process_at": _NULLABLE_TIME,
            "enqueued_at": _NULLABLE_TIME,
            "completed_at": _NULLABLE_TIME,
            "started_at": _NULLABLE_TIME,
            "result": {"nullable": True},
            "retention": {"type": "number"},
            "lost": {"type": "integer"},
            "worker_id": _NULLABLE_STR,
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    },
    "TaskPage": {
        "type": "object",
        "required": ["queue", "state", "page", "page_size", "total", "tasks"],
        "properties": {
            "queue": {"type": "string"},
            "state": {"type": "string", "enum": _STATES},
            "page": {"type": "integer"},
            "page_size": {"type": "integer"},
            "total": {"type": "integer"},
            "tasks": {"type": "array", "items": _ref("Task")},
        },
    },
    "BulkResult": {
        "type": "object",
        "required": ["queue", "state", "count"],
        "properties": {
            "queue": {"type": "string"},
            "state": {"type": "string"},
            "count": {"type": "integer"},
        },
    },
    "Worker": {
        "type": "object",
        "required": ["id", "host", "pid", "queues", "concurrency", "active"],
        "properties": {
            "id": {"type": "string"},
            "host": {"type": "string"},
            "pid": {"type": "integer"},
            "queues": {"type": "object", "additionalProperties": {"type": "integer"}},
            "concurrency": {"type": "integer"},
            "active": {"type": "integer"},
            "strict": {"type": "boolean"},
            "started_at": _NULLABLE_TIME,
            "last_heartbeat": _NULLABLE_TIME,
        },
    },
    "WorkerList": {
        "type": "object",
        "required": ["workers"],
        "properties": {"workers": {"type": "array", "items": _ref("Worker")}},
    },
    "History": {
        "type": "object",
        "required": ["points", "interval", "window", "unit"],
        "properties": {
            "queue": _NULLABLE_STR,
            "interval": {"type": "number"},
            "window": {"type": "number"},
            "unit": {"type": "string"},
            "points": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["t", "processed", "failed"],
                    "properties": {
                        "t": {"type": "number"},
                        "processed": {"type": "number"},
                        "failed": {"type": "number"},
                    },
                },
            },
        },
    },
}


def _op(
    summary: str,
    ok: dict[str, Any],
    errors: dict[str, Any],
    params: list[dict[str, Any]] | None = None,
    ok_status: str = "200",
) -> dict[str, Any]:
    return {
        "summary": summary,
        "parameters": params or [],
        "responses": {ok_status: ok, **errors},
    }


def _task_action(verb: str, summary: str) -> dict[str, Any]:
    return {
        "post": _op(
            summary,
            _json(_ref("Task"), f"The task after {verb}"),
            {
                **_MUTATION_ERRORS,
                "404": _error("Unknown queue or task"),
                "409": _error(f"The task's state does not allow {verb}"),
            },
            [_QUEUE_PARAM, _TASK_PARAM],
        )
    }


def openapi_document(root_path: str = "") -> dict[str, Any]:
    """The document, with the server URL of the mount point the request came through."""
    not_found_queue = {"404": _error("Unknown queue")}
    bulk_errors = {**_MUTATION_ERRORS, **not_found_queue, "409": _error("State not allowed")}
    paths: dict[str, Any] = {
        "/api/queues": {
            "get": _op("Every queue", _json(_ref("QueueList"), "Queues"), _COMMON_ERRORS)
        },
        "/api/queues/{queue}": {
            "get": _op(
                "One queue",
                _json(_ref("Queue"), "The queue"),
                {**_COMMON_ERRORS, **not_found_queue},
                [_QUEUE_PARAM],
            )
        },
        "/api/queues/{queue}/pause": {
            "post": _op(
                "Pause a queue",
                _json(_ref("Queue"), "The paused queue"),
                {**_MUTATION_ERRORS, **not_found_queue},
                [_QUEUE_PARAM],
            )
        },
        "/api/queues/{queue}/unpause": {
            "post": _op(
                "Resume a queue",
                _json(_ref("Queue"), "The resumed queue"),
                {**_MUTATION_ERRORS, **not_found_queue},
                [_QUEUE_PARAM],
            )
        },
        "/api/queues/{queue}/tasks": {
            "get": _op(
                "Tasks of a queue in one state, a page at a time",
                _json(_ref("TaskPage"), "One page"),
                {**_COMMON_ERRORS, **not_found_queue},
                [
                    _QUEUE_PARAM,
                    _state_param(False),
                    {
                        "name": "page",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "maximum": 100000},
                    },
                    {
                        "name": "page_size",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "maximum": 200},
                    },
                ],
            )
        },
        "/api/queues/{queue}/tasks:run_all": {
            "post": _op(
                "Run every scheduled, retry or archived task of the state now",
                _json(_ref("BulkResult"), "How many tasks moved"),
                bulk_errors,
                [_QUEUE_PARAM, _state_param(True)],
            )
        },
        "/api/queues/{queue}/tasks:delete_all": {
            "post": _op(
                "Delete every task of the state (not active)",
                _json(_ref("BulkResult"), "How many tasks were deleted"),
                bulk_errors,
                [_QUEUE_PARAM, _state_param(True)],
            )
        },
        "/api/queues/{queue}/history": {
            "get": _op(
                "Throughput and failures of one queue over the last hour",
                _json(_ref("History"), "Per-minute rates"),
                {**_COMMON_ERRORS, **not_found_queue},
                [_QUEUE_PARAM],
            )
        },
        "/api/queues/{queue}/tasks/{task_id}": {
            "get": _op(
                "One task",
                _json(_ref("Task"), "The task"),
                {**_COMMON_ERRORS, "404": _error("Unknown queue or task")},
                [_QUEUE_PARAM, _TASK_PARAM],
            ),
            "delete": _op(
                "Delete a task that is not active",
                {"description": "Deleted"},
                {
                    **_MUTATION_ERRORS,
                    "404": _error("Unknown queue or task"),
                    "409": _error("The task is active: cancel it first"),
                },
                [_QUEUE_PARAM, _TASK_PARAM],
                ok_status="204",
            ),
        },
        "/api/queues/{queue}/tasks/{task_id}/run": _task_action("run", "Run a task now"),
        "/api/queues/{queue}/tasks/{task_id}/archive": _task_action(
            "archive", "Archive a waiting task"
        ),
        "/api/queues/{queue}/tasks/{task_id}/cancel": _task_action(
            "cancel", "Cancel a task; an active one's handler is cancelled"
        ),
        "/api/workers": {
            "get": _op("Live workers", _json(_ref("WorkerList"), "Workers"), _COMMON_ERRORS)
        },
        "/api/history": {
            "get": _op(
                "Throughput and failures of all queues over the last hour",
                _json(_ref("History"), "Per-minute rates"),
                _COMMON_ERRORS,
            )
        },
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "durq admin API",
            "version": "1",
            "description": "Queues, tasks and workers of a durq broker. Authenticate with "
            "`Authorization: Bearer <token>`.",
        },
        "servers": [{"url": root_path or "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
