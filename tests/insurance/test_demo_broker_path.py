"""``durq demo --broker sqlite:////abs/path`` keeps the absolute path: the service starts,
answers, and its orders and tasks live in that file (not in a relative ``tmp/...``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from examples.insurance.config import default_database_url
from examples.insurance.store import sqlite_path


def test_default_database_keeps_an_absolute_sqlite_path() -> None:
    url = default_database_url("sqlite:////tmp/x/demo.sqlite3?timeout=5")
    assert sqlite_path(url) == "/tmp/x/demo.sqlite3"
    assert sqlite_path(default_database_url("sqlite:///rel.sqlite3")) == "rel.sqlite3"


def test_demo_runs_on_an_absolute_sqlite_path(tmp_path: Path) -> None:
    target = tmp_path / "x" / "demo.sqlite3"
    target.parent.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    durq = Path(sys.executable).with_name("durq")
    proc = subprocess.Popen(
        [str(durq), "demo", "--broker", f"sqlite:///{target}", "--port", str(port)],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the demo did not start"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert target.exists()
    assert not (workdir / "tmp").exists() and not list(workdir.rglob("*.sqlite3"))
