"""WSGI helpers (Flask, plain WSGI): the contract through the sync face, and a worker thread
for the monolith.

::

    durq_app = durq.App()
    flask_app = Flask(__name__)
    init_app(flask_app, durq_app, worker=True)        # monolith; False: split

    @flask_app.post("/reports")
    def create():
        return enqueue_response(get_durq(), "report:build", request.get_json(),
                                location="/reports/1")     # Flask takes the triple

Without Flask, :func:`wsgi_response` turns an answer into a WSGI application.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from durq.errors import PayloadError
from durq.web import (
    DEFAULT_RETRY_AFTER,
    Answer,
    Location,
    enqueue_answer_sync,
    invalid_payload,
)

if TYPE_CHECKING:
    from durq.app import App
    from durq.taskdef import TaskDef
    from durq.worker.server import Worker

__all__ = [
    "BackgroundWorker",
    "enqueue_response",
    "flask_response",
    "get_durq",
    "init_app",
    "to_triple",
    "wsgi_response",
]

log = logging.getLogger("durq.web")

_REASONS = {200: "OK", 202: "Accepted", 503: "Service Unavailable"}
EXTENSION = "durq"

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def to_triple(answer: Answer) -> tuple[str, int, dict[str, str]]:
    """``(body, status, headers)``: what a Flask view may return as is."""
    headers = {"Content-Type": "application/json", **answer.headers}
    return answer.json(), answer.status_code, headers


def flask_response(answer: Answer) -> Any:
    """A ``flask.Response`` for the answer (needs Flask installed)."""
    from flask import Response

    body, status, headers = to_triple(answer)
    return Response(body, status=status, headers=headers)


def wsgi_response(answer: Answer) -> WSGIApp:
    """A WSGI application that sends the answer (for frameworks without Flask's triples)."""

    def application(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        body, status, headers = to_triple(answer)
        data = body.encode()
        reason = _REASONS.get(status, "")
        start_response(
            f"{status} {reason}".strip(),
            [*headers.items(), ("Content-Length", str(len(data)))],
        )
        return [data]

    return application


def enqueue_response(
    app: App,
    type: str | TaskDef[Any, Any],
    payload: Any = None,
    *,
    location: Location = None,
    retry_after: int = DEFAULT_RETRY_AFTER,
    extra: Mapping[str, Any] | None = None,
    **options: Any,
) -> tuple[str, int, dict[str, str]]:
    """Enqueue (blocking) and answer 202 · 200 already_accepted · 503 as a Flask
    triple, and a payload the task's model refuses with 422 (``{"detail": [...]}``, the shape
    FastAPI and the ASGI helper answer). With ``connection=`` a sync psycopg connection, the
    task joins its transaction."""
    try:
        answer = enqueue_answer_sync(
            app, type, payload, location=location, retry_after=retry_after, extra=extra, **options
        )
    except PayloadError as exc:  # the client's bad input, never a 500
        answer = invalid_payload(exc)
    return to_triple(answer)


class BackgroundWorker:
    """A durq worker on its own thread and event loop, inside a WSGI process (monolith).

    ``start()`` returns once the worker takes tasks; ``stop()`` is graceful."""

    def __init__(self, app: App, **options: Any) -> None:
        self.app = app
        self.options = options
        self.worker: Worker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._stop_requested: asyncio.Event | None = None
        self._grace: float | None = None

    def start(self, timeout: float = 30.0) -> None:
        """Start the thread and wait until the worker runs (raises its start-up error)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._main, name="durq-worker", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError("the durq worker did not start in time")
        if self._error is not None:
            error, self._error, self._thread = self._error, None, None
            raise error

    def _main(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._run())
        finally:
            loop.close()

    async def _run(self) -> None:
        worker = self.worker = self.app.worker(**self.options)
        try:
            await worker.start()
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._stop_requested = asyncio.Event()
        self._started.set()
        await self._stop_requested.wait()
        await worker.stop(self._grace)

    def stop(self, timeout: float | None = None) -> None:
        """Stop gracefully and join the thread (idempotent)."""
        thread, loop, event = self._thread, self._loop, self._stop_requested
        if thread is None or loop is None or event is None:
            return
        self._grace = timeout
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:  # the loop has already closed
            pass
        thread.join()
        self._thread = None


def init_app(flask_app: Any, app: App, *, worker: bool | Mapping[str, Any] = False) -> None:
    """Attach ``app`` to a Flask app (``get_durq()`` finds it); with ``worker`` run a
    :class:`BackgroundWorker` in this process, stopped at interpreter exit."""
    flask_app.extensions[EXTENSION] = app
    if worker:
        options = dict(worker) if isinstance(worker, Mapping) else {}
        background = BackgroundWorker(app, **options)
        background.start()
        flask_app.extensions[f"{EXTENSION}_worker"] = background
        atexit.register(background.stop)


def get_durq() -> App:
    """The durq app attached to the current Flask app by :func:`init_app`."""
    from flask import current_app

    app: App = current_app.extensions[EXTENSION]
    return app
