"""Operator basics, with real ``durq`` processes: ``--version``, ``migrate --check`` and
``--status`` on every persistent broker, and JSON log lines that say which process and
which worker wrote them."""

from __future__ import annotations

import json
import re
import signal
import textwrap
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from tests.cli.clikit import Cli
from tests.cli.test_cli_processes import worker_pids

from servers import broker_url_for, drop_isolated


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(cli: Cli, flag: str) -> None:
    result = cli.ok(flag)
    assert result.out == f"durq {metadata.version('durq')}\n"


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    kind = str(request.param)
    url = broker_url_for(kind, tmp_path / "broker")
    (tmp_path / "broker").mkdir()
    yield url
    drop_isolated(kind, url)


def test_migrate_check_says_what_is_pending_and_writes_nothing(cli: Cli, fresh_url: str) -> None:
    pending = cli("migrate", "--check", "--broker", fresh_url)
    assert pending.code == 1, pending.err
    (line,) = pending.err_lines
    assert "pending" in line and "durq migrate" in line
    status = cli.ok("migrate", "--status", "--json", "--broker", fresh_url)
    names = status.json()["pending"]
    assert names and all(name in line for name in names)
    # Nothing was written: still pending, the SQLite file not even created.
    assert cli("migrate", "--check", "--broker", fresh_url).code == 1
    if fresh_url.startswith("sqlite"):
        assert not (cli.tmp_path / "broker" / "durq.sqlite3").exists()

    applied = cli.ok("migrate", "--json", "--broker", fresh_url).json()["applied"]
    assert applied == names
    current = cli("migrate", "--check", "--broker", fresh_url)
    assert current.code == 0, current.err
    assert "up to date" in current.out
    assert cli.ok("migrate", "--status", "--json", "--broker", fresh_url).json()["pending"] == []


def test_migrate_check_and_status_together_are_a_usage_error(cli: Cli) -> None:
    result = cli("migrate", "--check", "--status")
    assert result.code == 2


APP = textwrap.dedent(
    """
    import durq

    app = durq.App()

    @app.task("noop")
    async def noop(payload: dict) -> None:
        return None
    """
)


@pytest.mark.timeout(180)
def test_json_log_lines_of_several_processes_carry_pid_and_worker_id(cli: Cli) -> None:
    (cli.tmp_path / "app.py").write_text(APP)
    cli.ok("migrate")
    supervisor = cli.spawn("worker", "app:app", "--processes", "2", "--log-format", "json")
    # Both workers registered: their start lines are written by then.
    cli.wait_for(lambda: len(worker_pids(cli)) == 2, timeout=60, what="two workers")
    supervisor.send_signal(signal.SIGTERM)
    _, err = supervisor.communicate(timeout=60)
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    by_pid: dict[int, set[str]] = {}
    for line in lines:
        assert isinstance(line["pid"], int), line
        if line["pid"] != supervisor.pid:  # the supervisor runs no worker of its own
            assert "worker_id" in line, line
            by_pid.setdefault(line["pid"], set()).add(line["worker_id"])
    assert len(by_pid) == 2
    for pid, ids in by_pid.items():
        (worker_id,) = ids  # one worker per process, on every one of its lines
        assert f":{pid}:" in worker_id


@pytest.mark.timeout(180)
def test_text_log_lines_of_worker_processes_name_their_worker_and_pid(cli: Cli) -> None:
    (cli.tmp_path / "app.py").write_text(APP)
    cli.ok("migrate")
    supervisor = cli.spawn("worker", "app:app", "--processes", "2")
    cli.wait_for(lambda: len(worker_pids(cli)) == 2, timeout=60, what="two workers")
    supervisor.send_signal(signal.SIGTERM)
    _, err = supervisor.communicate(timeout=60)
    workers: set[str] = set()
    for line in err.splitlines():
        if not line.strip() or line.startswith("  ") or " durq.supervisor: " in line:
            continue  # tracebacks follow their line; the supervisor runs no worker
        found = re.search(r"worker=(\S+?)\]$", line)
        assert found, line
        workers.add(found.group(1))
    assert len(workers) == 2
    pids = {int(w.split(":")[-2]) for w in workers}  # host:pid:random
    assert len(pids) == 2 and supervisor.pid not in pids
