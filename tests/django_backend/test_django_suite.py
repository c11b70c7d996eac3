"""Django's own tests of its Tasks framework (``tests/tasks`` of Django's source distribution,
unpacked by ``make test-django`` into ``DURQ_DJANGO_TESTS``), run against DurqBackend.

* ``TaskTestCase`` (test_tasks.py): the task API over a backend; here DurqBackend.
* ``DummyBackendTestCase``: a backend that stores tasks and runs none; DurqBackend without a
  worker is exactly that.
* ``ImmediateBackendTestCase``: a backend whose ``enqueue`` returns the finished result;
  here ``enqueue`` is followed by a real durq worker running the task to its end.

A case that tests what DurqBackend does differently by design is skipped with its reason;
the reasons are the list of what does not apply. ``test_custom_backend.py`` tests Django's
base class with backends of its own (none is DurqBackend), so it is not run."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any

import pytest
from django.tasks import default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask
from django.test import override_settings

from durq.contrib.django import DurqBackend
from servers import IN_CI

SUITE = Path(os.environ.get("DURQ_DJANGO_TESTS", ".venv-django/django-tests"))
if not (SUITE / "tasks" / "test_tasks.py").exists():
    if IN_CI:
        raise RuntimeError(f"Django's tasks tests are not unpacked in {SUITE}: make test-django")
    pytest.skip(
        f"Django's tasks tests are not in {SUITE} (make test-django)", allow_module_level=True
    )
sys.path.insert(0, str(SUITE.resolve()))

from tasks import tasks as django_tasks  # noqa: E402
from tasks import test_dummy_backend, test_immediate_backend, test_tasks  # noqa: E402

from django_backend.workers import run_until_finished  # noqa: E402

BROKER = f"sqlite:///{tempfile.mkdtemp(prefix='durq-django-suite-')}/durq.sqlite3"
BACKEND = "durq.contrib.django.DurqBackend"


def durq_backend(queues: list[str], backend: str = BACKEND) -> dict[str, Any]:
    return {
        "BACKEND": backend,
        "QUEUES": queues,
        "OPTIONS": {"broker_url": BROKER, "task_modules": ["tasks.tasks"]},
    }


class RunningDurqBackend(DurqBackend):
    """Test-only: ``enqueue`` lets a real durq worker run the task to its end, then returns
    ``get_result`` (what the immediate backend's cases expect of ``enqueue``)."""

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        result = super().enqueue(task, args, kwargs)
        run_until_finished(self, [result.id], queues=[task.queue_name])
        return self.get_result(result.id)

    async def aenqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        result = await super().aenqueue(task, args, kwargs)
        await asyncio.to_thread(run_until_finished, self, [result.id], queues=[task.queue_name])
        return await self.aget_result(result.id)


RUNNING = f"{__name__}.RunningDurqBackend"
DUMMY_INTERNALS = "reads or clears DummyBackend's in-memory result list"


@override_settings(
    TASKS={
        "default": durq_backend(["default", "queue_1"]),
        "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend", "QUEUES": []},
        "missing": {"BACKEND": "does.not.exist"},
    },
    USE_TZ=True,
)
class DurqTaskTestCase(test_tasks.TaskTestCase):
    def setUp(self) -> None:
        pass  # DummyBackend.clear(): every result here has its own id

    def test_using_correct_backend(self) -> None:
        self.assertIsInstance(task_backends["default"], DurqBackend)

    def test_get_backend(self) -> None:
        self.assertIsInstance(django_tasks.noop_task.get_backend(), DurqBackend)

    def test_enqueue_task(self) -> None:
        result = django_tasks.noop_task.enqueue()
        self.assertEqual(result.status, "READY")
        self.assertEqual(default_task_backend.get_result(result.id), result)

    async def test_enqueue_task_async(self) -> None:
        result = await django_tasks.noop_task.aenqueue()
        self.assertEqual(result.status, "READY")
        self.assertEqual(await default_task_backend.aget_result(result.id), result)


