"""The Django app of durq's integration: ``INSTALLED_APPS = [..., "durq.contrib.django"]``
gives ``manage.py durq_worker``, the admin page, and durq's tables on ``manage.py migrate``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _migrate_brokers(using: str = "default", **kwargs: Any) -> None:
    """After ``manage.py migrate`` (and a test database's creation), create durq's tables in
    every durq backend stored in that database."""
    from django.tasks import task_backends

    from durq.contrib.django.backend import DurqBackend

    for backend in task_backends.all():
        if isinstance(backend, DurqBackend) and backend.database == using:
            backend.ready()


class DurqConfig(AppConfig):  # type: ignore[misc]
    """durq's Django app."""

    name = "durq.contrib.django"
    label = "durq"
    verbose_name = "durq tasks"

    def ready(self) -> None:
        post_migrate.connect(_migrate_brokers, dispatch_uid="durq-migrate-brokers")
