"""``durq scheduler`` and ``durq periodic ls`` in real subprocesses (SQLite; the commands are
broker-agnostic, the broker behaviour is covered on every broker elsewhere)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import durq
from durq.states import TaskState

APP = """
import durq

app = durq.App()

@app.periodic("@every 1s", type="job:tick", queue="cron")
def tick(payload: dict) -> None: ...

app.add_periodic("* * * * *", "job:minute", queue="cron", tz="Europe/Moscow", missed="run_once")
"""


def durq_cmd(tmp_path: Path, url: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "DURQ_BROKER_URL": url, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    return [sys.executable, "-m", "durq"], env


def test_scheduler_and_periodic_ls(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'durq.sqlite3'}"
    (tmp_path / "sched_app.py").write_text(APP, encoding="utf-8")
    cmd, env = durq_cmd(tmp_path, url)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cmd, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
        )

    before = run("periodic", "ls", "sched_app:app", "--json")
    assert before.returncode == 0, before.stderr
    rows = {row["name"]: row for row in json.loads(before.stdout)}
    assert set(rows) == {"job:tick", "job:minute"}
    assert rows["job:minute"]["tz"] == "Europe/Moscow" and rows["job:minute"]["queue"] == "cron"
    assert rows["job:minute"]["next_run"].endswith("+03:00")
    assert rows["job:minute"]["last_task_id"] is None

    proc = subprocess.Popen(
        [*cmd, "scheduler", "sched_app:app"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    app = durq.App(url)
    try:
        deadline = time.monotonic() + 20
        seen: list[str] = []
        while time.monotonic() < deadline and len(seen) < 2:
            try:
                tasks = app.run_sync(lambda: app.inspector.list_tasks("cron", TaskState.PENDING))
                seen = [t.id for t in tasks if t.type == "job:tick"]
            except durq.DurqError:
                pass
            time.sleep(0.1)
        assert len(seen) >= 2, "the scheduler enqueued no ticks"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        app.close_sync()
    assert proc.returncode == 0, err
    # One tick a second: logged at DEBUG, counted in the summary line written at the stop.
    assert "enqueued tick" not in err
    assert re.search(r"scheduler \S+: \d+ periodic tick\(s\) enqueued in the last \d+s", err)

    after = run("periodic", "ls", "sched_app:app", "--json")
    rows = {row["name"]: row for row in json.loads(after.stdout)}
    assert rows["job:minute"]["last_task_id"].startswith("periodic:job:minute:")
    assert rows["job:minute"]["last_state"] == "pending"

    table = run("periodic", "ls", "sched_app:app")
    assert table.returncode == 0 and "job:minute" in table.stdout and "(pending)" in table.stdout


def test_invalid_schedule_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "bad_app.py").write_text(
        'import durq\napp = durq.App()\napp.add_periodic("*/5 * * *", "job:x")\n',
        encoding="utf-8",
    )
    cmd, env = durq_cmd(tmp_path, f"sqlite:///{tmp_path / 'durq.sqlite3'}")
    result = subprocess.run(
        [*cmd, "scheduler", "bad_app:app"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "invalid cron expression '*/5 * * *'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
