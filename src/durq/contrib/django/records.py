"""How a Django task lives in durq, and how durq's task record reads back as a TaskResult.

A Django task is one durq task whose type is the function's module path and whose payload is
``{"args": [...], "kwargs": {...}}``; its priority is durq's (the same -100..100 range, higher
first). Headers carry the backend alias and the ``run_after`` the task was enqueued with, so
the reconstructed ``Task`` equals the enqueued one.

Errors: a failed attempt is stored as any durq task's is: ``last_error`` is
``"ValueError: boom"`` and the traceback is kept beside it (``durq task get``, the
dashboard). The worker adds one note line to the exception before durq formats it,
``django task failed at <ISO time>: <exception class path>``, so the ``TaskError`` (class
path, traceback without that line) and the time the task finished come back from the
record."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
from django.utils import timezone

from durq.options import MAX_PRIORITY, MIN_PRIORITY
from durq.states import TaskState
from durq.task import TaskInfo

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
    # Waits for other tasks (after=): queued, not running yet.
    TaskState.WAITING: TaskResultStatus.READY,
}

#: The note the worker adds to a failed attempt's exception (see the module docstring).
_NOTE = re.compile(r"^django task failed at (\S+): ([A-Za-z_][\w.]*)$", re.MULTILINE)
#: How errors were stored before the note: ``"<class path> @ <ISO time>"``, then the
#: traceback, all in ``last_error``. Records written then still read back.
_OLD_FIRST_LINE = re.compile(r"^([A-Za-z_][\w.]*) @ (\S+)$")


class TaskInterrupted(Exception):
    """The attempt ended without an exception of the task's own: it timed out, its lease
    expired or its worker was lost, it was cancelled, or no worker knew its function. The
    ``TaskError``'s traceback holds durq's reason."""


def class_path(exc_type: type[BaseException]) -> str:
    """``module.QualName`` of an exception class, as Django's ``TaskError`` stores it."""
    return f"{exc_type.__module__}.{exc_type.__qualname__}"


def note_failure(exc: BaseException, exc_type: type[BaseException], at: datetime) -> None:
    """Add the note that lets :func:`decode_error` read ``exc``'s record back; ``exc_type``
    is the class the task raised (``exc`` may stand in for it)."""
    exc.add_note(f"django task failed at {at.astimezone(UTC).isoformat()}: {class_path(exc_type)}")


def decode_error(
    last_error: str, traceback: str | None = None
) -> tuple[TaskError, datetime | None]:
    """A ``TaskError`` (and when the attempt failed, if recorded) from a stored error."""
    matches = list(_NOTE.finditer(traceback or ""))
    if traceback and matches:
        note = matches[-1]
        text = traceback[: note.start()] + traceback[note.end() + 1 :]
        return TaskError(exception_class_path=note.group(2), traceback=text), _time(note.group(1))
    first, sep, rest = last_error.partition("\n")
    old = _OLD_FIRST_LINE.fullmatch(first) if sep else None
    if old is not None:
        return TaskError(exception_class_path=old.group(1), traceback=rest), _time(old.group(2))
    if last_error.startswith(("timeout after", "deadline exceeded")):
        path = class_path(TimeoutError)
    else:
        path = class_path(TaskInterrupted)
    return TaskError(exception_class_path=path, traceback=traceback or last_error), None


def _time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


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
        error, failed_at = decode_error(info.last_error, info.traceback)
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
