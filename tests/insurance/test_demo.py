"""``durq demo``: the reference service, served until Ctrl-C (what ``make demo`` runs)."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from insurance.kit import wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_durq_demo_serves_the_service_until_ctrl_c(tmp_path: Path) -> None:
    durq_bin = shutil.which("durq", path=str(Path(sys.executable).parent))
    if durq_bin is None:
        pytest.skip("the durq console script is not installed in this environment")
    port = free_port()
    proc = subprocess.Popen(
        [durq_bin, "demo", "--port", str(port)],
        cwd=tmp_path,  # a fresh directory: the SQLite files are created there
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)},
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:
        wait_for(lambda: any(line.startswith("Ctrl-C") for line in lines), timeout=30)
        out = "".join(lines)
        assert f"API: http://127.0.0.1:{port}\n" in out
        token = re.search(r"^token: (\S+)$", out, re.MULTILINE).group(1)  # type: ignore[union-attr]
        assert "durq dash" in out
        curls = [line.strip() for line in lines if line.strip().startswith("curl ")]
        assert len(curls) == 3  # create, repeat, status
        key = re.search(r"Idempotency-Key: (\S+)'", curls[0]).group(1)  # type: ignore[union-attr]
        status_url = curls[2].split()[2]

        headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key}
        body = {"items": [{"sku": "A-1", "qty": 2}]}
        first = httpx.post(f"http://127.0.0.1:{port}/orders", json=body, headers=headers)
        assert first.status_code == 202
        assert status_url.endswith(first.headers["Location"])  # the printed URL is right
        again = httpx.post(f"http://127.0.0.1:{port}/orders", json=body, headers=headers)
        assert again.status_code == 200 and again.json()["status"] == "already_accepted"
        order = httpx.get(status_url, headers={"Authorization": f"Bearer {token}"}).json()
        assert order["status"] == "PENDING"
        wait_for(
            lambda: (
                httpx.get(status_url, headers={"Authorization": f"Bearer {token}"}).json()[
                    "attempts"
                ]
                >= 1
            )
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=20)
        finally:
            proc.kill()
            reader.join(5)
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert "demo stopped" in "".join(lines)
    # Orders and tasks share the broker's file: one transaction writes both (E8).
    assert (tmp_path / "durq.sqlite3").exists() and not (tmp_path / "insurance.sqlite3").exists()
    conn = sqlite3.connect(tmp_path / "durq.sqlite3")
    try:
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] >= 1
    finally:
        conn.close()