@override_settings(TASKS={"default": durq_backend([])})
class DurqQueuedTestCase(test_dummy_backend.DummyBackendTestCase):
    """DurqBackend with no worker running: tasks wait, as on the dummy backend."""

    def setUp(self) -> None:
        pass

    def test_using_correct_backend(self) -> None:
        self.assertIsInstance(task_backends["default"], DurqBackend)
        self.assertEqual(default_task_backend.options["broker_url"], BROKER)

    def test_enqueue_task(self) -> None:
        for task in [django_tasks.noop_task, django_tasks.noop_task_async]:
            with self.subTest(task):
                result = task.enqueue(1, two=3)
                self.assertEqual(result.status, "READY")
                self.assertIs(result.is_finished, False)
                self.assertIsNone(result.started_at)
                self.assertEqual(result.attempts, 0)
                self.assertEqual(result.args, [1])
                self.assertEqual(result.kwargs, {"two": 3})
                self.assertEqual(default_task_backend.get_result(result.id), result)

    async def test_enqueue_task_async(self) -> None:
        result = await django_tasks.noop_task.aenqueue()
        self.assertEqual(result.status, "READY")
        self.assertEqual(await default_task_backend.aget_result(result.id), result)

    def test_refresh_result(self) -> None:
        # Adapted: a real worker runs the task instead of poking the dummy's list.
        result = default_task_backend.enqueue(django_tasks.calculate_meaning_of_life, (), {})
        self.assertEqual(result.status, "READY")
        run_until_finished(default_task_backend, [result.id])
        result.refresh()
        self.assertEqual(result.status, "SUCCESSFUL")
        self.assertEqual(result.return_value, 42)

    test_refresh_result_async = unittest.skip(DUMMY_INTERNALS)(
        test_dummy_backend.DummyBackendTestCase.test_refresh_result_async
    )
    test_clear = unittest.skip(DUMMY_INTERNALS)(test_dummy_backend.DummyBackendTestCase.test_clear)

    def test_validate_on_enqueue(self) -> None:
        task = django_tasks.noop_task.using(queue_name="unknown_queue")
        with override_settings(TASKS={"default": durq_backend(["queue-1"])}):
            with self.assertRaisesMessage(InvalidTask, "Queue 'unknown_queue' is not valid"):
                task.enqueue()

    async def test_validate_on_aenqueue(self) -> None:
        task = django_tasks.noop_task.using(queue_name="unknown_queue")
        with override_settings(TASKS={"default": durq_backend(["queue-1"])}):
            with self.assertRaisesMessage(InvalidTask, "Queue 'unknown_queue' is not valid"):
                await task.aenqueue()


@override_settings(TASKS={"default": durq_backend([], RUNNING)})
class DurqRunTestCase(test_immediate_backend.ImmediateBackendTestCase):
    """Each enqueue runs on a real durq worker before the case looks at the result."""

    def test_using_correct_backend(self) -> None:
        self.assertIsInstance(task_backends["default"], DurqBackend)

    test_throws_keyboard_interrupt = unittest.skip(
        "a worker records a task's KeyboardInterrupt as its failure instead of stopping"
    )(test_immediate_backend.ImmediateBackendTestCase.test_throws_keyboard_interrupt)
    test_cannot_get_result = unittest.skip("DurqBackend supports get_result")(
        test_immediate_backend.ImmediateBackendTestCase.test_cannot_get_result
    )
    test_cannot_refresh_result = unittest.skip("DurqBackend supports refresh")(
        test_immediate_backend.ImmediateBackendTestCase.test_cannot_refresh_result
    )
    test_cannot_pass_run_after = unittest.skip("DurqBackend supports run_after")(
        test_immediate_backend.ImmediateBackendTestCase.test_cannot_pass_run_after
    )

    def test_validate_on_enqueue(self) -> None:
        task = django_tasks.noop_task.using(queue_name="unknown_queue")
        with override_settings(TASKS={"default": durq_backend(["queue-1"], RUNNING)}):
            with self.assertRaisesMessage(InvalidTask, "Queue 'unknown_queue' is not valid"):
                task.enqueue()

    async def test_validate_on_aenqueue(self) -> None:
        task = django_tasks.noop_task.using(queue_name="unknown_queue")
        with override_settings(TASKS={"default": durq_backend(["queue-1"], RUNNING)}):
            with self.assertRaisesMessage(InvalidTask, "Queue 'unknown_queue' is not valid"):
                await task.aenqueue()
