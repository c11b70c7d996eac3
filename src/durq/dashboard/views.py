"""HTML pages of the dashboard: Jinja2 templates with autoescape, plain forms for actions.

Each action form carries the CSRF token and is confirmed in the browser (``data-confirm``);
after it the browser is sent back with a notice (post/redirect/get)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from durq import groups, workflows
from durq.brokers.views import TaskFilter
from durq.dashboard import security
from durq.dashboard.api import (
    DEFAULT_PAGE_SIZE,
    TASK_LIST_PARAMS,
    filter_from_query,
    iso,
    paging,
    periodic_rows,
    selection_item,
    task_page,
    worker_json,
)
from durq.dashboard.workflow_pages import WorkflowPages
from durq.errors import GroupNotFoundError, ScheduleConflictError, ValidationError
from durq.inspector import parse_state
from durq.limits import format_limit, format_rate
from durq.states import TaskState
from durq.task import ENCRYPTED, TaskInfo

if TYPE_CHECKING:
    from durq.dashboard.app import Dashboard

STATES = list(TaskState)
TASK_ACTIONS = ("run", "archive", "cancel", "delete")
#: Which actions make sense in which state (the broker decides in the end).
ACTIONS_BY_STATE: dict[TaskState, tuple[str, ...]] = {
    TaskState.PENDING: ("archive", "delete"),
    TaskState.SCHEDULED: ("run", "archive", "delete"),
    TaskState.ACTIVE: ("cancel",),
    TaskState.RETRY: ("run", "archive", "delete"),
    TaskState.ARCHIVED: ("run", "delete"),
    TaskState.COMPLETED: ("delete",),
    TaskState.WAITING: ("archive", "delete"),
}
BULK_BY_STATE: dict[TaskState, tuple[str, ...]] = {
    TaskState.PENDING: ("delete_all",),
    TaskState.SCHEDULED: ("run_all", "delete_all"),
    TaskState.ACTIVE: (),
    TaskState.RETRY: ("run_all", "delete_all"),
    TaskState.ARCHIVED: ("run_all", "delete_all"),
    TaskState.COMPLETED: ("delete_all",),
    TaskState.WAITING: ("delete_all",),
}


#: What a selection of tasks can do in each state (the buttons under the table).
SELECTION_BY_STATE: dict[TaskState, tuple[str, ...]] = {
    state: tuple(a for a in ("run", "archive", "delete") if a in actions)
    for state, actions in ACTIONS_BY_STATE.items()
}
#: Query parameters of the queue page besides its filters.
PAGE_PARAMS = TASK_LIST_PARAMS | {"notice", "ns"}


#: Query parameters of the limits page.
LIMITS_PARAMS = frozenset({"queue", "notice", "ns"})
#: Where the limits page's empty state sends a reader: the flow-control guide.
FLOW_CONTROL_DOCS = "https://pypi.org/project/durq/"

#: Members listed on a task page's group card (the rest are counted).
GROUP_MEMBERS_SHOWN = 50


def filter_fields(where: TaskFilter) -> dict[str, str]:
    """The filter form's fields: type, error, payload as ``field=value`` (the first)."""
    first = where.payload[0] if where.payload else None
    return {
        "type": where.type or "",
        "error": where.error or "",
        "payload": f"{first[0]}={first[1]}" if first else "",
    }


def filter_query(where: TaskFilter) -> str:
    """The filter as query parameters to carry on links (``&type=...``), or ``""``."""
    items = [("type", where.type), ("error", where.error)]
    items += [(f"payload.{field}", value) for field, value in where.payload]
    pairs = [(k, v) for k, v in items if v is not None]
    return "&" + urlencode(pairs) if pairs else ""


def age(seconds: float | None) -> str:
    """``1h 02m``, ``3m 12s``, ``4s``, or ``-`` for nothing."""
    if not seconds or seconds <= 0:
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def when(value: datetime | str | float | None) -> str:
    """A timestamp as ``2024-05-01 12:00:03 UTC``."""
    if value is None or value == "":
        return "-"
    if isinstance(value, float | int):
        value = datetime.fromtimestamp(value, UTC)
    elif isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def pretty(value: Any) -> str:
    if value == ENCRYPTED:  # TaskInfo.to_dict's stand-in for ciphertext
        return "(encrypted)"
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def make_templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("durq.dashboard", "templates"),
        autoescape=True,  # everything from the broker is user data
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(age=age, when=when, pretty=pretty, urlpart=lambda v: quote(str(v), safe=""))
    return Jinja2Templates(env=env)


