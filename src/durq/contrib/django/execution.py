"""Running Django tasks in a durq worker: one durq handler per Django task function.

Sync functions get a sync handler (durq runs it in its thread pool, so each thread has its
own database connections); async functions get an async handler on the worker's loop. Around
every attempt, stale database connections are closed as Django does around a request
(``close_old_connections``: ``CONN_MAX_AGE``, broken connections), in the thread that uses
them. The ``task_started`` / ``task_finished`` signals are sent as Django's own backends do.

A failed attempt is recorded as a plain durq task's (``last_error`` ``"ValueError: boom"``,
the traceback beside it, an ERROR line when the task is archived), with a note for the
``TaskError`` (see :mod:`durq.contrib.django.records`); with attempts left (the backend's
``MAX_RETRY``) the task is retried with durq's backoff, else it is archived: Django's
FAILED."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

import durq
from durq.contrib.django import records
from durq.worker.executor import format_traceback


def _running(task: Task, payload: dict[str, Any], ctx: durq.TaskContext, alias: str) -> TaskResult:
    now = records.local_time(datetime.now(UTC))
    return TaskResult(
        task=task,
        id=ctx.id,
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,  # not known to the attempt; get_result has it
        started_at=now,
        last_attempted_at=now,
        finished_at=None,
        args=list(payload.get("args", [])),
        kwargs=dict(payload.get("kwargs", {})),
        backend=alias,
        errors=[],
        worker_ids=[ctx.worker_id] * ctx.attempt,
    )


def _call_args(task: Task, result: TaskResult) -> list[Any]:
    args = list(result.args)
    if task.takes_context:
        args.insert(0, TaskContext(task_result=result))
    return args


def _finish(result: TaskResult, value: Any) -> Any:
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", records.local_time(datetime.now(UTC)))
    object.__setattr__(result, "_return_value", value)
    task_finished.send(type(result.task.get_backend()), task_result=result)
    return value


def _fail(result: TaskResult, exc: BaseException, ctx: durq.TaskContext) -> Exception:
    """The exception for durq's worker to record this failure (call inside ``except``, so
    Django's ``task_finished`` log line carries the exception)."""
    at = datetime.now(UTC)
    raised = exc if isinstance(exc, Exception) else _stand_in(exc)
    records.note_failure(raised, type(exc), at)
    result.errors.append(
        TaskError(
            exception_class_path=records.class_path(type(exc)),
            traceback=records.decode_error("", format_traceback(raised))[0].traceback,
        )
    )
    if ctx.retried >= ctx.max_retry:
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        object.__setattr__(result, "finished_at", records.local_time(at))
        task_finished.send(type(result.task.get_backend()), task_result=result)
    return raised


_stand_ins: dict[type[BaseException], type[Exception]] = {}


def _stand_in(exc: BaseException) -> Exception:
    """An ``Exception`` that reads as ``exc`` (same name, module, message, traceback).

    A task's ``SystemExit`` or ``KeyboardInterrupt`` is its failure, but durq's worker lets
    such exceptions through (they stop a process); a stand-in of the same name keeps
    ``last_error`` and the stored traceback as the task raised them."""
    kind = type(exc)
    if kind not in _stand_ins:
        _stand_ins[kind] = type(
            kind.__name__,
            (Exception,),
            {"__module__": kind.__module__, "__qualname__": kind.__qualname__},
        )
    stand_in = _stand_ins[kind](*exc.args)
    # Raised while ``exc`` is handled, the stand-in gets ``exc`` as its context: hide that,
    # and keep what ``exc`` itself was raised from or during.
    stand_in.__cause__ = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    stand_in.__suppress_context__ = True
    return stand_in.with_traceback(exc.__traceback__)


def _resolve(base: Task, ctx: durq.TaskContext) -> Task:
    headers = ctx.headers
    return records.rebuild(
        base,
        durq.TaskInfo(
            id=ctx.id,
            queue=ctx.queue,
            type=ctx.type,
            raw_payload=b"{}",
            state=durq.TaskState.ACTIVE,
            max_retry=ctx.max_retry,
            headers=dict(headers),
        ),
    )


def handler_for(base: Task, default_alias: str) -> Callable[..., Any]:
    """The durq handler that runs Django task ``base``."""
    if asyncio.iscoroutinefunction(base.func):

        async def run_async(payload: dict[str, Any], ctx: durq.TaskContext) -> Any:
            task = _resolve(base, ctx)
            alias = ctx.headers.get(records.HEADER_BACKEND, default_alias)
            result = _running(task, payload, ctx, alias)
            # Django's async ORM calls run in its one sync thread: clean up there.
            await sync_to_async(close_old_connections)()
            task_started.send(type(task.get_backend()), task_result=result)
            try:
                value = normalize_json(await task.func(*_call_args(task, result), **result.kwargs))
            except asyncio.CancelledError:
                raise  # durq's own cancellation (timeout, shutdown, cancel): not the task's
            except BaseException as exc:
                raise _fail(result, exc, ctx)  # noqa: B904 - the task's own exception, as raised
            finally:
                await sync_to_async(close_old_connections)()
            return _finish(result, value)

        return run_async

    def run_sync(payload: dict[str, Any], ctx: durq.TaskContext) -> Any:
        task = _resolve(base, ctx)
        alias = ctx.headers.get(records.HEADER_BACKEND, default_alias)
        result = _running(task, payload, ctx, alias)
        close_old_connections()
        task_started.send(type(task.get_backend()), task_result=result)
        try:
            value = normalize_json(task.func(*_call_args(task, result), **result.kwargs))
        except BaseException as exc:  # SystemExit too: it must not end the worker's thread
            raise _fail(result, exc, ctx)  # noqa: B904 - the task's own exception, as raised
        finally:
            close_old_connections()
        return _finish(result, value)

    return run_sync


def register(app: durq.App, tasks: dict[str, Task], default_alias: str) -> list[str]:
    """Register a durq handler on ``app`` for each Django task not registered yet."""
    added = []
    for type_name, task in sorted(tasks.items()):
        if type_name in app.tasks:
            continue
        app.task(type_name, max_retry=0)(handler_for(task, default_alias))
        added.append(type_name)
    return added
