"""A read-only page of durq's queues and tasks inside Django's admin, for staff only.

Mount it before the admin's own URLs::

    urlpatterns = [path("admin/durq/", include("durq.contrib.django.urls")),
                   path("admin/", admin.site.urls)]

Read-only on purpose: it uses Django's staff login and nothing else, under WSGI or ASGI, with
no second server. Steering tasks (run, delete, cancel, pause) stays with ``durq dash`` and
the ``durq`` CLI, which have their own authentication and CSRF protection."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.tasks import task_backends

from durq.contrib.django.backend import DurqBackend
from durq.errors import DurqError
from durq.inspector import parse_state
from durq.states import TaskState

PAGE = 50


def _backend(alias: str) -> DurqBackend:
    try:
        backend = task_backends[alias]
    except Exception:
        raise Http404("no such task backend") from None
    if not isinstance(backend, DurqBackend):
        raise Http404("not a durq task backend")
    return backend


@staff_member_required  # type: ignore[untyped-decorator]
def overview(request: HttpRequest, alias: str = "default") -> HttpResponse:
    """Queues with their sizes per state; the tasks of one queue and state."""
    backend = _backend(alias)
    inspector = backend.app.inspector
    queue = request.GET.get("queue") or ""
    try:
        state = parse_state(request.GET.get("state") or "pending")
        queues = backend.call(inspector.list_queues)
        tasks: list[Any] = []
        if queue:
            tasks = backend.call(lambda: inspector.list_tasks(queue, state, limit=PAGE))
    except DurqError as exc:
        return render(
            request,
            "durq_django/overview.html",
            {**admin.site.each_context(request), "title": "durq tasks", "error": str(exc)},
            status=400 if "invalid" in str(exc) or "unknown" in str(exc) else 503,
        )
    context = {
        **admin.site.each_context(request),
        "title": f"durq tasks ({alias})",
        "alias": alias,
        "queues": [
            {
                "name": q.name,
                "paused": q.paused,
                "sizes": [(st.value, q.sizes.get(st, 0)) for st in TaskState],
            }
            for q in queues
        ],
        "states": [s.value for s in TaskState],
        "queue": queue,
        "state": state.value,
        "tasks": [t.to_dict() for t in tasks],
    }
    return render(request, "durq_django/overview.html", context)
