"""O1: counters and histogram from a real worker, queue gauges, the metrics server."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import durq
from durq.brokers.base import ClaimParams
from durq.clock import FakeClock
from durq.observability import metrics
from durq.observability.snapshot import Snapshot


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def run_until_settled(app: durq.App, count: int) -> None:
    done = asyncio.Event()
    seen: list[str] = []

    class Done(durq.WorkerHooks):
        def task_finished(self, task: durq.TaskInfo, outcome: str, duration: float) -> None:
            seen.append(outcome)
            if len(seen) >= count:
                done.set()

    async with app.worker(concurrency=4, poll_interval=0.05, hooks=[Done()]):
        await asyncio.wait_for(done.wait(), 10)


async def test_task_counters_from_a_real_worker(app: durq.App) -> None:
    m = metrics.install(app)
    assert metrics.install(app) is m  # idempotent

    @app.task("ok:job")
    async def ok(payload: dict) -> None:
        return None

    @app.task("bad:job", max_retry=1, retry_delay=lambda n, e: 0.0)
    async def bad(payload: dict) -> None:
        raise RuntimeError("nope")

    await app.enqueue("ok:job", {})
    await app.enqueue("ok:job", {"n": 2})
    await app.enqueue("bad:job", {})
    await run_until_settled(app, 4)  # 2 ok, bad: retry then archived

    body, content_type = metrics.exposition(m.registry)
    assert content_type.startswith("text/plain")
    got = samples(body.decode())
    ok_l = (("queue", "default"), ("type", "ok:job"))
    bad_l = (("queue", "default"), ("type", "bad:job"))
    assert got[("durq_tasks_enqueued_total", ok_l)] == 2
    assert got[("durq_tasks_enqueued_total", bad_l)] == 1
    assert got[("durq_tasks_processed_total", ok_l)] == 2
    assert got[("durq_tasks_completed_total", ok_l)] == 2
    assert got[("durq_tasks_processed_total", bad_l)] == 2
    assert got[("durq_tasks_failed_total", bad_l)] == 2
    assert got[("durq_tasks_retried_total", bad_l)] == 1
    assert got[("durq_tasks_archived_total", bad_l)] == 1
    count_key = (
        "durq_task_duration_seconds_count",
        tuple(sorted((*ok_l, ("outcome", "completed")))),
    )
    assert got[count_key] == 2
    assert got[("durq_worker_busy_slots", ())] == 0
    assert got[("durq_worker_concurrency", ())] == 4


async def test_enqueue_many_and_sync_face_are_counted(app: durq.App) -> None:
    m = metrics.install(app)
    outcomes = await app.enqueue_many(
        [durq.EnqueueRequest("a:b", {}, task_id="x"), durq.EnqueueRequest("a:b", {}, task_id="x")]
    )
    assert [o.created for o in outcomes] == [True, False]
    got = samples(metrics.exposition(m.registry)[0].decode())
    assert got[("durq_tasks_enqueued_total", (("queue", "default"), ("type", "a:b")))] == 1


async def test_queue_collector_is_cached(app: durq.App) -> None:
    now = [100.0]
    collector = metrics.QueueCollector(app, ttl=5, monotonic=lambda: now[0])
    await app.enqueue("a:b", {})
    await collector.refresh()
    await app.enqueue("a:b", {}, queue="low", process_in=60)
    await collector.refresh()  # within the ttl: the old snapshot
    got = samples(metrics.exposition(collector.registry)[0].decode())
    assert got[("durq_queue_size", (("queue", "default"), ("state", "pending")))] == 1
    assert ("durq_queue_size", (("queue", "low"), ("state", "scheduled"))) not in got
    assert got[("durq_broker_up", ())] == 1
    now[0] += 6
    await collector.refresh()
    got = samples(metrics.exposition(collector.registry)[0].decode())
    assert got[("durq_queue_size", (("queue", "low"), ("state", "scheduled")))] == 1
    assert got[("durq_queue_paused", (("queue", "low"),))] == 0
    assert ("durq_queue_oldest_pending_age_seconds", (("queue", "default"),)) in got


async def test_limit_gauges(app: durq.App) -> None:
    collector = metrics.QueueCollector(app, ttl=0)
    limit = durq.Limit("partner:{p}", concurrency=2, rate="10/s")
    for _ in range(3):
        await app.enqueue("a:b", {"p": "acme"}, limit=limit)
    broker = await app.broker()
    await broker.claim(ClaimParams(["default"], 10, "w1", 30.0))
    await collector.refresh()
    got = samples(metrics.exposition(collector.registry)[0].decode())
    key = (("key", "partner:acme"), ("queue", "default"))
    assert got[("durq_limit_running", key)] == 2
    assert got[("durq_limit_concurrency", key)] == 2
    assert got[("durq_limit_waiting", key)] == 1
    assert 7.9 < got[("durq_limit_tokens", key)] <= 10
    # W23: an operator's override is the concurrency in force.
    await app.inspector.set_limit("default", "partner:acme", concurrency=0)
    await collector.refresh()
    got = samples(metrics.exposition(collector.registry)[0].decode())
    assert got[("durq_limit_concurrency", key)] == 0


async def test_fair_partition_gauge_is_bounded(
    app: durq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The busiest partitions one by one, the rest as one ``other`` series per queue."""
    monkeypatch.setattr(metrics, "PARTITION_GAUGE_TOP", 2)
    collector = metrics.QueueCollector(app, ttl=0)
    tenant = durq.Limit("tenant:{t}", concurrency=10, fair=True)
    for t, n in (("a", 3), ("b", 2), ("c", 1), ("d", 1)):
        for _ in range(n):
            await app.enqueue("a:b", {"t": t}, limit=tenant)
    await collector.refresh()
    got = {
        labels: value
        for (name, labels), value in samples(
            metrics.exposition(collector.registry)[0].decode()
        ).items()
        if name == "durq_fair_partition_tasks"
    }

    def series(template: str, partition: str, state: str) -> tuple[tuple[str, str], ...]:
        return (
            ("partition", partition), ("queue", "default"), ("state", state),
            ("template", template),
        )  # fmt: skip

    assert got == {
        series("tenant:{t}", "tenant:a", "pending"): 3,
        series("tenant:{t}", "tenant:a", "running"): 0,
        series("tenant:{t}", "tenant:b", "pending"): 2,
        series("tenant:{t}", "tenant:b", "running"): 0,
        series("", "other", "pending"): 2,
        series("", "other", "running"): 0,
    }


