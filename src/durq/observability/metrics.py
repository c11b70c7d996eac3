"""Prometheus metrics. Needs ``durq[metrics]`` (prometheus-client).

* :func:`install` adds counters and the duration histogram to an app: a worker hook counts
  what workers do; an ``app.enqueue_hooks`` entry counts the tasks this process created.
* :class:`QueueCollector` exports queue sizes and oldest-pending ages read through the
  inspector, cached for a few seconds so scrapes never load the broker.
* :func:`start_metrics_server` serves ``/metrics``, ``/healthz`` and ``/readyz`` on a port
  (prometheus-client's exposition app behind uvicorn) from the caller's event loop;
  :func:`serve` does it from a thread (``durq worker --metrics-port``).

Names and labels are listed in ``docs/observability.md``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import uvicorn
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_asgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from durq.appview import AdminView, HookPoints, MetricsHost
from durq.brokers.views import FairDepth, LimitStats, QueueStats
from durq.errors import DurqError
from durq.observability.health import HealthProbe, readiness
from durq.observability.snapshot import Snapshot
from durq.states import TaskState
from durq.task import TaskInfo
from durq.worker.hooks import WorkerHooks

if TYPE_CHECKING:
    from durq.inspector import WorkflowCounts

log = logging.getLogger("durq.metrics")


#: Buckets of ``durq_task_duration_seconds``: 5 ms to 10 min.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
LABELS = ("queue", "type")


class TaskMetrics(WorkerHooks):
    """The per-task counters and histogram, and the worker hook that feeds them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.enqueued = Counter(
            "durq_tasks_enqueued",
            "Tasks enqueued by this process.",
            LABELS,
            registry=registry,
        )
        self.processed = Counter(
            "durq_tasks_processed",
            "Attempts that ended (completed, retry or archived).",
            LABELS,
            registry=registry,
        )
        self.completed = Counter(
            "durq_tasks_completed", "Attempts that succeeded.", LABELS, registry=registry
        )
        self.failed = Counter(
            "durq_tasks_failed",
            "Attempts that failed (then retried or archived).",
            LABELS,
            registry=registry,
        )
        self.retried = Counter(
            "durq_tasks_retried",
            "Failed attempts scheduled for another try.",
            LABELS,
            registry=registry,
        )
        self.archived = Counter(
            "durq_tasks_archived",
            "Tasks given up on (retries used up, SkipRetry, cancelled).",
            LABELS,
            registry=registry,
        )
        self.duration = Histogram(
            "durq_task_duration_seconds",
            "Time from the start of an attempt to its recorded outcome.",
            (*LABELS, "outcome"),
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        # livesum: under a supervisor (prometheus-client's multiprocess mode) the sum over
        # the worker processes alive; ignored in a single process.
        self.busy = Gauge(
            "durq_worker_busy_slots",
            "Task slots running a handler now.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.slots = Gauge(
            "durq_worker_concurrency",
            "Task slots of the workers in this process.",
            registry=registry,
            multiprocess_mode="livesum",
        )

    # -- WorkerHooks ------------------------------------------------------------------------

    def task_finished(self, task: TaskInfo, outcome: str, duration: float) -> None:
        labels = (task.queue, task.type)
        self.duration.labels(*labels, outcome).observe(duration)
        if outcome not in ("completed", "retry", "archived"):
            return  # handed back on shutdown or lease lost: no attempt was recorded
        self.processed.labels(*labels).inc()
        if outcome == "completed":
            self.completed.labels(*labels).inc()
            return
        self.failed.labels(*labels).inc()
        if outcome == "retry":
            self.retried.labels(*labels).inc()
        else:
            self.archived.labels(*labels).inc()

    def busy_changed(self, busy: int, concurrency: int) -> None:
        self.busy.set(busy)
        self.slots.set(concurrency)

    # -- enqueue ----------------------------------------------------------------------------

    def count_enqueued(self, info: TaskInfo) -> None:
        self.enqueued.labels(info.queue, info.type).inc()


_installed: weakref.WeakKeyDictionary[HookPoints, TaskMetrics] = weakref.WeakKeyDictionary()


def install(app: HookPoints, registry: CollectorRegistry | None = None) -> TaskMetrics:
    """Count enqueues and task outcomes of ``app`` (idempotent: one set of metrics per app).

    ``registry``: where the metrics live; default a new registry of their own (pass
    ``prometheus_client.REGISTRY`` to expose them from your existing ``/metrics``)."""
    metrics = _installed.get(app)
    if metrics is not None:
        return metrics
    metrics = TaskMetrics(registry if registry is not None else CollectorRegistry())
    _installed[app] = metrics
    app.worker_hooks.append(metrics)
    app.enqueue_hooks.append(metrics.count_enqueued)
    return metrics


def installed(app: HookPoints) -> TaskMetrics | None:
    """The metrics :func:`install` added to ``app``, if any."""
    return _installed.get(app)


#: The workflow gauges count at most this many records, the newest.
WORKFLOW_GAUGE_SCAN = 1000
#: ``durq_fair_partition_tasks`` shows this many partitions of each queue's fair limits one
#: by one (the busiest), and the rest as one series ``partition="other"``: a bounded number
#: of series however many tenants there are.
PARTITION_GAUGE_TOP = 20
#: ... read at most once a minute (or once per ``ttl`` if longer): a read counts every
#: pending and running task of a queue (100,000 tasks: 0.3-1.3 s, docs/observability.md).
PARTITION_GAUGE_EVERY = 60.0


class QueueCollector(Collector):
    """Queue gauges read through the inspector, at most once per ``ttl`` seconds.

    Prometheus collects synchronously; call ``await refresh()`` before exposition (the
    servers here do) and :meth:`collect` reports the cached snapshot."""

    def __init__(
        self,
        app: AdminView,
        *,
        ttl: float = 5.0,
        registry: CollectorRegistry | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.ttl = ttl
        self._snapshot = Snapshot(self._read, ttl=ttl, monotonic=monotonic)
        every = max(ttl, PARTITION_GAUGE_EVERY)
        self._partition_reads = Snapshot(self._read_partitions, ttl=every, monotonic=monotonic)
        self._queues: list[QueueStats] = []
        self._limits: list[LimitStats] = []
        self._workflows: WorkflowCounts | None = None
        self._partitions: list[FairDepth] = []
        self._up = 0
        self._failure: DurqError | None = None
        self.registry = registry if registry is not None else CollectorRegistry()
        self.registry.register(self)

    async def _read(self) -> tuple[list[QueueStats], list[LimitStats], WorkflowCounts]:
        inspector = self.app.inspector
        # The workflow gauges read the newest records kept with their nodes' tasks, once per
        # ttl and never on the completion path: 1,000 workflows of 10 nodes cost 130-260 ms
        # a refresh on this project's test machine (docs/observability.md), hence the bound.
        return (
            await inspector.list_queues(),
            await inspector.list_limits(),
            await inspector.count_workflows(WORKFLOW_GAUGE_SCAN),
        )

    async def _read_partitions(self) -> list[FairDepth]:
        # Only queues with pending or active tasks can have partitions with tasks.
        busy = [
            q.name
            for q in self._queues
            if q.sizes.get(TaskState.PENDING) or q.sizes.get(TaskState.ACTIVE)
        ]
        top = PARTITION_GAUGE_TOP
        return [await self.app.inspector.fair_partitions(name, top) for name in busy]

    async def refresh(self) -> None:
        """Read the queues unless the snapshot is younger than ``ttl``."""
        try:
            self._queues, self._limits, self._workflows = await self._snapshot.get()
            self._partitions = await self._partition_reads.get()
            self._up = 1
        except DurqError as exc:
            if exc is not self._failure:  # once per failed read, not per scrape of it
                log.warning("metrics: cannot read queues: %s", exc)
            self._failure = exc
            self._up = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        size = GaugeMetricFamily(
            "durq_queue_size", "Tasks in the queue, by state.", labels=["queue", "state"]
        )
        age = GaugeMetricFamily(
            "durq_queue_oldest_pending_age_seconds",
            "Seconds since the oldest pending task became ready (0 when none).",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "durq_queue_paused", "1 when the queue is paused.", labels=["queue"]
        )
        unique = GaugeMetricFamily(
            "durq_queue_unique_keys",
            "Unique keys (durq.Unique) the queue's unfinished tasks hold now.",
            labels=["queue"],
        )
        partition = GaugeMetricFamily(
            "durq_fair_partition_tasks",
            f"Tasks of a fair limit's partition by state (pending, running): the "
            f"{PARTITION_GAUGE_TOP} busiest partitions of each queue, the rest summed as "
            'partition="other".',
            labels=["queue", "template", "partition", "state"],
        )
        for depth in self._partitions:
            others = depth.others
            rows = [*depth.top, others] if others.partitions else depth.top
            for p in rows:
                names = [p.template, p.key] if p.key else ["", "other"]
                partition.add_metric([depth.queue, *names, "pending"], p.pending)
                partition.add_metric([depth.queue, *names, "running"], p.running)
        up = GaugeMetricFamily("durq_broker_up", "1 when the last read of the queues succeeded.")
        labels = ["queue", "key"]
        running = GaugeMetricFamily(
            "durq_limit_running", "Attempts of a limit key running now.", labels=labels
        )
        concurrency = GaugeMetricFamily(
            "durq_limit_concurrency",
            "A limit key's concurrency in force (at most this many at once; an operator's "
            "override when one is set).",
            labels=labels,
        )
        tokens = GaugeMetricFamily(
            "durq_limit_tokens", "Starts a limit key's rate allows right now.", labels=labels
        )
        waiting = GaugeMetricFamily(
            "durq_limit_waiting", "Pending tasks held back on a limit key.", labels=labels
        )
        for lim in self._limits:
            key = [lim.queue, lim.key]
            running.add_metric(key, lim.running)
            waiting.add_metric(key, lim.waiting)
            if lim.limit_concurrency is not None:
                concurrency.add_metric(key, lim.limit_concurrency)
            if lim.tokens is not None:
                tokens.add_metric(key, lim.tokens)
        for q in self._queues:
            for state in TaskState:
                size.add_metric([q.name, state.value], q.sizes.get(state, 0))
            age.add_metric([q.name], q.oldest_pending_age)
            paused.add_metric([q.name], 1 if q.paused else 0)
            unique.add_metric([q.name], q.unique_keys)
        up.add_metric([], self._up)
        workflows = GaugeMetricFamily(
            "durq_workflows",
            "Workflows by state (running, succeeded, failed, cancelled) among the records "
            "kept, newest first up to a bound.",
            labels=["state"],
        )
        complete = GaugeMetricFamily(
            "durq_workflows_complete",
            "1 when durq_workflows counted every record kept, 0 when it stopped at its bound.",
        )
        if self._workflows is not None:
            for name, n in self._workflows.by_state.items():
                workflows.add_metric([name], n)
            complete.add_metric([], 1 if self._workflows.complete else 0)
        yield workflows
        yield complete
        yield size
        yield age
        yield paused
        yield unique
        yield running
        yield concurrency
        yield tokens
        yield waiting
        yield partition
        yield up


def exposition(*registries: CollectorRegistry) -> tuple[bytes, str]:
    """The text exposition of ``registries`` and its content type."""
    return b"".join(generate_latest(r) for r in registries), CONTENT_TYPE_LATEST


class _Union(Collector):
    """The metrics of several registries, exposed as one."""

    def __init__(self, registries: Sequence[CollectorRegistry]) -> None:
        self.registries = registries

    def collect(self) -> Iterator[Metric]:
        for registry in self.registries:
            yield from registry.collect()


class _Exposition:
    """prometheus-client's ASGI exposition app, after a (cached) read of the queue gauges."""

    def __init__(self, registry: CollectorRegistry, queues: QueueCollector) -> None:
        self.app = make_asgi_app(registry)
        self.queues = queues

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.queues.refresh()  # at most one broker read per ttl, however many scrapes
        await self.app(scope, receive, send)


class _QuietUvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # SIGTERM/SIGINT belong to the worker (graceful drain), not to this server


class MetricsServer:
    """``/metrics`` (prometheus-client's exposition app), ``/healthz`` and ``/readyz``,
    served by uvicorn on the caller's event loop, so it can await the inspector and the
    health probe.

    ``registries``: what ``/metrics`` exposes besides the queue gauges; default the task
    metrics :func:`install` adds to ``app`` (a supervisor passes the collector that reads
    its worker processes' files instead). ``readyz_details``: say why ``/readyz`` is not
    ready (the broker's error, which may name its host and user) instead of only that it is
    not; off by default, the port being open to whoever can reach it."""

    def __init__(
        self,
        app: MetricsHost,
        port: int,
        host: str = "0.0.0.0",  # noqa: S104  # scraped and probed from outside the host
        *,
        probe: HealthProbe | None = None,
        queue_ttl: float = 5.0,
        registries: Sequence[CollectorRegistry] | None = None,
        readyz_details: bool = False,
    ) -> None:
        self.app = app
        self.readyz_details = readyz_details
        self.host = host
        self.port = port
        if registries is None:
            registries = [install(app).registry]
        self.queues = QueueCollector(app, ttl=queue_ttl)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Union([*registries, self.queues.registry]))
        self.probe = probe or HealthProbe(app)
        self._server: _QuietUvicorn | None = None
        self._task: asyncio.Task[None] | None = None

    def asgi(self) -> Starlette:
        """The ASGI app that answers the three paths."""

        async def healthz(request: Request) -> PlainTextResponse:
            return PlainTextResponse("ok\n")

        async def readyz(request: Request) -> PlainTextResponse:
            status, text = readiness(await self.probe.check(), details=self.readyz_details)
            return PlainTextResponse(text, status_code=status)

        return Starlette(
            routes=[
                Route("/metrics", _Exposition(self.registry, self.queues), methods=["GET", "HEAD"]),
                Route("/healthz", healthz, methods=["GET", "HEAD"]),
                Route("/readyz", readyz, methods=["GET", "HEAD"]),
            ]
        )

    async def start(self) -> None:
        # Bound here, so a taken port raises at once and port 0 tells its real number.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.asgi(), lifespan="off", log_config=None, access_log=False, log_level="warning"
        )
        server = self._server = _QuietUvicorn(config)
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name="durq-metrics")
        while not server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the metrics server stopped while starting")
            await asyncio.sleep(0.005)
        log.info("metrics and health on http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await self._task
        self._server = self._task = None

    async def __aenter__(self) -> MetricsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def start_metrics_server(
    port: int,
    app: MetricsHost,
    host: str = "0.0.0.0",  # noqa: S104
    *,
    probe: HealthProbe | None = None,
    readyz_details: bool = False,
) -> MetricsServer:
    """Install the metrics on ``app`` and serve them with the health probes on ``port``
    (``readyz_details``: see :class:`MetricsServer`).

    Stop it with ``await server.stop()``."""
    server = MetricsServer(app, port, host, probe=probe, readyz_details=readyz_details)
    await server.start()
    return server


class MetricsThread:
    """A :class:`MetricsServer` on its own event loop in a daemon thread, for callers that
    have no loop yet (the ``durq worker`` command starts it before the worker's loop).

    The thread's loop gets its own broker connection from the app (one per loop)."""

    def __init__(
        self,
        app: MetricsHost,
        port: int,
        host: str = "0.0.0.0",  # noqa: S104
        *,
        readyz_details: bool = False,
    ) -> None:
        self.server = MetricsServer(app, port, host, readyz_details=readyz_details)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="durq-metrics", daemon=True)

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> None:
        """Start serving; raises here (e.g. the port is taken) if the server cannot start."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.server.start())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            self._loop.close()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._shutdown())
            self._loop.close()

    async def _shutdown(self) -> None:
        await self.server.stop()
        with contextlib.suppress(Exception):
            await self.server.app.close()

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)


def serve(
    app: MetricsHost,
    port: int,
    host: str = "0.0.0.0",  # noqa: S104
    *,
    readyz_details: bool = False,
) -> MetricsThread:
    """Install the metrics on ``app`` and serve ``/metrics``, ``/healthz``, ``/readyz`` on
    ``port`` from a background thread, started before this returns. Call it before the
    worker is created (the worker copies the app's hooks). ``readyz_details``: see
    :class:`MetricsServer`."""
    thread = MetricsThread(app, port, host, readyz_details=readyz_details)
    thread.start()
    return thread


__all__ = [
    "MetricsServer",
    "MetricsThread",
    "QueueCollector",
    "TaskMetrics",
    "exposition",
    "install",
    "installed",
    "serve",
    "start_metrics_server",
]
