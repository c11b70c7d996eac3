"""``python manage.py durq_worker``: run Django tasks until SIGTERM/SIGINT.

Django is set up once (by ``manage.py``); tasks are found in each installed app's ``tasks``
module and the backend's ``task_modules``; the options are ``durq worker``'s."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend

from durq import durations
from durq.contrib.django import registry
from durq.contrib.django.backend import DurqBackend
from durq.contrib.django.execution import register
from durq.errors import DurqError
from durq.observability.logging import JsonFormatter, setup_logging
from durq.worker.process import exit_past_stuck_threads, start_metrics
from durq.worker.server import parse_queues

log = logging.getLogger("durq.contrib.django")


class Command(BaseCommand):  # type: ignore[misc]
    """Run a durq worker for the Django tasks of one ``TASKS`` backend."""

    help = (
        "Run a durq worker for Django tasks until SIGTERM/SIGINT. SIGTERM or Ctrl-C stops "
        "taking tasks, waits up to --shutdown-timeout for running ones and hands the rest "
        "back; a second signal stops at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="The TASKS alias to serve.")
        parser.add_argument(
            "--queues",
            help="Queues and weights, e.g. emails=3,default=1 [default: the backend's QUEUES]",
        )
        parser.add_argument("--strict", action="store_true", help="Empty higher queues first.")
        parser.add_argument("--concurrency", "-c", type=int, default=10, help="Tasks at once.")
        parser.add_argument(
            "--shutdown-timeout", default="10", help="Grace for running tasks (10, 30s, 1m)."
        )
        parser.add_argument("--metrics-port", type=int, help="Serve Prometheus metrics here.")
        parser.add_argument("--log-format", choices=["text", "json"], default="text")
        parser.add_argument(
            "--log-level",
            default="INFO",
            choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        )
        parser.add_argument(
            "--wait-for-broker",
            default="0",
            help="Keep retrying this long if the broker is down at start (e.g. 2m); 0: fail.",
        )
        parser.add_argument(
            "--tasks-module",
            action="append",
            default=[],
            help="Also import this module for tasks (repeatable).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            backend = task_backends[options["backend"]]
        except InvalidTaskBackend as exc:
            raise CommandError(str(exc)) from None
        if not isinstance(backend, DurqBackend):
            raise CommandError(f"TASKS[{options['backend']!r}] is not a DurqBackend")
        try:
            grace = durations.parse(options["shutdown_timeout"])
            patience = durations.parse(options["wait_for_broker"])
            queues = options["queues"] or sorted(backend.queues) or ["default"]
            weights = parse_queues(queues)
        except (DurqError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be >= 1")
        setup_logging(options["log_level"], options["log_format"])
        if options["log_format"] == "json":
            _django_logs_as_json(options["log_level"])
        tasks = registry.discover([*backend.task_modules, *options["tasks_module"]])
        app = backend.app
        register(app, tasks, backend.alias)
        if not tasks:
            log.warning("no Django tasks found: add a tasks module to an installed app")
        log.info("tasks: %s", ", ".join(sorted(tasks)) or "(none)")
        backend.ready()  # durq's tables exist before the worker connects
        if options["metrics_port"] is not None:
            try:
                start_metrics(app, options["metrics_port"])
            except DurqError as exc:
                raise CommandError(str(exc)) from None
        worker = app.worker(
            queues=weights,
            concurrency=options["concurrency"],
            strict=options["strict"],
            shutdown_timeout=grace,
        )
        asyncio.run(self._run(backend, worker, patience))
        exit_past_stuck_threads()

    async def _run(self, backend: DurqBackend, worker: Any, patience: float) -> None:
        try:
            await worker.run(wait_for_broker=patience)
        finally:
            await backend.app.close()


def _django_logs_as_json(level: str) -> None:
    """Write the ``django`` loggers' lines (``django.tasks``, ``django.db``...) as JSON lines
    too, so one log pipeline reads the whole worker.

    Django's console handlers are replaced by durq's JSON one; other handlers (mail to
    ADMINS, files) stay. Lines below WARNING, which Django prints only with ``DEBUG`` (a
    ``Task ... state=RUNNING`` line per task among them), stay out unless ``--log-level``
    asks for them (DEBUG)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.setLevel(
        logging.DEBUG if level == "DEBUG" else max(logging.WARNING, logging.getLevelName(level))
    )
    logger = logging.getLogger("django")
    logger.handlers[:] = [h for h in logger.handlers if type(h) is not logging.StreamHandler] + [
        handler
    ]
