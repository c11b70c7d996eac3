"""Django set up once for these tests: settings, a PostgreSQL database of this run (when the
server is reachable), the tables of both databases. Skipped as a whole without Django 6."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

try:
    import django
    from django.tasks import task_backends  # noqa: F401 - Django 6+ only
except ImportError:  # the 3.11 venv: these run in the Django venv (make test-django)
    collect_ignore_glob = ["*"]
else:
    from servers import IN_CI, PG_DSN, _reachable

    os.environ["DJANGO_SETTINGS_MODULE"] = "django_backend.settings"
    PG_UP = _reachable("127.0.0.1", 5432)
    if IN_CI and not PG_UP:
        raise RuntimeError("PostgreSQL is required when CI=true")
    django.setup()

    from django.conf import settings
    from django.core.management import call_command

    if PG_UP:
        import psycopg
        from psycopg import sql

        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(settings.PG_NAME)))
    for alias in ["default", "pg"] if PG_UP else ["default"]:
        call_command("migrate", run_syncdb=True, database=alias, verbosity=0)


@pytest.fixture(scope="session", autouse=True)
def _drop_run_databases() -> Iterator[None]:
    yield
    from django.db import connections
    from django.tasks import task_backends

    from servers import drop_isolated

    for backend in task_backends.all():
        backend.close()
    connections.close_all()
    if PG_UP:
        import psycopg
        from psycopg import sql

        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(settings.PG_NAME)
                )
            )
    drop_isolated("redis", f"redis://x?prefix={settings.REDIS_PREFIX}")
