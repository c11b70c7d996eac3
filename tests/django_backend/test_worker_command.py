"""``manage.py durq_worker`` in a real process: what it logs when a Django task fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.tasks import TaskResultStatus, task_backends

from django_backend.notes import tasks

ROOT = Path(__file__).resolve().parents[2]


def run_worker_until_failed(*options: str, debug: bool = False) -> str:
    """Enqueue a failing task, run ``durq_worker`` with ``options`` (and Django's ``DEBUG``)
    until it failed, stop it with SIGTERM; its stderr."""
    result = tasks.fail.enqueue("no such thing")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), str(ROOT)]),
        "PYTHONUNBUFFERED": "1",
        "DURQ_DJANGO_DEBUG": "1" if debug else "0",
    }
    command = [sys.executable, "-m", "django", "durq_worker", "--settings=django_backend.settings"]
    proc = subprocess.Popen(
        [*command, *options], env=env, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if task_backends["default"].get_result(result.id).status == TaskResultStatus.FAILED:
                break
            assert proc.poll() is None, "the worker ended early"
            time.sleep(0.1)
        else:
            raise AssertionError("the task did not fail within 60s")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def test_a_failed_task_is_an_error_line_with_the_exception_not_its_traceback() -> None:
    err = run_worker_until_failed("--log-level", "WARNING")
    (alert,) = [line for line in err.splitlines() if "task archived:" in line]
    assert " ERROR " in alert and "durq.worker" in alert
    assert "last_error='LookupError: no such thing'" in alert
    # The traceback follows the alert, from the task's own frame: none of durq's.
    assert 'tasks.py", line' in err and "raise LookupError(message)" in err
    assert "executor.py" not in err and "concurrent/futures" not in err


def test_json_logs_carry_django_s_own_lines_too() -> None:
    # With DEBUG, Django's console handler writes its lines (a plain text one per task).
    err = run_worker_until_failed("--log-format", "json", debug=True)
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]  # each one JSON
    (django_line,) = [line for line in lines if line["logger"] == "django.tasks"]
    assert django_line["level"] == "ERROR" and "state=FAILED" in django_line["message"]
    assert "LookupError: no such thing" in django_line["exc_info"]
    (alert,) = [line for line in lines if line["message"].startswith("task archived:")]
    assert alert["level"] == "ERROR" and alert["task_type"].endswith("notes.tasks.fail")
