"""Reliability scenarios with real worker processes: graceful shutdown under load, tasks
longer than their lease, a poison pill, and scheduled tasks that fall due during a broker
outage. Short forms run in ``make test``; full forms are marked ``chaos``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import durq
from chaos.harness import (
    QUEUE,
    Cluster,
    ThrowawayPostgres,
    check,
    enqueue_work,
    final_states,
    percentile,
    storm,
    wait_done,
)
from chaos.test_storm import migrate
from durq.brokers import open_broker
from durq.options import EnqueueRequest
from durq.states import TaskState
from servers import PrivateRedis


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'scenario.sqlite3'}"


# -- graceful shutdown under load (W7) --------------------------------------------------------------


async def graceful(
    url: str, clusters: Callable[..., Cluster], record, *, grace: float, tasks: int, ms: int
) -> None:
    await migrate(url)
    ids = await enqueue_work(url, tasks, ms=ms)
    cluster = clusters(url, 2, "--lease", "4", "--concurrency", "8", "--grace", str(grace))
    cluster.start_all()
    await cluster.wait_ready()
    await asyncio.sleep(ms / 1000 * 1.5)  # every slot busy, mid-task
    began = time.monotonic()
    codes = await asyncio.to_thread(cluster.terminate_all, grace + 20)
    stopped_in = time.monotonic() - began
    assert codes == [0, 0], cluster.stderr_tail()
    # Nothing is active after a graceful stop: finished or handed back.
    assert (await final_states(url)).get("active", 0) == 0
    cluster.start_all()
    await wait_done(url, tasks, timeout=120)
    cluster.stop()
    runs = cluster.runs()
    report = check(ids, runs, await final_states(url), deaths=cluster.deaths)
    report.extra.update(grace=grace, stopped_in=round(stopped_in, 2))
    report.extra["handed_back"] = sum(r.how == "cancel" for r in runs)
    record(report)
    assert report.ok, report.summary()
    if grace > ms / 1000 * 2:
        # A long grace lets every running handler finish: no second run of anything.
        assert report.duplicated == 0
        assert report.extra["handed_back"] == 0
        assert stopped_in < grace
    else:
        assert report.extra["handed_back"] > 0
        assert stopped_in < grace + 5
        # A hand-back does not count an attempt: the re-run has the same attempt number.
        cancelled = {(r.task_id, r.attempt) for r in runs if r.how == "cancel"}
        rerun = {(r.task_id, r.attempt) for r in runs if r.how == "end"}
        assert cancelled <= rerun


@pytest.mark.parametrize("grace", [10.0, 0.3])
async def test_graceful_shutdown_short(tmp_path, clusters, record, grace) -> None:
    await graceful(sqlite_url(tmp_path), clusters, record, grace=grace, tasks=48, ms=1200)


@pytest.mark.chaos
@pytest.mark.timeout(300)
@pytest.mark.parametrize("grace", [15.0, 0.3])
async def test_graceful_shutdown_full(broker_url, clusters, record, grace) -> None:
    await graceful(broker_url, clusters, record, grace=grace, tasks=400, ms=1000)


# -- tasks three times longer than the lease run exactly once (heartbeats, W1) -----------------------


async def long_tasks(url: str, clusters, record, *, lease: float, tasks: int) -> None:
    await migrate(url)
    seconds = 3 * lease
    ids = await enqueue_work(url, tasks, ms=int(seconds * 1000))
    cluster = clusters(url, 2, "--lease", str(lease), "--concurrency", "8", "--rescue", "0.5")
    cluster.start_all()
    await wait_done(url, tasks, timeout=seconds * (tasks / 16 + 2) + 30)
    cluster.stop()
    runs = cluster.runs()
    report = check(ids, runs, await final_states(url), deaths=cluster.deaths)
    report.extra.update(lease=lease, task_seconds=seconds)
    record(report)
    assert report.ok, report.summary()
    assert report.duplicated == 0 and len(runs) == tasks, "a live task was run twice"
    assert all(r.attempt == 0 for r in runs)


async def test_tasks_longer_than_lease_short(tmp_path, clusters, record) -> None:
    await long_tasks(sqlite_url(tmp_path), clusters, record, lease=1.5, tasks=16)


@pytest.mark.chaos
@pytest.mark.timeout(300)
async def test_tasks_longer_than_lease_full(broker_url, clusters, record) -> None:
    await long_tasks(broker_url, clusters, record, lease=3.0, tasks=48)


# -- the poison pill (W1: archived after max_lost worker losses) -----------------------------------


async def poison_pill(url: str, clusters, record, *, others: int) -> None:
    await migrate(url)
    app = durq.App(url)
    await app.enqueue("chaos:poison", {}, queue=QUEUE, task_id="poison", retention=3600)
    await app.close()
    ids = await enqueue_work(url, others, ms=20)
    # Concurrency 1: a task sharing a process with the poison would share its fate.
    # A 3 s lease: long enough that a busy machine's late heartbeat is not a lost worker.
    cluster = clusters(url, 2, "--lease", "3", "--concurrency", "1", "--rescue", "0.5")
    cluster.start_all()
    broker = open_broker(url)
    await broker.connect()
    began = time.monotonic()
    try:
        while True:
            cluster.respawn_exited()  # what a supervisor does
            poison = await broker.admin.get_task(QUEUE, "poison")
            stats = await broker.admin.queue_stats(QUEUE)
            if poison.state is TaskState.ARCHIVED and stats.sizes[TaskState.COMPLETED] == others:
                break
            assert time.monotonic() - began < 90, (poison, stats.sizes)
            await asyncio.sleep(0.2)
    finally:
        await broker.close()
    cluster.stop()
    runs = cluster.runs()
    poison_runs = [r for r in runs if r.task_id == "poison"]
    report = check(ids, [r for r in runs if r.task_id != "poison"], await final_states(url))
    report.extra.update(poison_starts=len(poison_runs), worker_losses=cluster.restarts)
    record(report)
    assert poison.last_error == "worker lost"
    assert len(poison_runs) == 3  # max_lost
    assert report.lost == [] and report.duplicated == 0 and not report.overlaps
    assert report.final_states == {"completed": others, "archived": 1}


async def test_poison_pill_short(tmp_path, clusters, record) -> None:
    await poison_pill(sqlite_url(tmp_path), clusters, record, others=100)


@pytest.mark.chaos
@pytest.mark.timeout(300)
async def test_poison_pill_full(broker_url, clusters, record) -> None:
    await poison_pill(broker_url, clusters, record, others=1000)


# -- scheduled tasks that fall due during a broker outage (E2) -------------------------------------


async def due_during_outage(
    url: str,
    crash: Callable[[], None],
    restart: Callable[[], None],
    clusters,
    record,
    *,
    tasks: int,
) -> None:
    await migrate(url)
    # Workers first, then the tasks: a slow start on a busy machine must not let the tasks
    # fall due (and run) before the broker goes down.
    cluster = clusters(url, 2, "--lease", "4", "--concurrency", "8")
    cluster.start_all()
    await cluster.wait_ready()
    app = durq.App(url)
    ids = [f"s{i:05d}" for i in range(tasks)]
    outcomes = await app.enqueue_many(
        [
            EnqueueRequest(
                "chaos:work", {"ms": 5}, queue=QUEUE, task_id=t, process_in=4.0, retention=3600
            )
            for t in ids
        ]
    )
    await app.close()
    assert all(o.created for o in outcomes)
    await asyncio.sleep(1.2)  # AOF everysec: the enqueues are on disk
    await asyncio.to_thread(crash)
    await asyncio.sleep(4.5)  # every task falls due while the broker is down
    await asyncio.to_thread(restart)
    restarted = time.time()
    await wait_done(url, tasks, timeout=60, every=0.1)
    cluster.stop()
    runs = cluster.runs()
    report = check(ids, runs, await final_states(url), deaths=cluster.deaths)
    delays = sorted(r.start - restarted for r in runs)
    report.extra.update(
        first_start_after_restart=round(delays[0], 2),
        p99_start_after_restart=round(percentile(delays, 99), 2),
        last_start_after_restart=round(delays[-1], 2),
    )
    record(report)
    assert report.ok, report.summary()
    assert delays[0] >= 0, "a task ran while the broker was down"
    # Promptly: within the workers' reconnect back-off (at most 5 s) plus a claim or two.
    assert delays[-1] < 7.0, delays[-1]


async def test_due_during_redis_outage_short(clusters, record, throwaway_redis) -> None:
    server: PrivateRedis = throwaway_redis("--appendonly", "yes", "--appendfsync", "everysec")
    await due_during_outage(
        f"{server.url}?prefix=due", server.kill, server.start, clusters, record, tasks=200
    )


@pytest.mark.chaos
@pytest.mark.timeout(300)
async def test_due_during_postgres_outage_full(clusters, record, throwaway_pg) -> None:
    server: ThrowawayPostgres = throwaway_pg()
    await due_during_outage(
        server.dsn, lambda: server.stop("immediate"), server.start, clusters, record, tasks=2000
    )


@pytest.mark.chaos
@pytest.mark.timeout(300)
async def test_due_during_redis_outage_full(clusters, record, throwaway_redis) -> None:
    server: PrivateRedis = throwaway_redis("--appendonly", "yes", "--appendfsync", "everysec")
    await due_during_outage(
        f"{server.url}?prefix=due", server.kill, server.start, clusters, record, tasks=2000
    )


# -- groups: one follow-up per group, with every member, under a kill storm ---------------------


async def groups_storm(
    url: str,
    clusters,
    record,
    *,
    groups: int,
    size: int,
    ms: int,
    kill_every: float,
    timeout: float,
) -> None:
    """Workers are killed at random while they complete the members of many groups, the
    last members of a group often at the same instant on different workers: every group gets
    its follow-up, created once, after its last member, listing every member as completed."""
    await migrate(url)
    app = durq.App(url)
    made = []
    try:
        for g in range(groups):
            made.append(
                await app.enqueue_group(
                    [
                        EnqueueRequest(
                            "chaos:work",
                            {"ms": ms},
                            queue=QUEUE,
                            task_id=f"g{g}-{i}",
                            retention=3600,
                        )
                        for i in range(size)
                    ],
                    then=durq.Then("chaos:merge", queue=QUEUE, retention=3600),
                )
            )
    finally:
        await app.close()
    ids = [t.id for group in made for t in group.tasks] + [f"group:{g.id}" for g in made]
    # Members claimed together are lost together: a batch can lose three workers in a row
    # and be archived as a poison pill, which is its own rule (tested elsewhere), not this one.
    cluster = clusters(
        url, 3, "--lease", "2", "--concurrency", "8", "--rescue", "0.5", "--max-lost", "1000"
    )
    cluster.start_all()
    await cluster.wait_ready()
    await storm(cluster, url, len(ids), kill_every=kill_every, timeout=timeout)
    cluster.stop()
    report = check(
        ids, cluster.runs(), await final_states(url), deaths=cluster.deaths, kills=cluster.kills
    )
    report.extra.update(groups=groups, size=size)
    record(report)
    assert report.ok, report.summary()
    assert report.kills >= 1
    app = durq.App(url)
    try:
        for group in made:
            info = await app.inspector.get_group(QUEUE, group.id)
            assert (info.finished, info.total) == (size, size)
            follow = await app.inspector.get_task_info(QUEUE, f"group:{group.id}")
            assert follow.result == {"size": size, "completed": size}, follow
    finally:
        await app.close()


async def test_groups_under_kills_short(tmp_path, clusters, record) -> None:
    await groups_storm(
        sqlite_url(tmp_path),
        clusters,
        record,
        groups=20,
        size=20,
        ms=250,
        kill_every=0.7,
        timeout=120,
    )


@pytest.mark.chaos
@pytest.mark.timeout(400)
async def test_groups_under_kills_full(broker_url, clusters, record) -> None:
    await groups_storm(
        broker_url,
        clusters,
        record,
        groups=100,
        size=30,
        ms=50,
        kill_every=1.0,
        timeout=300,
    )
