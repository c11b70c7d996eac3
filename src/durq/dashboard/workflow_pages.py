"""The dashboard's workflow pages: a list searched by state and age, and one workflow drawn as
an SVG graph laid out on the server (:mod:`.graph`), each node linking to its task."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from durq import durations
from durq.dashboard.graph import layout
from durq.errors import ValidationError
from durq.workflow_progress import GONE, WORKFLOW_STATES

if TYPE_CHECKING:
    from durq.dashboard.views import Views

#: Workflows on one page of the list.
PAGE_SIZE = 50
#: Query parameters of the list.
LIST_PARAMS = frozenset({"state", "newer_than", "older_than", "cursor", "notice", "ns"})
#: The ages the list's form offers (any duration text is accepted in the URL).
AGES = (("", "any time"), ("1h", "1 hour"), ("1d", "1 day"), ("7d", "7 days"), ("30d", "30 days"))
#: Task states in the order the graph's legend shows them.
LEGEND = ("waiting", "pending", "scheduled", "active", "retry", "completed", "archived", GONE)


def _age(request: Request, name: str) -> tuple[str, float | None]:
    text = request.query_params.get(name, "").strip()
    if not text:
        return "", None
    try:
        return text, durations.parse(text)
    except ValidationError:
        raise ValidationError(f"{name} must be a duration such as 90s, 2h or 7d") from None


class WorkflowPages:
    """``/workflows``, ``/workflows/{id}`` and its cancel form, rendered by ``views``."""

    def __init__(self, views: Views) -> None:
        self.views = views
        self.inspector = views.inspector

    def routes(self) -> list[Route]:
        w = "/workflows/{workflow_id}"
        return [
            Route("/workflows", self.list_page, methods=["GET"]),
            Route(w, self.workflow_page, methods=["GET"]),
            Route(w + "/cancel", self.cancel, methods=["POST"]),
        ]

    async def list_page(self, request: Request) -> Response:
        """Workflows newest first, by state and age, a page at a time (a cursor)."""
        unknown = sorted(k for k in request.query_params if k not in LIST_PARAMS)
        if unknown:
            raise ValidationError(
                f"unknown query parameter(s) {', '.join(map(repr, unknown))}: "
                "search with state, newer_than and older_than"
            )
        state = request.query_params.get("state") or None
        newer_text, newer = _age(request, "newer_than")
        older_text, older = _age(request, "older_than")
        cursor = request.query_params.get("cursor") or None
        page = await self.inspector.list_workflows(
            state=state, newer_than=newer, older_than=older, limit=PAGE_SIZE, cursor=cursor
        )
        search = {"state": state or "", "newer_than": newer_text, "older_than": older_text}
        more = None
        if page.cursor is not None:
            more = "?" + urlencode(
                {**{k: v for k, v in search.items() if v}, "cursor": page.cursor}
            )
        return self.views.render(
            request,
            "workflows.html",
            {
                "nav": "workflows",
                "workflows": page.workflows,
                "states": WORKFLOW_STATES,
                "ages": AGES,
                "search": search,
                "searched": any(search.values()),
                "paged": cursor is not None,
                "more": more,
            },
        )

    async def workflow_page(self, request: Request) -> Response:
        """One workflow: its progress, its graph and its nodes."""
        info = await self.inspector.get_workflow(request.path_params["workflow_id"])
        context: dict[str, Any] = {
            "nav": "workflows",
            "wf": info,
            "graph": layout(info.nodes),
            "legend": LEGEND,
            "can_cancel": info.finished < info.total,
        }
        return self.views.render(request, "workflow.html", context)

    async def cancel(self, request: Request) -> Response:
        """The workflow page's cancel button."""
        await self.views.checked_form(request)
        workflow_id = request.path_params["workflow_id"]
        cancelled = await self.inspector.cancel_workflow(workflow_id)
        return self.views.back(
            request,
            f"/workflows/{quote(workflow_id, safe='')}",
            f"{cancelled} node(s) cancelled; running ones stop when their workers see it",
        )
