"""``durq worker --processes N``: a supervisor of real worker processes. It starts N, starts
one again after a SIGKILL, serves one metrics endpoint for all of them, and passes SIGTERM to
each for one graceful drain."""

from __future__ import annotations

import os
import signal
import textwrap
import urllib.request

import pytest
from tests.cli.clikit import Cli, assert_one_line_error

import durq
from durq.options import EnqueueRequest
from durq.states import TaskState
from servers import free_port

APP = textwrap.dedent(
    """
    import asyncio
    import os

    import durq

    app = durq.App("sqlite:///ignored-because-DURQ_BROKER_URL-overrides.sqlite3")

    @app.task("pid:report", retention="1h")
    async def report(payload: dict) -> dict:
        await asyncio.sleep(payload.get("seconds", 0))
        return {"pid": os.getpid()}
    """
)


def children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(p) for p in f.read().split()}


def worker_pids(cli: Cli) -> set[int]:
    app = durq.App(cli.url)
    try:
        return {w.pid for w in app.run_sync(app.inspector.list_workers)}
    finally:
        app.close_sync()


def enqueue(cli: Cli, *requests: EnqueueRequest) -> None:
    app = durq.App(cli.url)
    try:
        app.run_sync(lambda: app.enqueue_many(requests))
    finally:
        app.close_sync()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def completed_total(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("durq_tasks_completed_total{")
    )


@pytest.mark.timeout(300)
def test_supervisor_runs_restarts_and_drains_its_worker_processes(cli: Cli) -> None:
    (cli.tmp_path / "pidapp.py").write_text(APP)
    port = free_port()
    supervisor = cli.spawn(
        "worker", "pidapp:app", "--processes", "2", "--concurrency", "3",
        "--metrics-port", str(port),
    )  # fmt: skip
    cli.wait_for(lambda: len(worker_pids(cli)) == 2, timeout=60, what="two worker processes")
    first = worker_pids(cli)
    assert first == children(supervisor.pid)

    enqueue(
        cli, *(EnqueueRequest("pid:report", {}, task_id=f"t{i}", retention=3600) for i in range(12))
    )

    def all_done() -> bool:
        infos = [cli.task(f"t{i}") for i in range(12)]
        return all(i is not None and i.state is TaskState.COMPLETED for i in infos)

    cli.wait_for(all_done, timeout=60, what="12 tasks completed")
    # One endpoint for every process: the counts of both children, summed.
    cli.wait_for(lambda: completed_total(scrape(port)) == 12, what="12 completions in /metrics")

    # A crashed child is started again; the other one keeps running.
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    cli.wait_for(
        lambda: len(children(supervisor.pid) - first) == 1 and len(children(supervisor.pid)) == 2,
        timeout=30,
        what="a new worker process",
    )
    (new,) = children(supervisor.pid) - first
    cli.wait_for(lambda: new in worker_pids(cli), timeout=60, what="the new worker registered")

    # SIGTERM: every child drains (a running task finishes within the grace) and unregisters.
    enqueue(cli, EnqueueRequest("pid:report", {"seconds": 1}, task_id="slow", retention=3600))

    def slow_active() -> bool:
        info = cli.task("slow")
        return info is not None and info.state is TaskState.ACTIVE

    cli.wait_for(slow_active, timeout=30, what="the slow task to start")
    supervisor.send_signal(signal.SIGTERM)
    _, err = supervisor.communicate(timeout=60)
    assert supervisor.returncode == 0, err
    slow = cli.task("slow")
    assert slow is not None and slow.state is TaskState.COMPLETED
    assert slow.result["pid"] in first | {new}
    assert worker_pids(cli) <= {victim}  # the killed one could not unregister
    assert "was killed by SIGKILL" in err
    for pid in first | {new}:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)


@pytest.mark.timeout(120)
def test_a_configuration_error_stops_the_supervisor_instead_of_a_restart_loop(cli: Cli) -> None:
    # A schedule whose task has no handler: every worker process refuses to start.
    (cli.tmp_path / "noapp.py").write_text(
        APP + '\napp.add_periodic("@every 1h", "report:missing")\n'
    )
    result = cli("worker", "noapp:app", "--processes", "2", timeout=90)
    assert result.code == 2, result.err
    assert "no handler" in result.err
    assert "not starting it again" in result.err
    assert "starting it again in" not in result.err


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1].startswith("Z")


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_processes_must_be_a_positive_count_or_auto(cli: Cli, value: str) -> None:
    result = cli("worker", "examples.quickstart:app", "--processes", value)
    assert_one_line_error(result, 2, "--processes")
