"""Helpers for the CLI tests: run ``python -m durq`` in a real subprocess on a temp SQLite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import durq

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


class Cli:
    """Runs ``durq`` commands against one isolated SQLite broker."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.url = f"sqlite:///{tmp_path / 'durq.sqlite3'}"
        self.env = {
            **os.environ,
            "DURQ_BROKER_URL": self.url,
            "COLUMNS": "200",  # tables on one line each, whatever the test runner's terminal
            "PYTHONUNBUFFERED": "1",
        }
        for name in ("DURQ_DEBUG", "DURQ_APP"):
            self.env.pop(name, None)
        self._procs: list[subprocess.Popen[str]] = []

    # A minute: a command's start is CPU-bound, and a loaded machine (a parallel run) can
    # stretch it past half a minute.
    def __call__(self, *args: str, cwd: Path | None = None, timeout: float = 60) -> Result:
        proc = subprocess.run(
            [sys.executable, "-m", "durq", *args],
            cwd=cwd or self.tmp_path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def many(self, *commands: Sequence[str], cwd: Path | None = None) -> list[Result]:
        """Run independent commands at the same time (the error tests need no ordering)."""
        with ThreadPoolExecutor(max_workers=4) as pool:
            return list(pool.map(lambda args: self(*args, cwd=cwd), commands))

    def ok(self, *args: str, cwd: Path | None = None) -> Result:
        result = self(*args, cwd=cwd)
        assert result.code == 0, f"durq {' '.join(args)} -> {result.code}: {result.err}"
        return result

    def spawn(self, *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
        """Start a long-running command (a worker); killed at teardown if still running."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "durq", *args],
            cwd=cwd or self.tmp_path,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)

    # -- reading the broker directly, for waiting without a subprocess per poll --------------

    def task(self, task_id: str, queue: str = "default") -> durq.TaskInfo | None:
        app = durq.App(self.url)
        try:
            return app.run_sync(lambda: app.inspector.get_task_info(queue, task_id))
        except durq.TaskNotFoundError:
            return None
        finally:
            app.close_sync()

    def wait_for(
        self, predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition"
    ) -> None:
        # A bound for a stuck process, not a speed check: a loaded machine takes seconds to
        # start a worker (the first one of a run once took over 10).
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def assert_one_line_error(result: Result, code: int, *fragments: str) -> None:
    """SPEC: a one-line ``error: ...`` on stderr, no traceback, the given exit code."""
    assert result.code == code, (result.code, result.err)
    assert len(result.err_lines) == 1, result.err
    line = result.err_lines[0]
    assert line.startswith("error: "), line
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in line, line
