"""The admin HTTP API: JSON over the inspector, described by :mod:`.openapi`."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from durq.brokers.base import QueueStats, WorkerInfo
from durq.dashboard.openapi import openapi_document
from durq.errors import ValidationError
from durq.inspector import parse_state
from durq.states import TaskState

if TYPE_CHECKING:
    from durq.dashboard.app import Dashboard

DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 200
MAX_PAGE = 100_000


def iso(ts: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC (``None`` for 0 / missing)."""
    return datetime.fromtimestamp(ts, UTC).isoformat() if ts else None


def queue_json(stats: QueueStats) -> dict[str, Any]:
    return stats.to_dict()


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
    """``(page, page_size)`` from the query string, validated."""
    page = _int_param(request, "page", 1, 1, MAX_PAGE)
    size = _int_param(request, "page_size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE)
    return page, size


def state_param(request: Request, default: TaskState | None) -> TaskState:
    raw = request.query_params.get("state")
    if raw is None or raw == "":
        if default is None:
            raise ValidationError("the state query parameter is required")
        return default
    return parse_state(raw)


class AdminAPI:
    """Endpoints of ``/api``; every failure becomes a JSON error in :mod:`.app`."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash
        self.inspector = dash.app.inspector

    def routes(self) -> list[Route]:
        p = "/api/queues/{queue}"
        t = p + "/tasks/{task_id:path}"
        return [
            Route("/api/openapi.json", self.openapi, methods=["GET"]),
            Route("/api/queues", self.list_queues, methods=["GET"]),
            Route(p, self.get_queue, methods=["GET"]),
            Route(p + "/pause", self.pause, methods=["POST"]),
            Route(p + "/unpause", self.unpause, methods=["POST"]),
            Route(p + "/tasks", self.list_tasks, methods=["GET"]),
            Route(p + "/tasks:run_all", self.run_all, methods=["POST"]),
            Route(p + "/tasks:delete_all", self.delete_all, methods=["POST"]),
            Route(p + "/history", self.queue_history, methods=["GET"]),
            # Action routes first: an id may contain "/", and ".../x/run" is an action on x.
            Route(t + "/run", self.task_action("run"), methods=["POST"]),
            Route(t + "/archive", self.task_action("archive"), methods=["POST"]),
            Route(t + "/cancel", self.task_action("cancel"), methods=["POST"]),
            Route(t, self.get_task, methods=["GET"]),
            Route(t, self.delete_task, methods=["DELETE"]),
            Route("/api/workers", self.list_workers, methods=["GET"]),
            Route("/api/history", self.history, methods=["GET"]),
        ]

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(request.scope.get("root_path", "")))

    async def list_queues(self, request: Request) -> Response:
        queues = await self.inspector.list_queues()
        return JSONResponse({"queues": [queue_json(q) for q in queues]})

    async def get_queue(self, request: Request) -> Response:
        stats = await self.inspector.queue_stats(request.path_params["queue"])
        return JSONResponse(queue_json(stats))

    async def pause(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        await self.inspector.queue_stats(queue)  # 404 for an unknown queue
        await self.inspector.pause_queue(queue)
        return JSONResponse(queue_json(await self.inspector.queue_stats(queue)))

    async def unpause(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        await self.inspector.queue_stats(queue)
        await self.inspector.unpause_queue(queue)
        return JSONResponse(queue_json(await self.inspector.queue_stats(queue)))

    async def list_tasks(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        state = state_param(request, TaskState.PENDING)
        page, size = paging(request)
        stats = await self.inspector.queue_stats(queue)
        tasks = await self.inspector.list_tasks(queue, state, limit=size, offset=(page - 1) * size)
        return JSONResponse(
            {
                "queue": queue,
                "state": state.value,
                "page": page,
                "page_size": size,
                "total": stats.sizes.get(state, 0),
                "tasks": [t.summary() for t in tasks],
            }
        )

    async def run_all(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        state = state_param(request, None)
        await self.inspector.queue_stats(queue)
        count = await self.inspector.run_all(queue, state)
        return JSONResponse({"queue": queue, "state": state.value, "count": count})

    async def delete_all(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        state = state_param(request, None)
        await self.inspector.queue_stats(queue)
        count = await self.inspector.delete_all(queue, state)
        return JSONResponse({"queue": queue, "state": state.value, "count": count})

    async def get_task(self, request: Request) -> Response:
        info = await self.inspector.get_task_info(
            request.path_params["queue"], request.path_params["task_id"]
        )
        return JSONResponse(info.to_dict())

    async def delete_task(self, request: Request) -> Response:
        await self.inspector.delete_task(
            request.path_params["queue"], request.path_params["task_id"]
        )
        return Response(status_code=204)

    def task_action(self, action: str) -> Any:
        method = {
            "run": self.inspector.run_task,
            "archive": self.inspector.archive_task,
            "cancel": self.inspector.cancel_task,
        }[action]

        async def endpoint(request: Request) -> Response:
            info = await method(request.path_params["queue"], request.path_params["task_id"])
            return JSONResponse(info.to_dict())

        return endpoint

    async def list_workers(self, request: Request) -> Response:
        workers = await self.inspector.list_workers()
        return JSONResponse({"workers": [worker_json(w) for w in workers]})

    async def history(self, request: Request) -> Response:
        return JSONResponse(self.dash.history.series())

    async def queue_history(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        await self.inspector.queue_stats(queue)
        return JSONResponse(self.dash.history.series(queue))
