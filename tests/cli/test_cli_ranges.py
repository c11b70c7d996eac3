"""Every CLI option and broker URL parameter is range-checked before anything starts: a bad
value is one ``error:`` line naming it and exit code 2, with no broker file created, no
banner printed and no worker process started. And a supervisor stops within its shutdown
timeout on SIGTERM even while it is still starting its worker processes."""

from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest
from tests.cli.clikit import Cli, assert_one_line_error

from durq.worker.supervisor import max_processes

APP = textwrap.dedent(
    """
    import durq

    app = durq.App()

    @app.task("noop")
    async def noop(payload: dict) -> None:
        return None
    """
)

# (command line, the option the message must name)
BAD = [
    (["dash", "--port", "70000"], "--port"),
    (["dash", "--port", "0"], "--port"),
    (["dash", "--port", "-1"], "--port"),
    (["dash", "--log-level", "loud"], "--log-level"),
    (["demo", "--port", "70000"], "--port"),
    (["worker", "app:app", "--metrics-port", "70000"], "--metrics-port"),
    (["worker", "app:app", "--metrics-port", "0"], "--metrics-port"),
    (["worker", "app:app", "--shutdown-timeout", "nan"], "--shutdown-timeout"),
    (["worker", "app:app", "--shutdown-timeout", "-1"], "--shutdown-timeout"),
    (["worker", "app:app", "--shutdown-timeout", "inf"], "--shutdown-timeout"),
    (["worker", "app:app", "--shutdown-timeout", "1e9"], "--shutdown-timeout"),
    (["worker", "app:app", "--shutdown-timeout", "soon"], "--shutdown-timeout"),
    (["worker", "app:app", "--wait-for-broker", "nan"], "--wait-for-broker"),
    (["worker", "app:app", "--processes", "100000"], "--processes"),
    (["worker", "app:app", "--processes", "0"], "--processes"),
    (["worker", "app:app", "--concurrency", "0"], "--concurrency"),
    (["worker", "app:app", "--concurrency", "100000000"], "--concurrency"),
    (["worker", "app:app", "--log-level", "loud"], "--log-level"),
    (["worker", "app:app", "--log-format", "xml"], "--log-format"),
    (["scheduler", "app:app", "--log-level", "loud"], "--log-level"),
    (["scheduler", "app:app", "--log-format", "xml"], "--log-format"),
    (["bench", "--latency-rate", "nan"], "--latency-rate"),
    (["bench", "--tasks", "0"], "--tasks"),
    (["bench", "--concurrency", "-5"], "--concurrency"),
    (["task", "ls", "--limit", "0"], "--limit"),
    (["task", "ls", "--limit", "100000"], "--limit"),
    (["task", "ls", "--page", "0"], "--page"),
    (["enqueue", "noop", "--timeout", "nan"], "--timeout"),
    (["enqueue", "noop", "--process-in", "inf"], "--process-in"),
    (["enqueue", "noop", "--retention", "-5"], "--retention"),
]

# Broker URL parameters, given to a command that would otherwise open the broker.
BAD_URLS = [
    ("sqlite:///{db}?busy_timeout=nan", "busy_timeout"),
    ("sqlite:///{db}?busy_timeout=-1", "busy_timeout"),
    ("sqlite:///{db}?poll_interval=1e308", "poll_interval"),
    ("sqlite:///{db}?poll_interval=0", "poll_interval"),
    ("postgresql://127.0.0.1/test?connect_timeout=nan", "connect_timeout"),
    ("postgresql://127.0.0.1/test?connect_timeout=0", "connect_timeout"),
    ("postgresql://127.0.0.1/test?pool_max=-1", "pool_max"),
    ("postgresql://127.0.0.1/test?pool_min=-1", "pool_min"),
    ("postgresql://127.0.0.1/test?pool_min=5&pool_max=2", "pool_min"),
    ("postgresql://127.0.0.1/test?pool_max_idle=inf", "pool_max_idle"),
    ("postgresql://127.0.0.1:70000/test", "port"),
    ("redis://127.0.0.1:0/0", "port"),
    ("redis://127.0.0.1:70000/0", "port"),
    ("redis://127.0.0.1:6379/0?socket_timeout=nan", "socket_timeout"),
    ("redis://127.0.0.1:6379/0?socket_connect_timeout=-1", "socket_connect_timeout"),
    ("redis+cluster://127.0.0.1:7000/?cluster_retry=nan", "cluster_retry"),
    ("redis+cluster://127.0.0.1:7000/?wait_replicas=-1", "wait_replicas"),
    ("redis+cluster://127.0.0.1:7000/?wait_timeout=1e3", "wait_timeout"),
]


