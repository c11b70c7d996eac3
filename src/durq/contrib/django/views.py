"""durq's page in Django's admin: queues with their sizes per state, the tasks of one queue
and state, and three actions on a task (run now, cancel, delete).

It is the change list of the unmanaged ``durq.Task`` model (:mod:`durq.contrib.django.admin`),
so it sits in the admin's index and sidebar and uses Django's staff login, permissions and
CSRF protection, under WSGI or ASGI, with no second server:

* ``durq.view_task``: see the page;
* ``durq.change_task``: run a scheduled, retrying or archived task now, cancel a task;
* ``durq.delete_task``: delete a task that is not running.

Superusers have all three. ``?backend=<alias>`` picks a ``TASKS`` backend (default: the
first durq one). Pausing queues, bulk moves and history stay with ``durq dash`` and the
``durq`` command line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.tasks import task_backends
from django.urls import reverse

from durq.contrib.django.backend import DurqBackend
from durq.errors import DurqError, ValidationError
from durq.inspector import parse_state
from durq.states import TaskState

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

PAGE = 50

#: Each action: the inspector's method, the permission it needs, the states it applies to
#: (the buttons shown; the inspector refuses any other move), and what the message says.
ACTIONS: dict[str, tuple[str, str, frozenset[TaskState], str]] = {
    "run": (
        "run_task",
        "change",
        frozenset({TaskState.SCHEDULED, TaskState.RETRY, TaskState.ARCHIVED}),
        "will run now",
    ),
    "cancel": (
        "cancel_task",
        "change",
        frozenset(
            {
                TaskState.PENDING,
                TaskState.SCHEDULED,
                TaskState.RETRY,
                TaskState.ACTIVE,
                TaskState.WAITING,
            }
        ),
        "cancelled",
    ),
    "delete": (
        "delete_task",
        "delete",
        frozenset(TaskState) - {TaskState.ACTIVE},
        "deleted",
    ),
}


def durq_backends() -> list[DurqBackend]:
    """The ``TASKS`` backends that are durq's."""
    return [b for b in task_backends.all() if isinstance(b, DurqBackend)]


def backend_named(alias: str | None) -> DurqBackend:
    """The durq backend ``alias`` (``None``: the first one); 404 if there is none."""
    if alias is None:
        found = durq_backends()
        if not found:
            raise Http404("no durq backend in TASKS")
        return found[0]
    try:
        backend = task_backends[alias]
    except Exception:
        raise Http404("no such task backend") from None
    if not isinstance(backend, DurqBackend):
        raise Http404("not a durq task backend")
    return backend


def task_page(
    request: HttpRequest, model_admin: ModelAdmin[Any], extra_context: dict[str, Any] | None
) -> HttpResponse:
    """The admin page (GET), or one action on a task (POST, then back to the page)."""
    if not model_admin.has_view_or_change_permission(request):
        raise PermissionDenied
    backend = backend_named(request.GET.get("backend"))
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": "durq tasks",
        "subtitle": backend.alias,
        "alias": backend.alias,
        "aliases": [b.alias for b in durq_backends()],
        **(extra_context or {}),
    }
    if request.method == "POST":
        return _act(request, model_admin, backend)
    inspector = backend.app.inspector
    queue = request.GET.get("queue") or ""
    try:
        state = parse_state(request.GET.get("state") or "pending")
        queues = backend.call(inspector.list_queues)
        tasks: list[Any] = []
        if queue:
            tasks = backend.call(lambda: inspector.list_tasks(queue, state, limit=PAGE))
    except DurqError as exc:
        status = 400 if isinstance(exc, ValidationError) else 503
        context["error"] = str(exc)
        return render(request, "durq_django/overview.html", context, status=status)
    allowed = {
        name: _permitted(model_admin, request, perm) and state in states
        for name, (_, perm, states, _) in ACTIONS.items()
    }
    context.update(
        queues=[
            {
                "name": q.name,
                "paused": q.paused,
                "sizes": [(st.value, q.sizes.get(st, 0)) for st in TaskState],
            }
            for q in queues
        ],
        states=[s.value for s in TaskState],
        queue=queue,
        state=state.value,
        tasks=[t.to_dict() for t in tasks],
        actions=[name for name, ok in allowed.items() if ok],
        page_url=request.get_full_path(),
    )
    return render(request, "durq_django/overview.html", context)


def _permitted(model_admin: ModelAdmin[Any], request: HttpRequest, perm: str) -> bool:
    if perm == "delete":
        return bool(model_admin.has_delete_permission(request))
    return bool(model_admin.has_change_permission(request))


def _act(request: HttpRequest, model_admin: ModelAdmin[Any], backend: DurqBackend) -> HttpResponse:
    """Run one action from the page's form; CSRF is checked by the admin's view wrapper."""
    action = request.POST.get("action", "")
    if action not in ACTIONS:
        return HttpResponse("unknown action", status=400, content_type="text/plain")
    method_name, perm, _, done = ACTIONS[action]
    if not _permitted(model_admin, request, perm):
        raise PermissionDenied
    queue, task_id = request.POST.get("queue", ""), request.POST.get("task_id", "")
    method = getattr(backend.app.inspector, method_name)
    try:
        backend.call(lambda: method(queue, task_id))
    except DurqError as exc:
        messages.error(request, f"{action} {task_id}: {exc}")
    else:
        messages.success(request, f"task {task_id} {done}")
    # Back to the page the form was on (a path of this admin only: no open redirect).
    back = request.POST.get("next", "")
    changelist = reverse(f"{model_admin.admin_site.name}:durq_task_changelist")
    if not back.startswith(changelist + "?") and back != changelist:
        back = changelist
    return HttpResponseRedirect(back)


def legacy_overview(request: HttpRequest, alias: str | None = None) -> HttpResponse:
    """The page's first URL (``include("durq.contrib.django.urls")`` before the admin's),
    kept for links and bookmarks: it now redirects to the admin's own page."""
    target = reverse("admin:durq_task_changelist")
    query = request.GET.copy()
    if alias is not None:
        query["backend"] = alias
    return HttpResponseRedirect(f"{target}?{query.urlencode()}" if query else target)
