"""Scale-down under load: SIGTERM to a real ``durq worker`` process (what Kubernetes sends to
a pod an autoscaler removes) while many tasks run, some of them long. Nothing is lost or run
twice beyond at-least-once: tasks that finish within ``--shutdown-timeout`` are completed once,
the long ones are handed back (pending, ``retried`` unchanged) and run again by the next
worker, nothing is archived, and in the end every task is completed (W7)."""

from __future__ import annotations

import signal
import textwrap
from collections import Counter
from pathlib import Path

from tests.cli.clikit import Cli

import durq
from durq.states import TaskState

#: Handlers that note each start and end in ``runs.log`` (one short line each, appended by
#: one write, so the lines of concurrent tasks and of two processes do not mix). A long task
#: waits until the test creates ``release``.
LOAD_APP = textwrap.dedent(
    """
    import asyncio
    import os
    import time

    import durq

    app = durq.App("sqlite:///ignored-because-DURQ_BROKER_URL-overrides.sqlite3")

    def note(what, tid):
        fd = os.open("runs.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{what} {tid} {os.getpid()}\\n".encode())
        finally:
            os.close(fd)

    @app.task("load:short")
    async def short(payload: dict) -> None:
        note("start", payload["id"])
        await asyncio.sleep(payload["seconds"])
        note("end", payload["id"])

    @app.task("load:long")
    async def long(payload: dict) -> None:
        note("start", payload["id"])
        while not os.path.exists("release"):
            await asyncio.sleep(0.05)
        note("end", payload["id"])

    @app.task("load:long_sync")
    def long_sync(payload: dict) -> None:
        note("start", payload["id"])  # a thread that cannot be cancelled
        while not os.path.exists("release"):
            time.sleep(0.05)
        note("end", payload["id"])
    """
)

SHORT, LONG, LONG_SYNC = 150, 6, 2
WORKER = ("worker", "loadapp:app", "--concurrency", "16", "--shutdown-timeout", "1")


def _runs(path: Path) -> list[tuple[str, str, int]]:
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(what, tid, int(pid)) for what, tid, pid in rows]


def test_sigterm_under_load_loses_nothing_and_hands_long_tasks_back(cli: Cli) -> None:
    (cli.tmp_path / "loadapp.py").write_text(LOAD_APP)
    runs_log = cli.tmp_path / "runs.log"
    app = durq.App(cli.url)
    try:
        app.run_sync(lambda: _migrate(app))
        requests = [
            durq.EnqueueRequest("load:long", {"id": f"long-{n}"}, task_id=f"long-{n}")
            for n in range(LONG)
        ]
        requests += [
            durq.EnqueueRequest("load:long_sync", {"id": f"sync-{n}"}, task_id=f"sync-{n}")
            for n in range(LONG_SYNC)
        ]
        requests += [
            durq.EnqueueRequest(
                "load:short",
                {"id": f"short-{n}", "seconds": 0.02 + (n % 5) * 0.02},
                task_id=f"short-{n}",
            )
            for n in range(SHORT)
        ]
        app.enqueue_many_sync(requests)
        total = len(requests)

        def sizes() -> dict[TaskState, int]:
            return app.run_sync(lambda: app.inspector.queue_stats("default")).sizes

        first = cli.spawn(*WORKER)
        # Under load: every long task running, short ones done and others still to come.
        cli.wait_for(
            lambda: (
                (s := sizes()).get(TaskState.COMPLETED, 0) >= 20
                and s.get(TaskState.ACTIVE, 0) >= LONG + LONG_SYNC
            ),
            timeout=30,
            what="the first worker to be busy",
        )
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=30)
        assert first.returncode == 0, err
        assert "Traceback" not in err

        after_first = sizes()
        assert after_first.get(TaskState.ACTIVE, 0) == 0, after_first
        assert after_first.get(TaskState.ARCHIVED, 0) == 0, after_first
        assert after_first.get(TaskState.RETRY, 0) == 0, after_first
        handed_back = _ids(app, TaskState.PENDING)
        done_by_first = _ids(app, TaskState.COMPLETED)
        assert len(handed_back) + len(done_by_first) == total
        # The long tasks could not finish within the grace: handed back, not failed.
        longs = {f"long-{n}" for n in range(LONG)} | {f"sync-{n}" for n in range(LONG_SYNC)}
        assert longs <= handed_back
        for task_id in longs:
            info = cli.task(task_id)
            assert info is not None and info.retried == 0, info

        (cli.tmp_path / "release").touch()
        second = cli.spawn(*WORKER)
        cli.wait_for(
            lambda: sizes().get(TaskState.COMPLETED, 0) == total,
            timeout=30,
            what="the second worker to finish everything",
        )
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=30)
        assert second.returncode == 0, err
        final = sizes()
        assert final.get(TaskState.COMPLETED, 0) == total, final
        retried = [
            t.id for t in _tasks(app, TaskState.COMPLETED) if t.retried != 0
        ]  # a handed-back attempt is not a failed one
        assert retried == []
    finally:
        app.close_sync()

    runs = _runs(runs_log)
    ends = Counter(tid for what, tid, _ in runs if what == "end")
    starts = Counter(tid for what, tid, _ in runs if what == "start")
    pids = {tid: {pid for what, t, pid in runs if t == tid and what == "end"} for tid in ends}
    # Every task ran to its end exactly once...
    assert set(ends) == handed_back | done_by_first and set(ends.values()) == {1}
    # ...those the first worker completed ran only there, once...
    assert all(starts[tid] == 1 and pids[tid] == {first.pid} for tid in done_by_first)
    # ...and those handed back ended in the second worker, after at most one earlier start.
    assert all(starts[tid] <= 2 and pids[tid] == {second.pid} for tid in handed_back)
    assert all(starts[tid] == 2 for tid in longs)


async def _migrate(app: durq.App) -> None:
    await (await app.broker()).migrate()


def _tasks(app: durq.App, state: TaskState) -> list[durq.TaskInfo]:
    return app.run_sync(lambda: app.inspector.list_tasks("default", state, limit=1000))


def _ids(app: durq.App, state: TaskState) -> set[str]:
    return {t.id for t in _tasks(app, state)}
