"""How a Django task lives in durq, and how durq's task record reads back as a TaskResult.

A Django task is one durq task whose type is the function's module path and whose payload is
``{"args": [...], "kwargs": {...}}``; its priority is durq's (the same -100..100 range, higher
first). Headers carry the backend alias and the ``run_after`` the task was enqueued with, so
the reconstructed ``Task`` equals the enqueued one.

Errors: durq keeps the last error of a task as text. For a Django task that text is
``"<exception class path> @ <ISO time it failed>"`` on the first line and the traceback after
it (the tail, if it is long), so a ``TaskError`` with class path and traceback, and the time
the task finished, come back from the record."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from traceback import format_exception
from typing import Any

from django.conf import settings
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
from django.utils import timezone

from durq.options import MAX_PRIORITY, MIN_PRIORITY
from durq.states import TaskState
from durq.task import TaskInfo
from durq.worker.executor import MAX_ERROR

#: Headers of a Django task (durq carries them from the enqueuer to the worker).
HEADER_BACKEND = "django-backend"
HEADER_RUN_AFTER = "django-run-after"

STATUS = {
    TaskState.PENDING: TaskResultStatus.READY,
    TaskState.SCHEDULED: TaskResultStatus.READY,
    # A failed attempt with attempts left is ready to be executed again.
    TaskState.RETRY: TaskResultStatus.READY,
    TaskState.ACTIVE: TaskResultStatus.RUNNING,
    TaskState.COMPLETED: TaskResultStatus.SUCCESSFUL,
    TaskState.ARCHIVED: TaskResultStatus.FAILED,
}

_FIRST_LINE = re.compile(r"^([A-Za-z_][\w.]*) @ (\S+)$")
# Room for the first line: a class path and an ISO time.
_HEAD_ROOM = 300


class TaskInterrupted(Exception):
    """The attempt ended without an exception of the task's own: it timed out, its lease
    expired or its worker was lost, it was cancelled, or no worker knew its function. The
    ``TaskError``'s traceback holds durq's reason."""


def class_path(exc_type: type[BaseException]) -> str:
    """``module.QualName`` of an exception class, as Django's ``TaskError`` stores it."""
    return f"{exc_type.__module__}.{exc_type.__qualname__}"


def encode_error(exc: BaseException, at: datetime) -> str:
    """The ``last_error`` text of a failed attempt: class path and time, then the traceback.

    durq clips stored errors to :data:`~durq.worker.executor.MAX_ERROR` characters from the
    end; the end of a traceback is what matters, so a long one keeps its tail here."""
    text = "".join(format_exception(exc))
    budget = MAX_ERROR - _HEAD_ROOM
    if len(text) > budget:
        text = "…\n" + text[-(budget - 2) :]
    return f"{class_path(type(exc))} @ {at.astimezone(UTC).isoformat()}\n{text}"


def decode_error(text: str) -> tuple[TaskError, datetime | None]:
    """A ``TaskError`` (and when the attempt failed, if recorded) from a stored ``last_error``."""
    first, sep, rest = text.partition("\n")
    match = _FIRST_LINE.fullmatch(first) if sep else None
    if match is not None:
        try:
            at: datetime | None = datetime.fromisoformat(match.group(2))
        except ValueError:
            at = None
        return TaskError(exception_class_path=match.group(1), traceback=rest), at
    if text.startswith(("timeout after", "deadline exceeded")):
        path = class_path(TimeoutError)
    else:
        path = class_path(TaskInterrupted)
    return TaskError(exception_class_path=path, traceback=text), None


def local_time(value: datetime | None) -> datetime | None:
    """durq's aware UTC times as Django expects them (naive local when ``USE_TZ`` is off)."""
    if value is None or settings.USE_TZ:
        return value
    naive: datetime = timezone.make_naive(value)
    return naive


def attempts(info: TaskInfo) -> int:
    """Attempts started so far: durq counts finished attempts in ``retried`` except that a
    success does not count one, and a running attempt has not been counted yet."""
    if info.state in (TaskState.ACTIVE, TaskState.COMPLETED):
        return info.retried + 1
    return info.retried


def to_result(info: TaskInfo, task: Task, alias: str) -> TaskResult:
    """The ``TaskResult`` of a durq task record."""
    payload = info.payload
    status = STATUS[info.state]
    errors: list[TaskError] = []
    failed_at: datetime | None = None
    if info.last_error:
        error, failed_at = decode_error(info.last_error)
        errors.append(error)
    finished_at = None
    if status is TaskResultStatus.SUCCESSFUL:
        finished_at = info.completed_at
    elif status is TaskResultStatus.FAILED:
        finished_at = failed_at
    count = attempts(info)
    result = TaskResult(
        task=task,
        id=info.id,
        status=status,
        enqueued_at=local_time(info.enqueued_at),
        # durq keeps the start of the current or last attempt only.
        started_at=local_time(info.started_at),
        last_attempted_at=local_time(info.started_at),
        finished_at=local_time(finished_at),
        args=list(payload.get("args", [])),
        kwargs=dict(payload.get("kwargs", {})),
        backend=alias,
        errors=errors,
        # durq records the worker of the last attempt only: one entry per attempt, each
        # naming it, so ``attempts`` (the list's length) is right.
        worker_ids=[info.worker_id] * count if info.worker_id else ["unknown"] * count,
    )
    if status is TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", info.result)
    return result


def django_to_durq_priority(priority: int) -> int:
    """Django's task priority as durq's: both run from -100 to 100, higher first, default 0,
    so the value carries over unchanged (Django validates the range before this)."""
    return max(MIN_PRIORITY, min(MAX_PRIORITY, priority))


def durq_to_django_priority(priority: int) -> int:
    """durq's task priority as Django's (see :func:`django_to_durq_priority`)."""
    return int(max(TASK_MIN_PRIORITY, min(TASK_MAX_PRIORITY, priority)))


def task_headers(task: Task, alias: str) -> dict[str, str]:
    """What the worker and ``get_result`` need to rebuild the enqueued ``Task``."""
    headers = {HEADER_BACKEND: alias}
    if task.run_after is not None:
        headers[HEADER_RUN_AFTER] = task.run_after.isoformat()
    return headers


def rebuild(base: Task, info: TaskInfo) -> Task:
    """The enqueued ``Task``: ``base`` (the registered function) with the stored options."""
    headers = info.headers
    run_after = headers.get(HEADER_RUN_AFTER)
    changes: dict[str, Any] = {
        "queue_name": info.queue,
        "backend": headers.get(HEADER_BACKEND, base.backend),
        "priority": durq_to_django_priority(info.priority),
        "run_after": datetime.fromisoformat(run_after) if run_after else None,
    }
    if all(getattr(base, k) == v for k, v in changes.items()):
        return base
    from dataclasses import replace

    return replace(base, **changes)
