"""OpenTelemetry tracing: each enqueue is a PRODUCER span ``send <queue>`` (a child of the
enqueuing request's span) whose context travels in the task's headers (W3C
``traceparent``/``tracestate``); the handler runs in a CONSUMER span ``durq.task <type>``,
a child of the producer span that also links to it. Both carry the messaging
semantic-convention attributes (``messaging.system``, ``messaging.operation.type``,
``messaging.destination.name``, ``messaging.message.id``).

Optional: without ``opentelemetry-api`` installed, :func:`install` returns ``False`` and adds
nothing, so tasks pay nothing. With the API but no SDK configured, spans are no-ops."""

from __future__ import annotations

import contextlib
import dataclasses
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
    from durq.appview import HookPoints
    from durq.brokers.params import EnqueueParams

TRACER_NAME = "durq"
#: Prefix of the span name; the task type follows.
SPAN_PREFIX = "durq.task"
#: The value of ``messaging.system`` on every span.
MESSAGING_SYSTEM = "durq"


def available() -> bool:
    """``True`` when ``opentelemetry-api`` is importable."""
    return trace is not None


def inject_headers(headers: dict[str, str]) -> None:
    """Header hook: write the current trace context into a new task's headers."""
    if propagate is not None:
        propagate.inject(headers)


class ProducerSpans:
    """Send hook: one PRODUCER span per task sent, its context written into the headers."""

    def __init__(self, tracer_provider: Any = None) -> None:
        assert trace is not None
        self.tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)

    @contextlib.contextmanager
    def __call__(self, params: list[EnqueueParams]) -> Iterator[list[EnqueueParams]]:
        assert trace is not None and propagate is not None
        spans, sent = [], []
        for item in params:
            span = self.tracer.start_span(
                f"send {item.queue}",
                kind=trace.SpanKind.PRODUCER,
                attributes={
                    "messaging.system": MESSAGING_SYSTEM,
                    "messaging.operation.type": "send",
                    "messaging.operation.name": "send",
                    "messaging.destination.name": item.queue,
                    "messaging.message.id": item.id,
                    "messaging.message.body.size": len(item.payload),
                    "durq.task.type": item.type,
                },
            )
            headers = dict(item.headers)
            propagate.inject(headers, context=trace.set_span_in_context(span))
            spans.append(span)
            sent.append(dataclasses.replace(item, headers=headers))
        try:
            yield sent
        except BaseException as exc:
            for span in spans:
                span.record_exception(exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            for span in spans:
                span.end()


class TracingHooks(WorkerHooks):
    """Runs each handler call in a consumer span whose parent comes from the task headers."""

    def __init__(self, tracer_provider: Any = None) -> None:
        assert trace is not None
        self.tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)

    @contextlib.contextmanager
    def around(self, task: TaskInfo) -> Iterator[None]:
        assert trace is not None and propagate is not None
        parent = propagate.extract(task.headers)
        # The creation context: the producer span when the enqueuer traced, else its caller.
        producer = trace.get_current_span(parent).get_span_context()
        attributes: dict[str, Any] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
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
            links=[trace.Link(producer)] if producer.is_valid else None,
        ):
            yield


def install(app: HookPoints, tracer_provider: Any = None) -> bool:
    """Propagate trace context through ``app``'s tasks; ``False`` without OpenTelemetry.

    Idempotent. ``tracer_provider``: default the global one (set by your SDK set-up)."""
    if not available():
        return False
    if inject_headers not in app.header_hooks:
        app.header_hooks.append(inject_headers)
    if not any(isinstance(h, ProducerSpans) for h in app.send_hooks):
        app.send_hooks.append(ProducerSpans(tracer_provider))
    if not any(isinstance(h, TracingHooks) for h in app.worker_hooks):
        app.worker_hooks.append(TracingHooks(tracer_provider))
    return True