@pytest.mark.timeout(300)
def test_bad_option_values_are_one_line_usage_errors_and_start_nothing(cli: Cli) -> None:
    (cli.tmp_path / "app.py").write_text(APP)
    results = cli.many(*(args for args, _ in BAD))
    for (args, option), result in zip(BAD, results, strict=True):
        assert_one_line_error(result, 2, option)
        assert "internal error" not in result.err, (args, result.err)
        assert result.out == "", (args, result.out)  # no banner, no table
    # No command got as far as opening the broker.
    assert not (cli.tmp_path / "durq.sqlite3").exists()


@pytest.mark.timeout(300)
def test_bad_broker_url_parameters_are_one_line_usage_errors(cli: Cli) -> None:
    db = cli.tmp_path / "never.sqlite3"
    commands = [["queue", "ls", "--broker", url.format(db=db)] for url, _ in BAD_URLS]
    results = cli.many(*commands)
    for (url, name), result in zip(BAD_URLS, results, strict=True):
        assert_one_line_error(result, 2, name)
        assert "internal error" not in result.err, (url, result.err)
    assert not db.exists()


def test_a_hundred_thousand_processes_are_refused_before_any_is_started(cli: Cli) -> None:
    (cli.tmp_path / "app.py").write_text(APP)
    result = cli("worker", "app:app", "--processes", "100000", timeout=30)
    assert_one_line_error(result, 2, "--processes", f"from 1 to {max_processes()}")
    assert not (cli.tmp_path / "durq.sqlite3").exists()


# Each worker process imports this for a long time, and ignores SIGTERM meanwhile (as an
# app whose import installs its own handler would): only a kill stops it.
STUBBORN_APP = textwrap.dedent(
    """
    import os
    import signal
    import time

    signal.signal(signal.SIGTERM, lambda *_: None)
    open(f"importing-{os.getpid()}", "w").close()
    time.sleep(600)

    import durq

    app = durq.App()
    """
)


def _children(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return {int(p) for p in f.read().split()}
    except FileNotFoundError:
        return set()


@pytest.mark.timeout(300)
def test_sigterm_while_starting_stops_the_supervisor_and_every_child(cli: Cli) -> None:
    (cli.tmp_path / "stubborn.py").write_text(STUBBORN_APP)
    supervisor = cli.spawn(
        "worker", "stubborn:app", "--processes", str(max_processes()), "--shutdown-timeout", "1"
    )
    importing = lambda: list(cli.tmp_path.glob("importing-*"))  # noqa: E731
    cli.wait_for(lambda: bool(importing()), timeout=60, what="a child importing the app")
    seen = _children(supervisor.pid)
    supervisor.send_signal(signal.SIGTERM)
    started = time.monotonic()
    _, err = supervisor.communicate(timeout=120)
    # Within the grace (1s) plus the kill delay (5s); the bound is loose for a busy machine.
    assert time.monotonic() - started < 60, err
    assert supervisor.returncode is not None
    assert "killing it" in err
    for pid in seen:
        assert not os.path.exists(f"/proc/{pid}"), pid  # reaped, not left running
