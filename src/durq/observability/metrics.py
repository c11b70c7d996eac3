"""Prometheus metrics. Needs ``durq[metrics]`` (prometheus-client).

* :func:`install` adds counters and the duration histogram to an app: a worker hook counts
  what workers do; an ``app.enqueue_hooks`` entry counts the tasks this process created.
* :class:`QueueCollector` exports queue sizes and oldest-pending ages read through the
  inspector, cached for a few seconds so scrapes never load the broker.
* :func:`start_metrics_server` serves ``/metrics``, ``/healthz`` and ``/readyz`` on a port,
  from the worker's own event loop (``durq worker --metrics-port``).

Names and labels are listed in ``docs/observability.md``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from durq.errors import DurqError
from durq.observability.health import HealthProbe
from durq.states import TaskState
from durq.task import TaskInfo
from durq.worker.hooks import WorkerHooks

if TYPE_CHECKING:
    from durq.app import App

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
        self.busy = Gauge(
            "durq_worker_busy_slots", "Task slots running a handler now.", registry=registry
        )
        self.slots = Gauge(
            "durq_worker_concurrency",
            "Task slots of the workers in this process.",
            registry=registry,
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


_installed: weakref.WeakKeyDictionary[App, TaskMetrics] = weakref.WeakKeyDictionary()


def install(app: App, registry: CollectorRegistry | None = None) -> TaskMetrics:
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


def installed(app: App) -> TaskMetrics | None:
    """The metrics :func:`install` added to ``app``, if any."""
    return _installed.get(app)


class QueueCollector(Collector):
    """Queue gauges read through the inspector, at most once per ``ttl`` seconds.

    Prometheus collects synchronously; call ``await refresh()`` before exposition (the
    servers here do) and :meth:`collect` reports the cached snapshot."""

    def __init__(
        self,
        app: App,
        *,
        ttl: float = 5.0,
        registry: CollectorRegistry | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.ttl = ttl
        self._monotonic = monotonic
        self._fetched_at: float | None = None
        self._queues: list[Any] = []
        self._up = 0
        self._lock: asyncio.Lock | None = None
        self.registry = registry if registry is not None else CollectorRegistry()
        self.registry.register(self)

    async def refresh(self) -> None:
        """Read the queues unless the snapshot is younger than ``ttl``."""
        now = self._monotonic()
        if self._fetched_at is not None and now - self._fetched_at < self.ttl:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._fetched_at is not None and self._monotonic() - self._fetched_at < self.ttl:
                return
            try:
                self._queues = await self.app.inspector.list_queues()
                self._up = 1
            except DurqError as exc:
                log.warning("metrics: cannot read queues: %s", exc)
                self._up = 0
            self._fetched_at = self._monotonic()

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
        up = GaugeMetricFamily("durq_broker_up", "1 when the last read of the queues succeeded.")
        for q in self._queues:
            for state in TaskState:
                size.add_metric([q.name, state.value], q.sizes.get(state, 0))
            age.add_metric([q.name], q.oldest_pending_age)
            paused.add_metric([q.name], 1 if q.paused else 0)
        up.add_metric([], self._up)
        yield size
        yield age
        yield paused
        yield up


def exposition(*registries: CollectorRegistry) -> tuple[bytes, str]:
    """The text exposition of ``registries`` and its content type."""
    return b"".join(generate_latest(r) for r in registries), CONTENT_TYPE_LATEST


class MetricsServer:
    """A small HTTP/1.1 server on the worker's event loop: ``/metrics``, ``/healthz``,
    ``/readyz``. It runs on the loop so it can await the inspector and the health probe."""

    def __init__(
        self,
        app: App,
        port: int,
        host: str = "0.0.0.0",  # noqa: S104  # scraped and probed from outside the host
        *,
        probe: HealthProbe | None = None,
        queue_ttl: float = 5.0,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.metrics = install(app)
        self.queues = QueueCollector(app, ttl=queue_ttl)
        self.probe = probe or HealthProbe(app)
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        sockets = self._server.sockets
        if sockets:
            self.port = sockets[0].getsockname()[1]  # the real port when 0 was asked
        log.info("metrics and health on http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> MetricsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            # Drain the headers; the body (none expected) is ignored.
            while True:
                header = await asyncio.wait_for(reader.readline(), 5)
                if header in (b"\r\n", b"\n", b""):
                    break
            method, _, rest = line.decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            status, content_type, body = await self._answer(method, path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, method: str, path: str) -> tuple[str, str, bytes]:
        text = "text/plain; charset=utf-8"
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", text, b"method not allowed\n"
        if path == "/metrics":
            await self.queues.refresh()
            body, content_type = exposition(self.metrics.registry, self.queues.registry)
            return "200 OK", content_type, body
        if path == "/healthz":
            return "200 OK", text, b"ok\n"
        if path == "/readyz":
            health = await self.probe.check()
            if health.ok:
                return "200 OK", text, b"ready\n"
            return "503 Service Unavailable", text, f"not ready: {health.error}\n".encode()
        return "404 Not Found", text, b"not found\n"


async def start_metrics_server(
    port: int,
    app: App,
    host: str = "0.0.0.0",  # noqa: S104
    *,
    probe: HealthProbe | None = None,
) -> MetricsServer:
    """Install the metrics on ``app`` and serve them with the health probes on ``port``.

    Stop it with ``await server.stop()``."""
    server = MetricsServer(app, port, host, probe=probe)
    await server.start()
    return server


class MetricsThread:
    """A :class:`MetricsServer` on its own event loop in a daemon thread, for callers that
    have no loop yet (the ``durq worker`` command starts it before the worker's loop).

    The thread's loop gets its own broker connection from the app (one per loop)."""

    def __init__(self, app: App, port: int, host: str = "0.0.0.0") -> None:  # noqa: S104
        self.server = MetricsServer(app, port, host)
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


def serve(app: App, port: int, host: str = "0.0.0.0") -> MetricsThread:  # noqa: S104
    """Install the metrics on ``app`` and serve ``/metrics``, ``/healthz``, ``/readyz`` on
    ``port`` from a background thread, started before this returns. Call it before the
    worker is created (the worker copies the app's hooks)."""
    thread = MetricsThread(app, port, host)
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
