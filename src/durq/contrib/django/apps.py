"""The Django app of durq's integration: ``INSTALLED_APPS = [..., "durq.contrib.django"]``
gives ``manage.py durq_worker``, the admin page (the index's "durq tasks"), and durq's
tables on ``manage.py migrate`` (``durq.0001_initial``, listed by ``showmigrations``)."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def migrate_brokers(using: str = "default", **kwargs: Any) -> None:
    """Create or upgrade durq's tables in every durq backend stored in database ``using``
    (idempotent)."""
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
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Also after every ``migrate`` (and a test database's creation): a newer durq's
        # schema changes apply without a Django migration of their own.
        post_migrate.connect(migrate_brokers, dispatch_uid="durq-migrate-brokers")