#: The queue page shows this many partitions of its fair limits one by one (the API more),
#: and this many of the unique keys its tasks hold.
QUEUE_PARTITIONS = 10
QUEUE_UNIQUE_KEYS = 20


class Views:
    """The HTML endpoints."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash
        self.inspector = dash.app.inspector
        self.templates = make_templates()
        self.workflow_pages = WorkflowPages(self)

    def routes(self) -> list[Route]:
        q = "/queues/{queue}"
        t = q + "/tasks/{task_id:path}"
        return [
            Route("/", self.overview, methods=["GET"]),
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/workers", self.workers, methods=["GET"]),
            Route("/periodic", self.periodic, methods=["GET"]),
            Route("/periodic/new", self.schedule_new, methods=["POST"]),
            Route("/periodic/{name}/edit", self.schedule_edit, methods=["POST"]),
            Route("/periodic/{name}/action/{action}", self.schedule_action, methods=["POST"]),
            Route("/limits", self.limits, methods=["GET"]),
            Route("/limits/{queue}/override", self.limit_override, methods=["POST"]),
            *self.workflow_pages.routes(),
            Route(q, self.queue, methods=["GET"]),
            Route(q + "/search", self.search, methods=["GET"]),
            Route(q + "/pause", self.queue_action("pause"), methods=["POST"]),
            Route(q + "/unpause", self.queue_action("unpause"), methods=["POST"]),
            Route(q + "/bulk/{action}", self.bulk, methods=["POST"]),
            Route(q + "/selection", self.selection, methods=["POST"]),
            Route(t + "/action/{action}", self.task_action, methods=["POST"]),
            Route(t, self.task, methods=["GET"]),
        ]

    # -- rendering --------------------------------------------------------------------------

    def render(
        self,
        request: Request,
        name: str,
        context: Mapping[str, Any],
        status: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> HTMLResponse:
        state = request.scope.get("state", {})
        base = {
            "root": request.scope.get("root_path", ""),
            "csrf": state.get("durq_csrf", ""),
            "authed": state.get("durq_auth") in ("session", "bearer"),
            "insecure": not self.dash.auth.enabled,
            "read_only": self.dash.settings.read_only,
            "title": self.dash.settings.title,
            "refresh": self.dash.settings.refresh_seconds,
            "notice": self.notice(request),
            "nav": "",
        }
        response: HTMLResponse = self.templates.TemplateResponse(
            request, name, {**base, **context}, status_code=status, headers=headers
        )
        return response

    def error_page(
        self,
        request: Request,
        status: int,
        message: str,
        headers: Mapping[str, str] | None = None,
    ) -> HTMLResponse:
        return self.render(
            request, "error.html", {"status": status, "message": message}, status, headers
        )

    def notice(self, request: Request) -> str:
        """The notice of the redirect that led here, if this server issued it (signed):
        a link from elsewhere cannot make the dashboard say anything."""
        text = request.query_params.get("notice", "")
        signature = request.query_params.get("ns", "")
        if not text or not self.dash.auth.notice_ok(text, signature):
            return ""
        return text[:300]

    def back(self, request: Request, path: str, notice: str) -> RedirectResponse:
        root = request.scope.get("root_path", "")
        sep = "&" if "?" in path else "?"
        query = urlencode({"notice": notice, "ns": self.dash.auth.sign_notice(notice)})
        return RedirectResponse(f"{root}{path}{sep}{query}", 303)

    async def checked_form(self, request: Request) -> dict[str, str]:
        """The submitted form, after the CSRF check (403 page otherwise)."""
        form = await request.form()
        data = {k: v for k, v in form.items() if isinstance(v, str)}
        if not security.csrf_ok(request, data.get(security.CSRF_FIELD)):
            raise security.CSRFError(
                "the form expired or came from another site (CSRF check failed)"
            )
        return data

    # -- pages ------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        queues = await self.inspector.list_queues()
        totals = {s.value: sum(q.sizes.get(s, 0) for q in queues) for s in STATES}
        return self.render(
            request,
            "overview.html",
            {
                "nav": "queues",
                "queues": queues,
                "states": STATES,
                "totals": totals,
                "processed_today": sum(q.processed_today for q in queues),
                "failed_today": sum(q.failed_today for q in queues),
            },
        )

    async def queue(self, request: Request) -> Response:
        name = request.path_params["queue"]
        stats = await self.inspector.queue_stats(name)
        raw_state = request.query_params.get("state") or TaskState.PENDING.value
        state = parse_state(raw_state)
        page, size = paging(request)
        where = filter_from_query(request.query_params, PAGE_PARAMS)
        found = await task_page(self.inspector, name, state, where, page, size)
        pages = max(1, -(-found.total // size))
        partitions = await self.inspector.fair_partitions(name, QUEUE_PARTITIONS)
        held = None
        if stats.unique_keys:
            held = await self.inspector.list_unique(name, limit=QUEUE_UNIQUE_KEYS)
        return self.render(
            request,
            "queue.html",
            {
                "nav": "queues",
                "queue": stats,
                "states": STATES,
                "state": state,
                "tasks": found.tasks,
                "page": page,
                "pages": pages,
                "page_size": size,
                "default_page_size": DEFAULT_PAGE_SIZE,
                "total": found.total,
                "found": found,
                "where": where,
                "filter_form": filter_fields(where),
                "filter_query": filter_query(where),
                "bulk": () if not where.empty else BULK_BY_STATE[state],
                "selection": SELECTION_BY_STATE[state],
                "partitions": partitions,
                "held": held,
            },
        )

    async def search(self, request: Request) -> Response:
        name = request.path_params["queue"]
        task_id = request.query_params.get("id", "").strip()
        if not task_id:
            return self.back(request, f"/queues/{quote(name)}", "enter a task id")
        info = await self.inspector.get_task_info(name, task_id)
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}/queues/{quote(name)}/tasks/{quote(info.id, safe='')}", 303)

    async def task(self, request: Request) -> Response:
        info = await self.inspector.get_task_info(
            request.path_params["queue"], request.path_params["task_id"]
        )
        data = info.to_dict()
        return self.render(
            request,
            "task.html",
            {
                "nav": "queues",
                "task": info,
                "data": data,
                "actions": ACTIONS_BY_STATE.get(info.state, ()),
                "workflow": workflows.header_of(info.headers),
                **await self._group_of(info),
            },
        )

    async def _group_of(self, info: TaskInfo) -> dict[str, Any]:
        """The group card of a member or of a group's follow-up (empty for other tasks)."""
        member_of = groups.member_of(info)
        found = member_of or groups.followed_by(info)
        if found is None:
            return {"group_id": None}
        group_id, queue = found
        try:
            group = await self.inspector.get_group(queue, group_id)
        except (GroupNotFoundError, ValidationError):
            group = None
        return {
            "group_id": group_id,
            "group": group,
            "group_members": group.members[:GROUP_MEMBERS_SHOWN] if group else (),
            "is_follow_up": member_of is None,
        }

    async def workers(self, request: Request) -> Response:
        workers = await self.inspector.list_workers()
        now = self.dash.app.clock.now()
        rows = [
            {
                **worker_json(w),
                "uptime": age(now - w.started_at) if w.started_at else "-",
                "seen": age(now - w.last_heartbeat) if w.last_heartbeat else "-",
            }
            for w in workers
        ]
        return self.render(request, "workers.html", {"nav": "workers", "workers": rows})

    async def periodic(self, request: Request) -> Response:
        entries = await periodic_rows(self.dash.app)
        return self.render(request, "periodic.html", {"nav": "periodic", "entries": entries})

    # -- the schedule editor (stored schedules) ---------------------------------------------

    @staticmethod
    def _schedule_fields(form: Mapping[str, str]) -> dict[str, Any]:
        """The editor's fields as :class:`durq.schedules.StoredSchedules` arguments; an
        empty field keeps the default (queue: the type's, tz: UTC)."""
        text = form.get("payload", "").strip()
        try:
            payload = json.loads(text) if text else {}
        except ValueError:
            raise ValidationError("the payload is not valid JSON") from None
        return {
            "schedule": form.get("schedule", "").strip(),
            "type": form.get("type", "").strip(),
            "payload": payload,
            "queue": form.get("queue", "").strip() or None,
            "tz": form.get("tz", "").strip() or None,
            "overlap": form.get("overlap", "allow"),
        }

    async def schedule_new(self, request: Request) -> Response:
        form = await self.checked_form(request)
        name = form.get("name", "").strip()
        fields = self._schedule_fields(form)
        try:
            await self.dash.app.stored_schedules.add(
                name, fields.pop("schedule"), fields.pop("type"), **fields
            )
        except (ValidationError, ScheduleConflictError) as exc:
            return self.back(request, "/periodic", f"not created: {exc.message}")
        return self.back(request, "/periodic", f"schedule {name} created")

    async def schedule_edit(self, request: Request) -> Response:
        form = await self.checked_form(request)
        name = request.path_params["name"]
        try:
            await self.dash.app.stored_schedules.update(name, **self._schedule_fields(form))
        except (ValidationError, ScheduleConflictError) as exc:
            return self.back(request, "/periodic", f"not saved: {exc.message}")
        return self.back(request, "/periodic", f"schedule {name} saved")

    async def schedule_action(self, request: Request) -> Response:
        await self.checked_form(request)
        name = request.path_params["name"]
        action = request.path_params["action"]
        schedules = self.dash.app.stored_schedules
        try:
            if action == "trigger":
                info = await schedules.trigger(name)
                notice = f"schedule {name}: enqueued {info.id}"
            elif action == "delete":
                await schedules.remove(name)
                notice = f"schedule {name} deleted"
            elif action in ("pause", "resume"):
                await getattr(schedules, action)(name)
                notice = f"schedule {name} {action}d"
            else:
                raise ValidationError(f"unknown action {action!r}")
        except ScheduleConflictError as exc:
            notice = exc.message
        return self.back(request, "/periodic", notice)

    async def limits(self, request: Request) -> Response:
        """Flow-control keys: what runs under each, its limit, tokens left, tasks held."""
        unknown = sorted(k for k in request.query_params if k not in LIMITS_PARAMS)
        if unknown:
            raise ValidationError(
                f"unknown query parameter(s) {', '.join(map(repr, unknown))}: filter with queue"
            )
        queue = request.query_params.get("queue") or None
        keys = await self.inspector.list_limits(queue)
        rows = [
            {
                **s.to_dict(),
                # The limit in force (an override's parts, else the last task's).
                "concurrency": s.limit_concurrency,
                "rate_text": format_rate(*(s.limit_rate or (None, None))),
                "own_text": format_limit(s.concurrency, s.rate, s.per, none="not seen yet")
                if s.overridden
                else None,
                "set_concurrency": s.override_concurrency,
                "set_rate": format_rate(s.override_rate, s.override_per)
                if s.override_rate is not None
                else "",
                "full": s.limit_concurrency is not None and s.running >= s.limit_concurrency,
            }
            for s in keys
        ]
        queues = sorted({q.name for q in await self.inspector.list_queues()} | {queue or ""})
        return self.render(
            request,
            "limits.html",
            {
                "nav": "limits",
                "limits": rows,
                "queue": queue,
                "queues": [q for q in queues if q],
                # A task counts against each of its keys, so running attempts are not summed.
                "full": sum(1 for row in rows if row["full"]),
                "waiting": sum(s.waiting for s in keys),
                "docs": FLOW_CONTROL_DOCS,
            },
        )

    async def limit_override(self, request: Request) -> Response:
        """The limits page's forms: set a key's override (concurrency and/or rate; a field
        left empty keeps the tasks' own) or reset it."""
        form = await self.checked_form(request)
        queue = request.path_params["queue"]
        key = form.get("key", "")
        back = f"/limits?queue={quote(queue)}"
        try:
            if form.get("do") == "reset":
                found = await self.inspector.reset_limit(queue, key)
                notice = f"limit {key} reset" if found else f"limit {key} had no override"
            else:
                text = form.get("concurrency", "").strip()
                if text and not text.isdigit():
                    raise ValidationError(f"concurrency is a whole number, got {text!r}")
                await self.inspector.set_limit(
                    queue,
                    key,
                    concurrency=int(text) if text else None,
                    rate=form.get("rate", "").strip() or None,
                )
                notice = f"limit {key} overridden"
        except ValidationError as exc:
            notice = f"not saved: {exc.message}"
        return self.back(request, back, notice)

    # -- login ------------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        return self.render(
            request, "login.html", {"next": _safe_next(request.query_params.get("next"))}
        )

    async def login(self, request: Request) -> Response:
        form = await request.form()
        data = {k: v for k, v in form.items() if isinstance(v, str)}
        target = _safe_next(data.get("next"))
        if not security.csrf_ok(request, data.get(security.CSRF_FIELD), login=True):
            return self.error_page(request, 403, "the login form expired; reload and try again")
        if not self.dash.auth.enabled:
            return self.back(request, target, "no login needed")
        if not self.dash.auth.check_token(data.get("token")):
            self.dash.limiter.failed(security.client_of(request.scope), time.monotonic())
            return self.render(
                request, "login.html", {"next": target, "error": "wrong token"}, status=401
            )
        state = request.scope["state"]
        root = request.scope.get("root_path", "")
        response = RedirectResponse(root + target, 303)
        from durq.dashboard.app import cookie_header

        response.headers.append(
            "set-cookie",
            cookie_header(
                security.SESSION_COOKIE,
                self.dash.auth.new_session(self.dash.app.clock.now()),
                state["durq_cookie_path"],
                state["durq_cookie_secure"],
                max_age=int(self.dash.auth.session_seconds),
            ),
        )
        return response

    async def logout(self, request: Request) -> Response:
        await self.checked_form(request)
        self.dash.auth.revoke(request, self.dash.app.clock.now())
        state = request.scope["state"]
        root = request.scope.get("root_path", "")
        response = RedirectResponse(f"{root}/login", 303)
        from durq.dashboard.app import cookie_header

        response.headers.append(
            "set-cookie",
            cookie_header(
                security.SESSION_COOKIE,
                "",
                state["durq_cookie_path"],
                state["durq_cookie_secure"],
                max_age=0,
            ),
        )
        return response

    # -- actions ----------------------------------------------------------------------------

    def queue_action(self, action: str) -> Any:
        async def endpoint(request: Request) -> Response:
            await self.checked_form(request)
            name = request.path_params["queue"]
            await self.inspector.queue_stats(name)
            if action == "pause":
                await self.inspector.pause_queue(name)
            else:
                await self.inspector.unpause_queue(name)
            return self.back(request, f"/queues/{quote(name)}", f"queue {name} {action}d")

        return endpoint

    async def bulk(self, request: Request) -> Response:
        form = await self.checked_form(request)
        name = request.path_params["queue"]
        action = request.path_params["action"]
        state = parse_state(form.get("state", ""))
        if action == "run_all":
            count = await self.inspector.run_all(name, state)
            notice = f"{count} {state.value} task(s) queued to run now"
        elif action == "delete_all":
            count = await self.inspector.delete_all(name, state)
            notice = f"{count} {state.value} task(s) deleted"
        else:
            raise ValidationError(f"unknown action {action!r}")
        return self.back(request, f"/queues/{quote(name)}?state={state.value}", notice)

    async def selection(self, request: Request) -> Response:
        """The buttons under the task table: one action on the ticked tasks."""
        await self.checked_form(request)
        form = await request.form()  # parsed once; cached by Starlette
        name = request.path_params["queue"]
        action = str(form.get("action", ""))
        state = parse_state(str(form.get("state", "")) or TaskState.PENDING.value)
        ids = [v for v in form.getlist("id") if isinstance(v, str)]
        back = f"/queues/{quote(name)}?state={state.value}"
        if not ids:
            return self.back(request, back, "no task selected")
        outcomes = await self.inspector.steer_selection(name, ids, action)
        items = [selection_item(o, action) for o in outcomes]
        done = sum(1 for item in items if item["ok"])
        verb = {"run": "queued to run now", "archive": "archived", "delete": "deleted"}
        notice = f"{done} of {len(items)} task(s) {verb.get(action, action)}"
        refused = [f"{i['id']}: {i['error']['message']}" for i in items if not i["ok"]]
        if refused:
            notice += "; " + "; ".join(refused[:3]) + ("; ..." if len(refused) > 3 else "")
        return self.back(request, back, notice)

    async def task_action(self, request: Request) -> Response:
        await self.checked_form(request)
        name = request.path_params["queue"]
        task_id = request.path_params["task_id"]
        action = request.path_params["action"]
        if action not in TASK_ACTIONS:
            raise ValidationError(f"unknown action {action!r}")
        task_path = f"/queues/{quote(name)}/tasks/{quote(task_id, safe='')}"
        if action == "delete":
            info = await self.inspector.get_task_info(name, task_id)
            await self.inspector.delete_task(name, task_id)
            return self.back(
                request, f"/queues/{quote(name)}?state={info.state.value}", "task deleted"
            )
        method = {
            "run": self.inspector.run_task,
            "archive": self.inspector.archive_task,
            "cancel": self.inspector.cancel_task,
        }[action]
        info = await method(name, task_id)
        verb = {"run": "queued to run now", "archive": "archived", "cancel": "cancelled"}
        return self.back(request, task_path, f"task {verb[action]} (now {info.state.value})")


def _safe_next(target: str | None) -> str:
    """A local path to go back to after login: never another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


__all__ = ["Views", "age", "iso", "pretty", "when"]
