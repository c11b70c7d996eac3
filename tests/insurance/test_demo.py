"""``durq demo``: the reference service, served until Ctrl-C (what ``make demo`` runs)."""

from __future__ import annotations

import re
import shutil
import signal
import sqlite3
import sys
from pathlib import Path

import httpx
import pytest

from insurance.kit import DemoRun, wait_for
from servers import PG_DSN, broker_url_for, drop_isolated, free_port, unique_name


class Demo(DemoRun):
    """``durq demo`` on a free port in ``cwd``, its stdout collected line by line."""

    def __init__(self, cwd: Path, *args: str, env: dict[str, str] | None = None) -> None:
        durq_bin = shutil.which("durq", path=str(Path(sys.executable).parent))
        if durq_bin is None:
            pytest.skip("the durq console script is not installed in this environment")
        self.port = free_port()
        super().__init__(
            [durq_bin, "demo", "--port", str(self.port), *args],
            cwd=cwd,  # a fresh directory: the SQLite files are created there
            env={"PATH": str(Path(sys.executable).parent), "HOME": str(cwd), **(env or {})},
        )

    def wait_banner(self) -> str:
        self.wait_ready(timeout=30)
        return self.out

    def stop(self) -> int:
        """Ctrl-C; the exit code (the process is killed if it does not stop)."""
        self.__exit__()
        assert self.code is not None
        return self.code


def test_durq_demo_serves_the_service_until_ctrl_c(tmp_path: Path) -> None:
    demo = Demo(tmp_path)
    port, lines = demo.port, demo.lines
    try:
        out = demo.wait_banner()
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
        code = demo.stop()
    assert code == 0, demo.stderr()
    assert "demo stopped" in "".join(lines)
    # Orders and tasks share the broker's file: one transaction writes both (E8).
    assert (tmp_path / "durq.sqlite3").exists() and not (tmp_path / "insurance.sqlite3").exists()
    conn = sqlite3.connect(tmp_path / "durq.sqlite3")
    try:
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] >= 1
    finally:
        conn.close()


def test_one_stop_delivered_twice_still_drains_quietly(tmp_path: Path) -> None:
    """``make demo`` passes the SIGTERM its process group gets on to the demo, which so gets
    it twice at once: that is one stop (the worker drains, the lifespan ends), not a forced
    one that cancels the web app's lifespan and prints its tracebacks."""
    demo = Demo(tmp_path)
    try:
        demo.wait_banner()
        demo.proc.send_signal(signal.SIGTERM)
        # The second after the first is handled (two pending ones would merge into one).
        wait_for(lambda: "stopping:" in demo.out)
        demo.proc.send_signal(signal.SIGTERM)
        code = demo.proc.wait(timeout=60)
    finally:
        demo.stop() if demo.proc.poll() is None else demo._reader.join(5)
    err = demo.stderr()
    assert code == 0, err
    assert "Traceback" not in err and "CancelledError" not in err
    assert "worker" in err and "stopped" in err  # the worker's own log line: it drained
    assert "demo stopped" in demo.out


@pytest.mark.parametrize("kind", ["postgres", "redis"])
def test_durq_demo_migrates_a_fresh_broker(tmp_path: Path, kind: str) -> None:
    url = broker_url_for(kind, tmp_path)  # a schema or key prefix nothing has touched
    schema = unique_name("insurance_demo")
    demo = Demo(tmp_path, "--broker", url, env={"INSURANCE_DATABASE_SCHEMA": schema})
    try:
        out = demo.wait_banner()
        assert "migrated the broker's schema" in out
        token = re.search(r"^token: (\S+)$", out, re.MULTILINE).group(1)  # type: ignore[union-attr]
        created = httpx.post(
            f"http://127.0.0.1:{demo.port}/orders",
            json={"items": [{"sku": "A-1", "qty": 1}]},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert created.status_code == 202
    finally:
        code = demo.stop()
        drop_isolated(kind, url)
        if kind == "postgres":
            drop_isolated("postgres", f"{PG_DSN}?schema={schema}")
    assert code == 0, demo.stderr()
