"""Running Django tasks in a durq worker: one durq handler per Django task function.

Sync functions get a sync handler (durq runs it in its thread pool, so each thread has its
own database connections); async functions get an async handler on the worker's loop. Around
every attempt, stale database connections are closed as Django does around a request
(``close_old_connections``: ``CONN_MAX_AGE``, broken connections), in the thread that uses
them. The ``task_started`` / ``task_finished`` signals are sent as Django's own backends do.

A failed attempt is recorded with its exception's class path and traceback (see
:mod:`durq.contrib.django.records`); with attempts left (the backend's ``MAX_RETRY``) the
task is retried with durq's backoff, else it is archived: Django's FAILED."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

import durq
from durq.contrib.django import records

log = logging.getLogger("durq.contrib.django")


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
    """The durq control-flow exception that records this failure (call inside ``except``, so
    Django's ``task_finished`` log line carries the exception)."""
    at = datetime.now(UTC)
    text = records.encode_error(exc, at)
    error, _ = records.decode_error(text)
    result.errors.append(error)
    if ctx.retried >= ctx.max_retry:
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        object.__setattr__(result, "finished_at", records.local_time(at))
        task_finished.send(type(result.task.get_backend()), task_result=result)
        return durq.SkipRetry(text)  # archived with this text as its error, nothing added
    log.warning(
        "task %s (%s) failed on attempt %d of %d, will retry: %s",
        ctx.id,
        ctx.type,
        ctx.attempt,
        ctx.max_retry + 1,
        error.exception_class_path,
    )
    return durq.NotReady(text)  # retried with backoff, this text as its error


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
                raise _fail(result, exc, ctx) from None
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
            raise _fail(result, exc, ctx) from None
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
