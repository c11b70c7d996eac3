"""Which Django tasks this process knows, by durq task type (the function's module path).

durq never imports a name read from task data: a worker runs a task only if its function's
module was imported here, by discovery (the ``tasks`` module of every installed app, and the
modules named by the backend's ``TASK_MODULES`` option), or because this process enqueued it.
A task type nobody knows waits with durq's "no handler" retry, as in a rolling deploy."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from importlib import import_module

from django.apps import apps
from django.tasks import Task
from django.utils.module_loading import module_has_submodule

_known: dict[str, Task] = {}
_discovered: set[str] = set()
_lock = threading.Lock()


def remember(task: Task) -> None:
    """Record ``task`` under its module path (the first one seen stays)."""
    _known.setdefault(task.module_path, task)


def _scan(module_name: str) -> None:
    module = sys.modules.get(module_name)
    if module is None:
        return
    for value in vars(module).values():
        if isinstance(value, Task):
            remember(value)


def discover(extra_modules: Iterable[str] = ()) -> dict[str, Task]:
    """Import each installed app's ``tasks`` module and ``extra_modules``; every Django
    ``Task`` they hold becomes known. Returns the known tasks by type."""
    names = []
    for config in apps.get_app_configs():
        if module_has_submodule(config.module, "tasks"):
            names.append(f"{config.name}.tasks")
    names.extend(extra_modules)
    with _lock:
        for name in names:
            if name not in _discovered:
                import_module(name)
                _discovered.add(name)
            _scan(name)
        return dict(_known)


def lookup(type_name: str, extra_modules: Iterable[str] = ()) -> Task | None:
    """The task registered under ``type_name``, discovering once if needed; ``None`` if no
    imported module defines it."""
    task = _known.get(type_name)
    if task is not None:
        return task
    # A module imported by the application itself (not by us, from the type) may hold it.
    module_name, _, attr = type_name.rpartition(".")
    value = getattr(sys.modules.get(module_name), attr, None)
    if isinstance(value, Task) and value.module_path == type_name:
        remember(value)
        return value
    return discover(extra_modules).get(type_name)
