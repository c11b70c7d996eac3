"""The worker's lifecycle for operators, with real ``durq worker`` processes: ``--burst``
drains the queues and exits, ``--max-tasks-per-child`` / ``--max-memory-per-child`` recycle
worker processes without losing a task, ``--reload`` restarts the worker on a code change."""

from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest
from tests.cli.clikit import Cli
from tests.cli.test_cli_processes import children, enqueue, worker_pids

from durq.options import EnqueueRequest
from durq.states import TaskState

APP = textwrap.dedent(
    """
    import asyncio
    import os

    import durq

    app = durq.App("sqlite:///ignored-because-DURQ_BROKER_URL-overrides.sqlite3")

    @app.task("pid:report", retention="1h")
    async def report(payload: dict) -> dict:
        await asyncio.sleep(payload.get("seconds", 0))
        if payload.get("then"):  # work that appears while the worker runs
            await app.enqueue("pid:report", {}, task_id=payload["then"], retention=3600)
        return {"pid": os.getpid()}
    """
)


def state(cli: Cli, task_id: str) -> TaskState | None:
    info = cli.task(task_id)
    return None if info is None else info.state


def report(task_id: str, **payload: object) -> EnqueueRequest:
    return EnqueueRequest("pid:report", payload, task_id=task_id, retention=3600)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("processes", ["1", "2"])
def test_burst_drains_what_is_due_including_work_made_meanwhile_then_exits_0(
    cli: Cli, processes: str
) -> None:
    (cli.tmp_path / "app.py").write_text(APP)
    cli.ok("migrate")
    enqueue(
        cli,
        *(report(f"t{i}") for i in range(6)),
        report("parent", seconds=0.5, then="child"),
        EnqueueRequest("pid:report", {}, task_id="later", process_in=3600, retention=3600),
    )
    result = cli("worker", "app:app", "--burst", "--processes", processes, timeout=150)
    assert result.code == 0, result.err
    for task_id in [*(f"t{i}" for i in range(6)), "parent", "child"]:
        assert state(cli, task_id) is TaskState.COMPLETED, task_id
    assert state(cli, "later") is TaskState.SCHEDULED  # due later: left for the next run


@pytest.mark.timeout(120)
def test_a_single_worker_exits_0_after_max_tasks_and_leaves_the_rest_queued(cli: Cli) -> None:
    (cli.tmp_path / "app.py").write_text(APP)
    cli.ok("migrate")
    enqueue(cli, *(report(f"t{i}") for i in range(5)))
    result = cli(
        "worker", "app:app", "--max-tasks-per-child", "3", "--concurrency", "1", timeout=90
    )
    assert result.code == 0, result.err
    states = [state(cli, f"t{i}") for i in range(5)]
    assert states.count(TaskState.COMPLETED) == 3, states
    assert states.count(TaskState.PENDING) == 2, states


@pytest.mark.timeout(240)
def test_the_supervisor_replaces_a_worker_process_past_max_tasks_and_loses_nothing(
    cli: Cli,
) -> None:
    (cli.tmp_path / "app.py").write_text(APP)
    cli.ok("migrate")
    supervisor = cli.spawn(
        "worker", "app:app", "--processes", "2", "--max-tasks-per-child", "3",
        "--concurrency", "2",
    )  # fmt: skip
    enqueue(cli, *(report(f"t{i}", seconds=0.2) for i in range(14)))

    def all_done() -> bool:
        return all(state(cli, f"t{i}") is TaskState.COMPLETED for i in range(14))

    cli.wait_for(all_done, timeout=150, what="14 tasks completed")
    pids = {cli.task(f"t{i}").result["pid"] for i in range(14)}  # type: ignore[union-attr]
    assert len(pids) >= 5  # at most 3 tasks per process: 14 tasks took at least 5
    assert supervisor.poll() is None  # still supervising
    assert len(children(supervisor.pid)) == 2
    supervisor.send_signal(signal.SIGTERM)
    _, err = supervisor.communicate(timeout=60)
    assert supervisor.returncode == 0, err
    assert "retired; starting a fresh one" in err


@pytest.mark.timeout(120)
def test_past_max_memory_a_worker_finishes_its_task_and_exits_0(cli: Cli) -> None:
    (cli.tmp_path / "app.py").write_text(APP)
    cli.ok("migrate")
    enqueue(cli, report("slow", seconds=1))
    # Any Python worker uses more than 16 MB: it stops claiming at its first look.
    result = cli("worker", "app:app", "--max-memory-per-child", "16", timeout=90)
    assert result.code == 0, result.err
    assert "over the limit" in result.err
    # Claimed and finished, or never claimed: not left active (lost until its lease expires).
    assert state(cli, "slow") in (TaskState.COMPLETED, TaskState.PENDING)


@pytest.mark.timeout(180)
def test_reload_restarts_the_worker_when_a_py_file_changes(cli: Cli) -> None:
    app_file = cli.tmp_path / "app.py"
    app_file.write_text(APP)
    cli.ok("migrate")
    reloader = cli.spawn("worker", "app:app", "--reload")
    cli.wait_for(lambda: len(worker_pids(cli)) == 1, timeout=60, what="the first worker")
    (first,) = worker_pids(cli)
    assert first in children(reloader.pid)
    time.sleep(0.1)  # a later modification time than the reloader's first look, even coarse
    app_file.write_text(APP + "\n# changed\n")
    os.utime(app_file, ns=(time.time_ns(), time.time_ns() + 10**9))
    cli.wait_for(
        lambda: worker_pids(cli) - {first} != set(),
        timeout=60,
        what="a new worker after the change",
    )
    assert not os.path.exists(f"/proc/{first}")  # the old one stopped (and was reaped)
    reloader.send_signal(signal.SIGTERM)
    _, err = reloader.communicate(timeout=60)
    assert reloader.returncode == 0, err
    assert "changed; restarting the worker" in err
    assert worker_pids(cli) == set()  # the last worker stopped gracefully (unregistered)


def test_reload_with_processes_is_a_usage_error(cli: Cli) -> None:
    result = cli("worker", "app:app", "--reload", "--processes", "2")
    assert result.code == 2, result.err
