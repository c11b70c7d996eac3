"""The web contract as one call in a handler, for any framework.

An endpoint that hands work to a background task has three answers:

* ``202 Accepted`` with ``Location`` and ``{"status": "queued", "task_id", "queue"}``: the
  intent is saved in the broker;
* ``200 OK`` with ``{"status": "already_accepted", "task_id"}``: a task with this id (or an
  identical unique task) exists already: for the client that is success too;
* ``503 Service Unavailable`` with ``Retry-After`` and a JSON error: the broker could not be
  reached and nothing was written.

This module builds these answers framework-free as :class:`Answer`; :mod:`durq.web.asgi`
(Starlette, FastAPI) and :mod:`durq.web.wsgi` (Flask, plain WSGI) turn them into responses::

    answer = await durq.web.enqueue_answer(app, "insurance:check", {"order_id": oid},
                                            task_id=f"coverage-{oid}",
                                            location=f"/orders/{oid}")
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from durq.errors import (
    BrokerUnavailableError,
    DuplicateTaskError,
    InvalidStateError,
    PayloadError,
    StepError,
    TaskIDConflictError,
    TaskNotFoundError,
)

if TYPE_CHECKING:
    from durq.app import App
    from durq.task import TaskInfo
    from durq.taskdef import TaskDef

__all__ = [
    "DEFAULT_RETRY_AFTER",
    "Answer",
    "Location",
    "already_accepted",
    "answer_for_error",
    "enqueue_answer",
    "enqueue_answer_sync",
    "invalid_payload",
    "queued",
    "signal_answer",
    "signal_answer_sync",
    "unavailable",
]

#: Seconds a client is asked to wait before retrying while the broker is down.
DEFAULT_RETRY_AFTER = 5

#: Where the status of the accepted work lives: a fixed path, or built from the task.
Location = str | Callable[["TaskInfo"], str] | None

#: The errors an enqueue answers itself; anything else is the caller's to handle.
CONTRACT_ERRORS = (TaskIDConflictError, DuplicateTaskError, BrokerUnavailableError)


@dataclass(frozen=True)
class Answer:
    """One of the three answers: status code, JSON body and headers."""

    status_code: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        """True for 202 queued and 200 already_accepted: the work is in the broker."""
        return self.status_code in (200, 202)

    @property
    def task_id(self) -> str | None:
        """The task the answer is about (``None`` for 503)."""
        value = self.body.get("task_id")
        return str(value) if value is not None else None

    def json(self) -> str:
        """The body as compact JSON text."""
        return json.dumps(self.body, separators=(",", ":"), default=str)


def _location(location: Location, info: TaskInfo | None) -> str | None:
    if location is None or isinstance(location, str):
        return location
    if info is None:
        return None
    return location(info)


def queued(
    info: TaskInfo, *, location: Location = None, extra: Mapping[str, Any] | None = None
) -> Answer:
    """``202`` with ``Location`` and ``{"status": "queued", "task_id", "queue"}``.

    A delayed task also carries ``process_at`` (its time lives in the broker: "not earlier
    than", not "exactly at")."""
    body: dict[str, Any] = {"status": "queued", "task_id": info.id, "queue": info.queue}
    if info.next_process_at is not None and info.state.value == "scheduled":
        body["process_at"] = info.next_process_at.isoformat()
    body.update(extra or {})
    headers = {}
    where = _location(location, info)
    if where:
        headers["Location"] = where
    return Answer(202, body, headers)


def already_accepted(
    task_id: str,
    *,
    location: str | None = None,
    state: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Answer:
    """``200`` with ``{"status": "already_accepted", "task_id"}``: the work was started
    by an earlier request; a repeated POST is safe."""
    body: dict[str, Any] = {"status": "already_accepted", "task_id": task_id}
    if state is not None:
        body["state"] = state
    body.update(extra or {})
    return Answer(200, body, {"Location": location} if location else {})


def unavailable(
    message: str = "the task broker is unavailable; nothing was saved, retry later",
    *,
    retry_after: int = DEFAULT_RETRY_AFTER,
) -> Answer:
    """``503`` with ``Retry-After`` and a JSON error; nothing was written."""
    return Answer(
        503,
        {"error": {"code": "broker_unavailable", "message": message}},
        {"Retry-After": str(int(retry_after))},
    )


def invalid_payload(exc: PayloadError) -> Answer:
    """``422`` in FastAPI's shape for a payload the task refused: ``{"detail": [{"type",
    "loc", "msg"}]}``, ``loc`` starting with ``"payload"`` then the field's path."""
    found = exc.context.get("problems") or [
        {"type": "payload_error", "loc": [], "msg": exc.message}
    ]
    detail = [{"type": p["type"], "loc": ["payload", *p["loc"]], "msg": p["msg"]} for p in found]
    return Answer(422, {"detail": detail})


def answer_for_error(
    exc: BaseException,
    *,
    location: Location = None,
    retry_after: int = DEFAULT_RETRY_AFTER,
    extra: Mapping[str, Any] | None = None,
) -> Answer | None:
    """The contract answer for an enqueue error, or ``None`` if it is not one of the three."""
    if isinstance(exc, TaskIDConflictError):
        existing = exc.existing
        task_id = existing.id if existing is not None else str(exc.context.get("task_id", ""))
        return already_accepted(
            task_id,
            location=_location(location, existing),
            state=existing.state.value if existing is not None else None,
            extra=extra,
        )
    if isinstance(exc, DuplicateTaskError) and exc.existing_id:
        where = location if isinstance(location, str) else None
        return already_accepted(exc.existing_id, location=where, extra=extra)
    if isinstance(exc, BrokerUnavailableError):
        return unavailable(retry_after=retry_after)
    return None


async def enqueue_answer(
    app: App,
    type: str | TaskDef[Any, Any],
    payload: Any = None,
    *,
    location: Location = None,
    retry_after: int = DEFAULT_RETRY_AFTER,
    extra: Mapping[str, Any] | None = None,
    **options: Any,
) -> Answer:
    """Enqueue and return the contract answer; options as :meth:`durq.App.enqueue`.

    Validation errors (:class:`~durq.PayloadError`, invalid names) are raised, not answered:
    they are the caller's bug or the client's bad input, which the handler maps to 4xx."""
    try:
        # A twin is answered 200 already_accepted, whatever the Unique says it returns.
        info = await app.enqueue(type, payload, **{**options, "on_conflict": "raise"})
    except CONTRACT_ERRORS as exc:
        answer = answer_for_error(exc, location=location, retry_after=retry_after, extra=extra)
        if answer is None:
            raise
        return answer
    return queued(info, location=location, extra=extra)


def enqueue_answer_sync(
    app: App,
    type: str | TaskDef[Any, Any],
    payload: Any = None,
    *,
    location: Location = None,
    retry_after: int = DEFAULT_RETRY_AFTER,
    extra: Mapping[str, Any] | None = None,
    **options: Any,
) -> Answer:
    """Blocking :func:`enqueue_answer` for WSGI code (uses :meth:`durq.App.enqueue_sync`)."""
    try:
        info = app.enqueue_sync(type, payload, **{**options, "on_conflict": "raise"})
    except CONTRACT_ERRORS as exc:
        answer = answer_for_error(exc, location=location, retry_after=retry_after, extra=extra)
        if answer is None:
            raise
        return answer
    return queued(info, location=location, extra=extra)


async def signal_answer(
    app: App,
    task: TaskInfo | str,
    name: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    retry_after: int = DEFAULT_RETRY_AFTER,
) -> Answer:
    """Turn an inbound webhook into a signal (:meth:`durq.App.signal`) and answer it:
    ``200 {"status": "delivered"}``, or ``"already_delivered"`` for a sender that calls
    twice (nothing changes); ``404`` when there is no such task; ``409`` when it has
    finished; ``422`` for a payload or name that cannot be a signal; ``503`` with
    ``Retry-After`` while the broker is down (nothing was written: the sender should retry)."""
    try:
        delivered = await app.signal(task, name, payload, queue=queue)
    except SIGNAL_ERRORS as exc:
        return _signal_error(exc, retry_after)
    return _signalled(task, name, delivered)


def signal_answer_sync(
    app: App,
    task: TaskInfo | str,
    name: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    retry_after: int = DEFAULT_RETRY_AFTER,
) -> Answer:
    """Blocking :func:`signal_answer` for WSGI code."""
    return app.run_sync(
        lambda: signal_answer(app, task, name, payload, queue=queue, retry_after=retry_after)
    )


def _signalled(task: TaskInfo | str, name: str, delivered: bool) -> Answer:
    task_id = task if isinstance(task, str) else task.id
    status = "delivered" if delivered else "already_delivered"
    return Answer(200, {"status": status, "task_id": task_id, "signal": name})


#: The errors a signal answers itself; anything else is the caller's to handle.
SIGNAL_ERRORS = (
    BrokerUnavailableError,
    TaskNotFoundError,
    InvalidStateError,
    PayloadError,
    StepError,
)


def _signal_error(exc: Exception, retry_after: int) -> Answer:
    if isinstance(exc, BrokerUnavailableError):
        return unavailable(retry_after=retry_after)
    status, code = (
        (404, "not_found")
        if isinstance(exc, TaskNotFoundError)
        else (409, "task_finished")
        if isinstance(exc, InvalidStateError)
        else (422, "invalid_signal")
    )
    return Answer(status, {"error": {"code": code, "message": str(exc)}})
