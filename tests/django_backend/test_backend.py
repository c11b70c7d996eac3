"""DurqBackend through Django's own API on SQLite (``default``), PostgreSQL (``pg``) and Redis.

Every test enqueues with ``Task.enqueue`` / ``aenqueue``, runs a real durq worker and reads
the outcome back with ``get_result``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.utils import timezone

from django_backend.notes import tasks
from django_backend.notes.models import Note
from django_backend.workers import require_pg, run_until_finished
from durq.contrib.django import DurqBackend
from servers import require_server

SQL_ALIASES = ["default", "pg"]
ALL_ALIASES = ["default", "pg", "redis"]


def backend_for(alias: str) -> DurqBackend:
    if alias == "pg":
        require_pg()
    if alias == "redis":
        require_server("redis")
    backend = task_backends[alias]
    assert isinstance(backend, DurqBackend)
    return backend


@pytest.mark.parametrize("alias", ALL_ALIASES)
def test_enqueue_run_and_read_the_result(alias: str) -> None:
    backend = backend_for(alias)
    added = tasks.add.using(backend=alias).enqueue(2, b=3)
    assert added.status == TaskResultStatus.READY
    assert added.enqueued_at is not None
    assert backend.get_result(added.id) == added  # the record reads back as enqueued
    shouted = tasks.shout.using(backend=alias).enqueue("hi")
    context = tasks.whoami.using(backend=alias).enqueue("t1")

    run_until_finished(backend, [added.id, shouted.id, context.id], queues=["default", "emails"])

    result = tasks.add.using(backend=alias).get_result(added.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.args == [2] and result.kwargs == {"b": 3}
    assert result.attempts == 1 and result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert backend.get_result(shouted.id).return_value == "HI"  # an async function
    assert backend.get_result(context.id).return_value == {
        "id": context.id,
        "attempt": 1,
        "tag": "t1",
    }


@pytest.mark.parametrize("alias", ALL_ALIASES)
async def test_aenqueue_and_aget_result(alias: str) -> None:
    backend = backend_for(alias)
    result = await tasks.add.using(backend=alias).aenqueue(20, 22)
    assert (await backend.aget_result(result.id)) == result
    run_until_finished(backend, [result.id])
    await result.arefresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


@pytest.mark.parametrize("alias", ALL_ALIASES)
def test_a_failure_keeps_exception_class_and_traceback(alias: str) -> None:
    backend = backend_for(alias)
    result = tasks.fail.using(backend=alias).enqueue("no such thing")
    run_until_finished(backend, [result.id])
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    (error,) = result.errors
    assert error.exception_class is LookupError
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert error.traceback.endswith("LookupError: no such thing\n")
    assert result.finished_at is not None and result.finished_at >= result.started_at
    # durq's record reads as a plain durq task's: the error line, the traceback beside it,
    # starting at the task's own frame.
    info = backend.call(lambda: backend.app.inspector.get_task_info("default", result.id))
    assert info.last_error == "LookupError: no such thing"
    assert info.traceback is not None and "raise LookupError(message)" in info.traceback
    assert "executor.py" not in info.traceback and "execution.py" not in info.traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value


def test_a_failed_attempt_with_retries_left_is_ready_again() -> None:
    backend = task_backends["retrying"]
    result = tasks.fail.using(backend="retrying").enqueue("later")
    outcomes = run_until_finished(backend, [result.id])
    assert outcomes == {result.id: "retry"}
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.attempts == 1
    assert result.errors[0].exception_class_path == "builtins.LookupError"


@pytest.mark.parametrize("alias", SQL_ALIASES)
def test_rollback_leaves_no_task_and_commit_shows_it_at_once(alias: str) -> None:
    backend = backend_for(alias)
    with pytest.raises(RuntimeError, match="roll back"), transaction.atomic(using=alias):
        Note.objects.using(alias).create(text="rolled back")
        lost = tasks.add.using(backend=alias).enqueue(1, 1)
        raise RuntimeError("roll back")
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(lost.id)
    assert not Note.objects.using(alias).filter(text="rolled back").exists()

    with transaction.atomic(using=alias):
        Note.objects.using(alias).create(text="kept")
        kept = tasks.add.using(backend=alias).enqueue(1, 2)
        # The row is in the caller's transaction: nobody else sees it before the commit.
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(kept.id)
    assert backend.get_result(kept.id).status == TaskResultStatus.READY
    run_until_finished(backend, [kept.id])
    assert backend.get_result(kept.id).return_value == 3


@pytest.mark.parametrize("alias", SQL_ALIASES)
def test_a_task_joining_the_transaction_goes_through_the_app_s_hooks(alias: str) -> None:
    # Metrics and tracing hang on the app's hooks: the joined path must not go around them.
    backend = backend_for(alias)
    seen: list[str] = []
    backend.app.enqueue_hooks.append(lambda info: seen.append(info.id))
    try:
        with transaction.atomic(using=alias):
            joined = tasks.add.using(backend=alias).enqueue(1, 1)
    finally:
        backend.app.enqueue_hooks.pop()
    assert seen == [joined.id]
    run_until_finished(backend, [joined.id])


def test_redis_enqueues_on_commit() -> None:
    backend = backend_for("redis")
    with pytest.raises(RuntimeError), transaction.atomic():
        lost = tasks.add.using(backend="redis").enqueue(1, 1)
        raise RuntimeError("roll back")
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(lost.id)
    with transaction.atomic():
        kept = tasks.add.using(backend="redis").enqueue(2, 2)
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(kept.id)
    assert backend.get_result(kept.id).status == TaskResultStatus.READY


@pytest.mark.parametrize("alias", SQL_ALIASES)
def test_tasks_use_the_orm_in_worker_threads(alias: str) -> None:
    backend = backend_for(alias)
    sync = tasks.write_note.using(backend=alias).enqueue("from a thread", using=alias)
    coro = tasks.write_note_async.using(backend=alias).enqueue("from the loop", using=alias)
    run_until_finished(backend, [sync.id, coro.id])
    assert backend.get_result(sync.id).return_value["vendor"] in ("sqlite", "postgresql")
    note_id = backend.get_result(coro.id).return_value
    assert Note.objects.using(alias).get(pk=note_id).text == "from the loop"
    assert connections[alias].vendor in ("sqlite", "postgresql")


@pytest.mark.parametrize("alias", ALL_ALIASES)
def test_run_after_waits_and_results_are_retained(alias: str) -> None:
    backend = backend_for(alias)
    later = timezone.now() + timedelta(hours=1)
    result = tasks.add.using(backend=alias, run_after=later).enqueue(1, 1)
    info = backend.app.run_sync(lambda: backend.app.inspector.get_task_info("default", result.id))
    assert info.state.value == "scheduled"
    assert abs((info.next_process_at - later).total_seconds()) < 0.01
    assert info.retention == 7 * 24 * 3600
    read = backend.get_result(result.id)
    assert read.status == TaskResultStatus.READY
    assert read.task.run_after == later


def test_validation_is_django_s_and_durq_s() -> None:
    with pytest.raises(InvalidTask, match="Queue 'other' is not valid"):
        tasks.add.using(queue_name="other")
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=101)
    with pytest.raises(InvalidTask, match="aware datetime"):
        tasks.add.using(run_after=timezone.now().replace(tzinfo=None))
    with pytest.raises(InvalidTask, match="queue name"):
        tasks.add.using(backend="retrying", queue_name="no spaces")
    with pytest.raises(TypeError, match="Unsupported type"):
        tasks.add.enqueue(timezone.now(), 1)
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result("no-such-task")


def test_unknown_options_are_refused() -> None:
    with pytest.raises(InvalidTask, match="unknown OPTIONS"):
        DurqBackend("x", {"OPTIONS": {"brokerurl": "sqlite:///x.db"}})
    with pytest.raises(InvalidTask, match="either"):
        DurqBackend("x", {"OPTIONS": {"broker_url": "sqlite:///x.db", "database": "default"}})


@pytest.mark.parametrize("alias", ALL_ALIASES)
def test_priority_is_durq_s_and_runs_higher_first(alias: str) -> None:
    backend = backend_for(alias)
    low = tasks.add.using(backend=alias, priority=-100).enqueue(1, 1)
    high = tasks.add.using(backend=alias, priority=100).enqueue(2, 2)
    plain = tasks.add.using(backend=alias).enqueue(3, 3)
    info = backend.app.run_sync(lambda: backend.app.inspector.get_task_info("default", high.id))
    assert info.priority == 100
    assert backend.get_result(low.id).task.priority == -100  # reads back as enqueued
    assert backend.get_result(plain.id).task.priority == 0

    # One at a time, so each start is a claim of its own.
    run_until_finished(backend, [low.id, high.id, plain.id], queues=["default"], concurrency=1)

    started = sorted((backend.get_result(r.id).started_at, r.id) for r in (low, high, plain))
    assert [task_id for _, task_id in started] == [high.id, plain.id, low.id]


def test_django_s_own_sqlite_file_keeps_its_mode_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio
    import logging
    import os

    from durq.brokers import open_broker
    from durq.contrib.django.backend import database_url

    path = str(connections["default"].settings_dict["NAME"])
    before = os.stat(path).st_mode & 0o777
    os.chmod(path, 0o644)  # as Django made it under a 022 umask
    try:
        url = database_url("default")
        assert url.endswith("?file_mode=644")
        broker = open_broker(url)
        caplog.set_level(logging.WARNING, logger="durq.sqlite")

        async def touch() -> None:
            await broker.connect()
            await broker.close()

        asyncio.run(touch())
        assert not [r for r in caplog.records if "more open than" in r.getMessage()]
        assert os.stat(path).st_mode & 0o777 == 0o644  # Django's file, left as it was
    finally:
        os.chmod(path, before)
