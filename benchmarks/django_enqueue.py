"""Enqueue throughput: Django's ``Task.enqueue`` through DurqBackend vs ``durq.App.enqueue_sync``
on the same broker, in the same run (needs Django 6: run it with the Django venv).

    .venv-django/bin/python benchmarks/django_enqueue.py --tasks 2000 [--postgres URL]

Prints one JSON object per broker: enqueues per second for each path, sequential, from one
thread (what a sync Django view does), outside a transaction and inside ``atomic()``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from typing import Any


def configure(databases: dict[str, Any]) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["durq.contrib.django"],
        DATABASES=databases,
        TASKS={
            alias: {
                "BACKEND": "durq.contrib.django.DurqBackend",
                "OPTIONS": {"database": alias, "schema": f"durq_bench_{uuid.uuid4().hex[:8]}"},
            }
            for alias in databases
        },
        USE_TZ=True,
    )
    django.setup()


def noop(n: int) -> int:
    return n


# Run as a script this module is __main__, not a valid task type; nothing runs these tasks.
noop.__module__ = "bench_tasks"


def measure(alias: str, count: int) -> dict[str, Any]:
    from django.db import transaction
    from django.tasks import task, task_backends

    backend = task_backends[alias]
    django_task = task(backend=alias)(noop)
    app = backend.app
    backend.ready()
    django_task.enqueue(0)  # warm: broker connected, tables exist
    app.enqueue_sync("bench:noop", {"n": 0})

    def rate(fn: Any) -> float:
        start = time.perf_counter()
        for i in range(count):
            fn(i)
        return round(count / (time.perf_counter() - start), 1)

    def in_atomic(i: int) -> None:
        with transaction.atomic(using=alias):
            django_task.enqueue(i)

    result = {
        "broker": app.new_broker().name,
        "tasks": count,
        "django_task_enqueue_per_s": rate(django_task.enqueue),
        "durq_app_enqueue_sync_per_s": rate(lambda i: app.enqueue_sync("bench:noop", {"n": i})),
        "django_task_enqueue_in_atomic_per_s": rate(in_atomic),
    }
    result["django_vs_durq"] = round(
        result["django_task_enqueue_per_s"] / result["durq_app_enqueue_sync_per_s"], 3
    )
    backend.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--postgres", help="e.g. postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="durq-django-bench-")
    databases: dict[str, Any] = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(tmp, "db.sqlite3")}
    }
    if args.postgres:
        from psycopg.conninfo import conninfo_to_dict

        info = conninfo_to_dict(args.postgres)
        databases["postgres"] = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": info.get("dbname", "postgres"),
            "USER": info.get("user", ""),
            "HOST": info.get("host", ""),
            "PORT": info.get("port", ""),
        }
    configure(databases)
    machine = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "os": platform.system()}
    for alias in databases:
        print(json.dumps({**measure(alias, args.tasks), "machine": machine}))
    if args.postgres:
        from django.conf import settings
        from django.db import connections

        with connections["postgres"].cursor() as cursor:
            for backend in settings.TASKS.values():
                schema = backend["OPTIONS"]["schema"]
                cursor.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
