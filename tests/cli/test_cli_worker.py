"""``durq worker`` in a real process: tasks enqueued by ``durq enqueue`` from another process
are processed, and SIGTERM during a long task hands it back as pending with ``retried``
unchanged (W7)."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
import urllib.error
import urllib.request

import pytest
from tests.cli.clikit import REPO, Cli

from durq.states import TaskState
from servers import free_port

SLOW_APP = textwrap.dedent(
    """
    import asyncio
    import time

    import durq

    app = durq.App("sqlite:///ignored-because-DURQ_BROKER_URL-overrides.sqlite3")

    @app.task("slow:sleep", max_retry=5)
    async def sleep(payload: dict) -> None:
        await asyncio.sleep(payload["seconds"])

    @app.task("slow:block", max_retry=5)
    def block(payload: dict) -> None:
        time.sleep(payload["seconds"])  # a sync handler: a thread that cannot be cancelled
    """
)


def _stop(proc: subprocess.Popen[str], timeout: float = 10) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def test_worker_processes_tasks_enqueued_from_another_process(cli: Cli) -> None:
    worker = cli.spawn("worker", "examples.quickstart:app", "--concurrency", "4", cwd=REPO)
    cli.ok(
        "enqueue", "email:send", "--payload", '{"to": "a@b.c"}', "--task-id", "mail-1",
        "--retention", "1h",
    )  # fmt: skip
    # --app gives the task its registered options: queue "low", retention 1h.
    cli.ok("enqueue", "report:build", "--payload", '{"rows": 7}', "--task-id", "rep-1",
           "--app", "examples.quickstart:app", cwd=REPO)  # fmt: skip
    # The README's way: DURQ_APP instead of --app.
    cli.env["DURQ_APP"] = "examples.quickstart:app"
    cli.ok("enqueue", "email:send", "--payload", '{"to": "c@d.e"}', "--task-id", "welcome-1",
           cwd=REPO)  # fmt: skip
    conflict = cli("enqueue", "email:send", "--task-id", "welcome-1", cwd=REPO)
    assert conflict.code == 1 and "welcome-1" in conflict.err
    del cli.env["DURQ_APP"]

    def done(task_id: str, queue: str) -> bool:
        info = cli.task(task_id, queue)
        return info is not None and info.state is TaskState.COMPLETED

    cli.wait_for(lambda: done("mail-1", "default"), what="email:send completed")
    cli.wait_for(lambda: done("rep-1", "low"), what="report:build completed")
    cli.wait_for(lambda: done("welcome-1", "default"), what="welcome-1 completed")

    mail = cli.ok("task", "get", "mail-1", "--json").json()
    assert mail["result"] == {"sent": True}
    assert cli.ok("task", "get", "rep-1", "--queue", "low", "--json").json()["result"] == {
        "rows": 7
    }
    (info,) = cli.ok("workers", "--json").json()
    assert info["pid"] == worker.pid
    assert info["queues"] == {"default": 1, "low": 1}
    assert info["concurrency"] == 4

    code, err = _stop(worker)
    assert code == 0, err
    assert "email:send" in err  # the log names what it ran
    assert cli.ok("workers", "--json").json() == []


@pytest.mark.parametrize("task_type", ["slow:sleep", "slow:block"])
def test_sigterm_during_a_long_task_hands_it_back_as_pending(cli: Cli, task_type: str) -> None:
    (cli.tmp_path / "slowapp.py").write_text(SLOW_APP)
    # The worker imports slowapp from its working directory, like uvicorn.
    worker = cli.spawn("worker", "slowapp:app", "--shutdown-timeout", "0.2", "--log-format", "json")
    cli.ok("enqueue", task_type, "--payload", '{"seconds": 60}', "--task-id", "long-1")

    def active() -> bool:
        info = cli.task("long-1")
        return info is not None and info.state is TaskState.ACTIVE

    cli.wait_for(active, what="the long task to start")
    started = time.monotonic()
    code, err = _stop(worker)
    # Promptly, even when a sync handler's thread is still sleeping.
    assert time.monotonic() - started < 5
    assert code == 0, err
    assert '"level": "WARNING"' in err and "handing unfinished tasks back" in err

    info = cli.task("long-1")
    assert info is not None
    assert info.state is TaskState.PENDING
    assert info.retried == 0
    assert info.worker_id is None or info.lease_expires_at is None


def test_worker_with_explicit_strict_queues(cli: Cli) -> None:
    (cli.tmp_path / "slowapp.py").write_text(SLOW_APP)
    cli.ok("enqueue", "slow:sleep", "--payload", '{"seconds": 0.01}', "--task-id", "quick",
           "--retention", "1h")  # fmt: skip
    worker = cli.spawn("worker", "slowapp:app", "--queues", "default=1", "--strict")

    def completed() -> bool:
        info = cli.task("quick")
        return info is not None and info.state is TaskState.COMPLETED

    cli.wait_for(completed, what="the task to complete")
    code, err = _stop(worker)
    assert code == 0, err


def readyz(port: int) -> tuple[int, str] | None:
    """``/readyz``'s status and text; ``None`` while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None


@pytest.mark.timeout(120)
def test_readyz_says_why_the_broker_is_down_only_with_readyz_details(cli: Cli) -> None:
    """The probe port listens on every interface: by default it tells anyone only that the
    worker is not ready, not the broker's address and user."""
    (cli.tmp_path / "slowapp.py").write_text(SLOW_APP)
    dead = "postgresql://probe-user@127.0.0.1:1/orders"  # nothing listens on port 1
    for details in (False, True):
        port = free_port()
        flags = ["--readyz-details"] if details else []
        worker = cli.spawn(
            "worker", "slowapp:app", "--broker", dead, "--metrics-port", str(port),
            "--wait-for-broker", "2m", *flags,
        )  # fmt: skip
        answers: list[tuple[int, str]] = []

        def answered(port: int = port, answers: list[tuple[int, str]] = answers) -> bool:
            answer = readyz(port)
            answers[:] = [answer] if answer is not None else []
            return answer is not None

        cli.wait_for(answered, timeout=60, what="the worker's /readyz")
        worker.kill()
        worker.communicate(timeout=10)
        status, text = answers[0]
        assert status == 503
        if details:
            assert text.startswith("not ready: ") and "127.0.0.1" in text
        else:
            assert text == "not ready\n"
