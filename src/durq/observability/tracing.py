"""OpenTelemetry tracing: the enqueuing span's context travels in the task's headers
(W3C ``traceparent``/``tracestate``) and the handler runs in a child span
``durq.task <type>``.

Optional: without ``opentelemetry-api`` installed, :func:`install` returns ``False`` and adds
nothing, so tasks pay nothing. With the API but no SDK configured, spans are no-ops."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from durq.task import TaskInfo
from durq.worker.hooks import WorkerHooks

try:  # the dependency is optional
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - exercised only without the extra
    propagate = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from durq.app import App

TRACER_NAME = "durq"
#: Prefix of the span name; the task type follows.
SPAN_PREFIX = "durq.task"


def available() -> bool:
    """``True`` when ``opentelemetry-api`` is importable."""
    return trace is not None


def inject_headers(headers: dict[str, str]) -> None:
    """Header hook: write the current trace context into a new task's headers."""
    if propagate is not None:
        propagate.inject(headers)


class TracingHooks(WorkerHooks):
    """Runs each handler call in a consumer span whose parent comes from the task headers."""

    def __init__(self, tracer_provider: Any = None) -> None:
        assert trace is not None
        self.tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)

    @contextlib.contextmanager
    def around(self, task: TaskInfo) -> Iterator[None]:
        assert trace is not None and propagate is not None
        parent = propagate.extract(task.headers)
        attributes: dict[str, Any] = {
            "messaging.system": "durq",
            "messaging.destination.name": task.queue,
            "messaging.message.id": task.id,
            "durq.task.type": task.type,
            "durq.task.attempt": task.retried + 1,
        }
        # start_as_current_span records an exception raised by the handler and marks the
        # span as an error; the worker then decides retry or archive as usual.
        with self.tracer.start_as_current_span(
            f"{SPAN_PREFIX} {task.type}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
        ):
            yield


def install(app: App, tracer_provider: Any = None) -> bool:
    """Propagate trace context through ``app``'s tasks; ``False`` without OpenTelemetry.

    Idempotent. ``tracer_provider``: default the global one (set by your SDK set-up)."""
    if not available():
        return False
    if inject_headers not in app.header_hooks:
        app.header_hooks.append(inject_headers)
    if not any(isinstance(h, TracingHooks) for h in app.worker_hooks):
        app.worker_hooks.append(TracingHooks(tracer_provider))
    return True