async def test_metrics_server_serves_metrics_and_probes(app: durq.App) -> None:
    await app.enqueue("a:b", {})
    server = await metrics.start_metrics_server(0, app, host="127.0.0.1")
    try:
        base = f"http://127.0.0.1:{server.port}"
        async with httpx.AsyncClient(base_url=base) as c:
            r = await c.get("/metrics")
            assert r.status_code == 200
            assert 'durq_queue_size{queue="default",state="pending"} 1.0' in r.text
            assert "# TYPE durq_tasks_processed_total counter" in r.text
            assert (await c.get("/healthz")).text == "ok\n"
            assert (await c.get("/readyz")).status_code == 200
            assert (await c.get("/nope")).status_code == 404
            assert (await c.post("/metrics")).status_code == 405
    finally:
        await server.stop()


async def test_readyz_is_503_when_the_broker_is_down() -> None:
    app = durq.App("sqlite:////nonexistent/dir/durq.sqlite3")
    server = await metrics.start_metrics_server(0, app, host="127.0.0.1")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as c:
            r = await c.get("/readyz")
            # Only the status: the reason names where the broker is (host, user, path).
            assert r.status_code == 503 and r.text == "not ready\n"
            assert (await c.get("/healthz")).status_code == 200
            r = await c.get("/metrics")
            assert "durq_broker_up 0.0" in r.text
    finally:
        await server.stop()


async def test_readyz_says_why_only_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    # A PostgreSQL URL with a user, on a port nothing listens on.
    app = durq.App("postgresql://probe-user@127.0.0.1:1/orders")
    for details in (False, True):
        server = await metrics.start_metrics_server(
            0, app, host="127.0.0.1", readyz_details=details
        )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as c:
                r = await c.get("/readyz")
        finally:
            await server.stop()
        assert r.status_code == 503
        if details:
            assert r.text.startswith("not ready: ") and "127.0.0.1" in r.text
        else:
            assert r.text == "not ready\n"
    # The reason is in the worker's log either way.
    assert any("broker ping failed" in m for m in caplog.messages)
    await app.close()


def test_serve_runs_in_a_thread_for_the_worker_command(tmp_path) -> None:
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    app.run_sync(lambda: _migrate(app))
    thread = metrics.serve(app, 0, host="127.0.0.1")
    try:
        assert metrics.installed(app) is not None
        assert any(isinstance(h, metrics.TaskMetrics) for h in app.worker_hooks)
        with urllib.request.urlopen(f"http://127.0.0.1:{thread.port}/readyz") as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{thread.port}/metrics") as r:
            assert b"durq_broker_up 1.0" in r.read()
    finally:
        thread.stop()
        app.close_sync()


