"""O2: the enqueuing span's context travels in the task headers through a real broker, and
the handler runs in a child span (checked with the SDK's in-memory exporter)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import durq
from durq.observability import tracing

SEMCONV = (
    "messaging.system",
    "messaging.operation.type",
    "messaging.operation.name",
    "messaging.destination.name",
    "messaging.message.id",
)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp


@pytest.mark.parametrize("sync_handler", [False, True])
async def test_task_span_is_a_child_of_the_enqueuing_span(
    app: durq.App, provider: TracerProvider, exporter: InMemorySpanExporter, sync_handler: bool
) -> None:
    assert tracing.install(app, tracer_provider=provider)
    assert tracing.install(app, tracer_provider=provider)  # idempotent
    assert sum(isinstance(h, tracing.TracingHooks) for h in app.worker_hooks) == 1
    ran = asyncio.Event()
    loop = asyncio.get_running_loop()
    inner: list[trace.SpanContext] = []

    def body() -> dict:
        inner.append(trace.get_current_span().get_span_context())
        loop.call_soon_threadsafe(ran.set)
        return {}

    if sync_handler:
        app.task("trace:job")(lambda payload: body())
    else:

        async def handler(payload: dict) -> dict:
            return body()

        app.task("trace:job")(handler)

    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("POST /orders") as parent:
        info = await app.enqueue("trace:job", {"order": 1})
    assert info.headers["traceparent"].split("-")[1] == format(
        parent.get_span_context().trace_id, "032x"
    )
    stored = await app.inspector.get_task_info("default", info.id)
    assert "traceparent" in stored.headers  # it went through the broker

    async with app.worker(poll_interval=0.05):
        await asyncio.wait_for(ran.wait(), 10)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    # The enqueue is a producer span under the request's span...
    producer = spans["send default"]
    assert producer.kind == trace.SpanKind.PRODUCER
    assert producer.parent is not None
    assert producer.parent.span_id == parent.get_span_context().span_id
    assert info.headers["traceparent"].split("-")[2] == format(producer.context.span_id, "016x")
    assert producer.attributes is not None
    assert {k: producer.attributes[k] for k in SEMCONV} == {
        "messaging.system": "durq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "default",
        "messaging.message.id": info.id,
    }
    # ... and the handler's consumer span is its child, linked to it.
    child = spans["durq.task trace:job"]
    assert child.parent is not None
    assert child.parent.span_id == producer.context.span_id
    assert child.context.trace_id == parent.get_span_context().trace_id
    assert [link.context.span_id for link in child.links] == [producer.context.span_id]
    assert child.kind == trace.SpanKind.CONSUMER
    assert child.attributes is not None
    assert child.attributes["messaging.message.id"] == info.id
    assert child.attributes["messaging.operation.type"] == "process"
    # the handler itself sees the task span as current (also in a thread)
    assert inner[0].span_id == child.context.span_id


async def test_failing_handler_marks_the_span(
    app: durq.App, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracing.install(app, tracer_provider=provider)
    done = asyncio.Event()

    class Done(durq.WorkerHooks):
        def task_finished(self, task, outcome, duration):  # type: ignore[no-untyped-def]
            done.set()

    @app.task("trace:bad", max_retry=0)
    async def bad(payload: dict) -> None:
        raise ValueError("boom")

    await app.enqueue("trace:bad", {})
    async with app.worker(poll_interval=0.05, hooks=[Done()]):
        await asyncio.wait_for(done.wait(), 10)
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "durq.task trace:bad"]
    assert not span.status.is_ok
    assert span.events and span.events[0].name == "exception"


async def test_bulk_enqueue_sends_one_producer_span_per_task_and_marks_refusals(
    app: durq.App, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracing.install(app, tracer_provider=provider)
    outcomes = await app.enqueue_many(
        [durq.EnqueueRequest("trace:bulk", {"n": n}, task_id=f"b{n}") for n in range(3)]
    )
    assert all(o.created for o in outcomes)
    sent = [s for s in exporter.get_finished_spans() if s.name == "send default"]
    assert sorted(s.attributes["messaging.message.id"] for s in sent) == ["b0", "b1", "b2"]  # type: ignore[index]
    stored = await app.inspector.get_task_info("default", "b1")
    (b1,) = [s for s in sent if s.attributes["messaging.message.id"] == "b1"]  # type: ignore[index]
    assert stored.headers["traceparent"].split("-")[2] == format(b1.context.span_id, "016x")
    # A refused enqueue ends its span as an error.
    with pytest.raises(durq.TaskIDConflictError):
        await app.enqueue("trace:bulk", {}, task_id="b0")
    failed = [s for s in exporter.get_finished_spans() if s.name == "send default"][-1]
    assert not failed.status.is_ok


def test_without_opentelemetry_install_is_a_no_op() -> None:
    # A fresh interpreter where importing opentelemetry fails.
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import durq\n"
        "from durq.observability import tracing\n"
        "app = durq.App('sqlite:///:memory:')\n"
        "assert tracing.available() is False\n"
        "assert tracing.install(app) is False\n"
        "assert app.header_hooks == [] and app.worker_hooks == [] and app.send_hooks == []\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
