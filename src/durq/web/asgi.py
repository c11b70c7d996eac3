"""ASGI helpers (Starlette, FastAPI): the contract as a response, the monolith lifespan and a
dependency that hands handlers the app's client.

::

    durq_app = durq.App()
    api = FastAPI(lifespan=durq_lifespan(durq_app, worker=True))   # monolith

    @api.post("/reports")
    async def create(body: ReportIn, app: durq.App = Depends(get_durq)):
        return await enqueue_response(app, "report:build", body, location="/reports/1")

With ``worker=False`` the same API runs split: ``uvicorn`` here and ``durq worker`` elsewhere,
both pointed at the same broker; nothing else changes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse

from durq.clock import FakeClock
from durq.errors import PayloadError
from durq.web import DEFAULT_RETRY_AFTER, Answer, Location, enqueue_answer, invalid_payload

if TYPE_CHECKING:
    from durq.app import App
    from durq.taskdef import TaskDef
    from durq.worker.server import Worker

__all__ = [
    "DurqLifespan",
    "durq_lifespan",
    "enqueue_response",
    "get_durq",
    "get_worker",
    "run_worker",
    "to_response",
]

log = logging.getLogger("durq.web")

#: Where the lifespan puts the app and the worker on ``asgi_app.state``.
STATE_APP, STATE_WORKER = "durq", "durq_worker"

Lifespan = Callable[[Any], contextlib.AbstractAsyncContextManager[Any]]


def to_response(answer: Answer) -> JSONResponse:
    """An :class:`~durq.web.Answer` as a Starlette ``JSONResponse``."""
    return JSONResponse(answer.body, status_code=answer.status_code, headers=answer.headers)


async def enqueue_response(
    app: App,
    type: str | TaskDef[Any, Any],
    payload: Any = None,
    *,
    location: Location = None,
    retry_after: int = DEFAULT_RETRY_AFTER,
    extra: Mapping[str, Any] | None = None,
    **options: Any,
) -> JSONResponse:
    """Enqueue and answer 202 queued · 200 already_accepted · 503 in one call, and a payload
    the task's model refuses with 422 in FastAPI's shape (``{"detail": [...]}``).

    Options as :meth:`durq.App.enqueue` (``task_id``, ``queue``, ``process_in``,
    ``connection``…)."""
    try:
        answer = await enqueue_answer(
            app, type, payload, location=location, retry_after=retry_after, extra=extra, **options
        )
    except PayloadError as exc:  # the client's bad input, as FastAPI answers its own
        answer = invalid_payload(exc)
    return to_response(answer)


@contextlib.asynccontextmanager
async def run_worker(app: App, **options: Any) -> AsyncIterator[Worker]:
    """Run a worker of ``app`` on the current loop for the duration of the block (monolith).

    Leaving the block stops it gracefully: no new claims, running tasks get
    ``shutdown_timeout`` seconds, the rest go back to pending without losing an attempt."""
    worker = app.worker(**options)
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop()


class DurqLifespan:
    """The lifespan :func:`durq_lifespan` returns: call it with the ASGI app for the context
    manager Starlette enters. It keeps ``app`` so that :func:`get_durq` finds it on an ASGI
    app whose lifespan never ran (httpx's ``ASGITransport``, a ``TestClient`` used without
    ``with``)."""

    def __init__(
        self, app: App, worker: bool | Mapping[str, Any] = False, inner: Lifespan | None = None
    ) -> None:
        self.app = app
        self.worker = worker
        self.inner = inner

    def __call__(self, asgi_app: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._run(asgi_app)

    @contextlib.asynccontextmanager
    async def _run(self, asgi_app: Any) -> AsyncIterator[Any]:
        app = self.app
        state = getattr(asgi_app, "state", None)
        if state is not None:
            setattr(state, STATE_APP, app)
        try:
            async with contextlib.AsyncExitStack() as stack:
                stack.push_async_callback(app.close)
                inner_state = None
                if self.inner is not None:
                    inner_state = await stack.enter_async_context(self.inner(asgi_app))
                if self.worker and isinstance(app.clock, FakeClock):
                    # The testing kit gave the app its fake clock: the test runs the tasks
                    # with drain(), and a second worker here would take them first.
                    log.info("durq_lifespan: fake clock, no worker (the test drains)")
                elif self.worker:
                    options = dict(self.worker) if isinstance(self.worker, Mapping) else {}
                    # The worker shares the loop with the requests: they come first.
                    options.setdefault("yield_to_requests", True)
                    running = await stack.enter_async_context(run_worker(app, **options))
                    if state is not None:
                        setattr(state, STATE_WORKER, running)
                yield inner_state
        finally:
            if state is not None:
                setattr(state, STATE_WORKER, None)


def durq_lifespan(
    app: App,
    *,
    worker: bool | Mapping[str, Any] = False,
    inner: Lifespan | None = None,
) -> DurqLifespan:
    """A Starlette/FastAPI ``lifespan`` that opens ``app``'s client and, with ``worker``, runs
    the durq worker inside the web process.

    ``worker`` is ``True`` or a mapping of :class:`~durq.Worker` options; the worker gives
    way to requests (``yield_to_requests``, on unless the mapping says ``False``): it claims
    nothing while the shared event loop is late. ``inner``: the
    service's own lifespan, run inside ours (its resources exist while tasks run).
    Shutdown order: the server has stopped taking requests, then the worker drains, then
    ``inner`` closes, then the client. Handlers find the app with :func:`get_durq`.

    Under the testing kit (the app has a :class:`~durq.clock.FakeClock`) no worker runs:
    the test's ``drain()`` runs the tasks."""
    return DurqLifespan(app, worker, inner)


def get_durq(conn: HTTPConnection) -> App:
    """FastAPI dependency (``app: durq.App = Depends(get_durq)``): the app's client.

    Finds the app :func:`durq_lifespan` was given, whether or not the lifespan ran (an ASGI
    test client may skip it), or ``asgi_app.state.durq = app`` set by hand."""
    app: App | None = getattr(conn.app.state, STATE_APP, None)
    if app is None:
        router = getattr(conn.app, "router", None)
        lifespan = getattr(router, "lifespan_context", None)
        if isinstance(lifespan, DurqLifespan):
            app = lifespan.app
    if app is None:
        raise RuntimeError(
            "no durq app on this ASGI app: use lifespan=durq_lifespan(app), "
            "or set asgi_app.state.durq = app"
        )
    return app


def get_worker(conn: HTTPConnection) -> Worker | None:
    """The in-process worker when running as a monolith, else ``None``."""
    worker: Worker | None = getattr(conn.app.state, STATE_WORKER, None)
    return worker