async def _migrate(app: durq.App) -> None:
    await (await app.broker()).migrate()


async def test_dashboard_exposes_queue_metrics(app: durq.App) -> None:
    from durq.dashboard import create_dashboard

    await app.enqueue("a:b", {})
    dash = create_dashboard(app, token="metrics-token-1")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=dash), base_url="http://t") as c:
        assert (await c.get("/metrics")).status_code == 401
        r = await c.get("/metrics", headers={"Authorization": "Bearer metrics-token-1"})
        assert r.status_code == 200
        assert 'durq_queue_size{queue="default",state="pending"} 1.0' in r.text


async def test_autoscaling_figures_from_a_real_scrape(tmp_path) -> None:
    """What an autoscaler reads from a worker's /metrics: each queue's depth by state and
    the age of its oldest pending task, from one cached read of the broker per scrape."""
    clock = FakeClock(1_000.0)
    app = durq.App(f"sqlite:///{tmp_path / 'durq.sqlite3'}", clock=clock)
    await (await app.broker()).migrate()
    for _ in range(3):
        await app.enqueue("a:b", {}, queue="reports")
    await app.enqueue("a:b", {}, queue="mail", process_in=60)
    clock.advance(42)
    server = await metrics.start_metrics_server(0, app, host="127.0.0.1")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as c:
            got = samples((await c.get("/metrics")).text)
            await app.enqueue("a:b", {}, queue="reports")
            cached = samples((await c.get("/metrics")).text)  # within the 5 s cache
    finally:
        await server.stop()
        await app.close()
    reports, mail = (("queue", "reports"),), (("queue", "mail"),)
    assert got[("durq_queue_oldest_pending_age_seconds", reports)] == 42
    assert got[("durq_queue_oldest_pending_age_seconds", mail)] == 0
    assert got[("durq_queue_size", (*reports, ("state", "pending")))] == 3
    assert got[("durq_queue_size", (*reports, ("state", "active")))] == 0
    assert got[("durq_queue_size", (*mail, ("state", "scheduled")))] == 1
    assert cached[("durq_queue_size", (*reports, ("state", "pending")))] == 3


async def test_snapshot_reads_once_per_ttl_and_keeps_a_failure_as_long() -> None:
    now = [0.0]
    reads: list[float] = []
    fail = [False]

    async def read() -> float:
        reads.append(now[0])
        if fail[0]:
            raise durq.BrokerUnavailableError("down")
        return now[0]

    snap = Snapshot(read, ttl=5, monotonic=lambda: now[0])
    assert await asyncio.gather(*(snap.get() for _ in range(10))) == [0.0] * 10
    now[0] = 4.9
    assert await snap.get() == 0.0 and snap.age == 4.9
    now[0], fail[0] = 5.0, True
    for _ in range(3):
        with pytest.raises(durq.BrokerUnavailableError):
            await snap.get()
    now[0], fail[0] = 10.0, False
    assert await snap.get() == 10.0
    assert reads == [0.0, 5.0, 10.0]


async def test_workflow_gauges_count_the_records_kept_by_state(app: durq.App) -> None:
    @app.task("wf:ok")
    async def ok(payload: dict) -> int:
        return 1

    @app.task("wf:bad", max_retry=0)
    async def bad(payload: dict) -> None:
        raise ValueError("no")

    infos = []
    for kind in ("wf:ok", "wf:ok", "wf:bad"):
        wf = durq.Workflow("gauged")
        wf.add(kind, {}, name="only")
        infos.append(await app.enqueue_workflow(wf))
    waiting = durq.Workflow("gauged")
    waiting.add("wf:never", {}, name="only")
    await app.enqueue_workflow(waiting)
    async with app.worker(concurrency=2, poll_interval=0.05):
        for info in infos:
            with contextlib.suppress(durq.WorkflowFailedError):
                await app.wait(info, timeout=60)
    collector = metrics.QueueCollector(app, ttl=0)
    await collector.refresh()
    got = samples(metrics.exposition(collector.registry)[0].decode())
    by_state = {
        dict(labels)["state"]: value
        for (name, labels), value in got.items()
        if name == "durq_workflows"
    }
    assert by_state == {"running": 1, "succeeded": 2, "failed": 1, "cancelled": 0}
    assert got[("durq_workflows_complete", ())] == 1
    counts = await app.inspector.count_workflows(scan=3)
    assert sum(counts.by_state.values()) == 3 and not counts.complete
