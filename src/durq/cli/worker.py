"""``durq worker APP``: run the handlers of an app until SIGTERM/SIGINT (W7, H5)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from durq import ranges
from durq.app import App
from durq.child_workflows import DONE_TYPE
from durq.cli.common import BrokerOpt, UsageFailure, fail
from durq.cli.common import load_app as load_app  # re-exported: other commands import it here
from durq.errors import ConfigurationError
from durq.observability.logging import bind_worker_id, setup_logging
from durq.worker.process import exit_past_stuck_threads, start_metrics
from durq.worker.recycle import MAX_MEMORY_RANGE, MAX_TASKS_RANGE
from durq.worker.server import MAX_CONCURRENCY, Worker, parse_queues
from durq.worker.service import PeriodicService
from durq.worker.supervisor import (
    MULTIPROC_ENV,
    OrphanWatch,
    Supervisor,
    resolve_processes,
    supervised_child,
    this_interpreter,
)

log = logging.getLogger("durq.cli")


EPILOG = (
    "Examples:\n\n"
    "  durq worker examples.quickstart:app\n\n"
    "  durq worker myproject.tasks:app --queues critical=6,default=3,low=1 --concurrency 20\n\n"
    "  DURQ_BROKER_URL=postgresql://localhost/app durq worker myproject.tasks:app --strict\n\n"
    "  durq worker myproject.tasks:app --processes auto   # one worker process per CPU\n\n"
    "  durq worker myproject.tasks:app --burst   # drain the queues, then exit 0 (cron, CI)\n\n"
    "SIGTERM or Ctrl-C stops taking tasks, waits up to --shutdown-timeout for running ones and "
    "hands the rest back as pending; a second signal stops at once."
)


def worker_command(
    app_path: Annotated[
        str, typer.Argument(metavar="APP", help="The app object as module:attribute.")
    ],
    broker: BrokerOpt = None,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency", "-c", envvar="DURQ_CONCURRENCY", help="Tasks run at once (1-10000)."
        ),
    ] = 10,
    queues: Annotated[
        str | None,
        typer.Option(
            "--queues",
            envvar="DURQ_QUEUES",
            help="Queues and weights, e.g. critical=6,default=3,low=1 "
            "[default: every queue of the app's tasks]",
            show_default=False,
        ),
    ] = None,
    strict: Annotated[
        bool,
        typer.Option("--strict", envvar="DURQ_STRICT", help="Empty higher-weight queues first."),
    ] = False,
    shutdown_timeout: Annotated[
        str,
        typer.Option(
            "--shutdown-timeout",
            envvar="DURQ_SHUTDOWN_TIMEOUT",
            help="Grace for running tasks at shutdown (seconds or 10s, 1m; at most 1d).",
        ),
    ] = "10",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            envvar="DURQ_METRICS_PORT",
            help="Serve Prometheus metrics on this port.",
        ),
    ] = None,
    readyz_details: Annotated[
        bool,
        typer.Option(
            "--readyz-details",
            envvar="DURQ_READYZ_DETAILS",
            help="/readyz says why the broker is not ready (its error may name the broker's "
            "host and user) [default: only that it is not]",
        ),
    ] = False,
    log_format: Annotated[
        str,
        typer.Option("--log-format", envvar="DURQ_LOG_FORMAT", help="Log format: text or json."),
    ] = "text",
    log_level: Annotated[
        str, typer.Option("--log-level", envvar="DURQ_LOG_LEVEL", help="Log level.")
    ] = "INFO",
    no_scheduler: Annotated[
        bool, typer.Option("--no-scheduler", help="Do not enqueue APP's periodic tasks.")
    ] = False,
    wait_for_broker: Annotated[
        str,
        typer.Option(
            "--wait-for-broker",
            envvar="DURQ_WAIT_FOR_BROKER",
            help="Keep retrying this long if the broker is down at start (e.g. 2m); 0: fail.",
        ),
    ] = "0",
    burst: Annotated[
        bool,
        typer.Option(
            "--burst",
            help="Exit (0) once no task is claimable now and none of this worker's runs "
            "(cron jobs, CI); tasks due later stay queued.",
        ),
    ] = False,
    max_tasks_per_child: Annotated[
        int | None,
        typer.Option(
            "--max-tasks-per-child",
            envvar="DURQ_MAX_TASKS_PER_CHILD",
            help="After this many tasks a worker process claims no more, finishes what it "
            "runs and exits (0); --processes starts a fresh one.",
            show_default=False,
        ),
    ] = None,
    max_memory_per_child: Annotated[
        int | None,
        typer.Option(
            "--max-memory-per-child",
            envvar="DURQ_MAX_MEMORY_PER_CHILD",
            metavar="MB",
            help="The same once a worker process uses more than this much resident memory.",
            show_default=False,
        ),
    ] = None,
    reload: Annotated[
        bool,
        typer.Option(
            "--reload",
            help="Development only: restart the worker when a .py file under the current "
            "directory changes.",
        ),
    ] = False,
    processes: Annotated[
        str,
        typer.Option(
            "--processes",
            envvar="DURQ_PROCESSES",
            help="Worker processes under one supervisor, each with --concurrency slots; "
            "auto: one per available CPU (a container's CPU limit counts); at most 4 per "
            "available CPU.",
        ),
    ] = "1",
) -> None:
    """Run a worker for APP's tasks until SIGTERM/SIGINT."""
    # Every value is checked before anything starts (no child forked, no APP imported).
    count = resolve_processes(processes, "--processes")
    ranges.integer("--concurrency", concurrency, 1, MAX_CONCURRENCY)
    grace = ranges.seconds("--shutdown-timeout", shutdown_timeout)
    patience = ranges.seconds("--wait-for-broker", wait_for_broker)
    if metrics_port is not None:
        ranges.port("--metrics-port", metrics_port)
    if max_tasks_per_child is not None:
        ranges.integer("--max-tasks-per-child", max_tasks_per_child, *MAX_TASKS_RANGE)
    if max_memory_per_child is not None:
        ranges.integer("--max-memory-per-child", max_memory_per_child, *MAX_MEMORY_RANGE)
    if reload and count > 1:
        raise UsageFailure("--reload runs one worker: leave out --processes")
    weights = parse_queues(queues) if queues else None
    setup_logging(log_level, log_format)
    if count > 1 or reload:
        child = [*this_interpreter(), "worker", app_path, "--concurrency", str(concurrency)]
        child += ["--shutdown-timeout", shutdown_timeout, "--wait-for-broker", wait_for_broker]
        child += ["--log-format", log_format, "--log-level", log_level, "--processes", "1"]
        child += (["--broker", broker] if broker else []) + (["--queues", queues] if queues else [])
        child += (["--strict"] if strict else []) + (["--no-scheduler"] if no_scheduler else [])
        child += ["--burst"] if burst else []
        if max_tasks_per_child is not None:
            child += ["--max-tasks-per-child", str(max_tasks_per_child)]
        if max_memory_per_child is not None:
            child += ["--max-memory-per-child", str(max_memory_per_child)]
        if reload:
            from durq.worker.reload import run_reloading

            if metrics_port is not None:
                child += ["--metrics-port", str(metrics_port)]
            raise typer.Exit(run_reloading(child, Path.cwd()))
        supervised_app = load_app(app_path, broker) if metrics_port is not None else None
        supervisor = Supervisor(
            child,
            count,
            app=supervised_app,
            metrics_port=metrics_port,
            readyz_details=readyz_details,
            shutdown_timeout=grace,
            burst=burst,
        )
        code = asyncio.run(_supervise(supervisor, supervised_app))
        raise typer.Exit(code)
    application = load_app(app_path, broker)
    services: list[PeriodicService] = []
    parent = supervised_child()
    if parent is not None:
        services.append(OrphanWatch(parent))
        if os.environ.get(MULTIPROC_ENV):  # the supervisor serves what this process counts
            from durq.observability.metrics import install

            install(application)
    if metrics_port is not None:
        # before the worker copies the app's hooks
        try:
            start_metrics(application, metrics_port, readyz_details)
        except ConfigurationError as exc:
            fail(exc.message)
    worker = application.worker(
        queues=weights,
        concurrency=concurrency,
        strict=strict,
        shutdown_timeout=grace,
        scheduler=not no_scheduler,  # periodic tasks (durq.worker.periodic)
        services=services,
        max_tasks=max_tasks_per_child,
        max_memory=max_memory_per_child,
        burst=burst,
    )
    bind_worker_id(worker.id)
    registered = sorted(t for t in application.tasks if t != DONE_TYPE)  # the user's own
    if not registered:
        log.warning("%s registers no tasks: every task will wait for a handler", app_path)
    log.info("tasks: %s", ", ".join(registered) or "(none)")
    asyncio.run(_run(application, worker, patience))
    exit_past_stuck_threads()


async def _supervise(supervisor: Supervisor, app: App | None) -> int:
    try:
        return await supervisor.run()
    finally:
        if app is not None:
            await app.close()


async def _run(application: App, worker: Worker, wait_for_broker: float) -> None:
    try:
        await worker.run(wait_for_broker=wait_for_broker)
    finally:
        await application.close()


def register(app: typer.Typer) -> None:
    """Add ``durq worker``."""
    app.command("worker", epilog=EPILOG)(worker_command)
