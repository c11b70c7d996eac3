"""examples/django_shop: its own test suite (``manage.py test``: Django's test client and a
real ``manage.py durq_worker`` process) on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from servers import require_server

SHOP = Path(__file__).resolve().parents[2] / "examples" / "django_shop"


@pytest.mark.parametrize("database", ["sqlite", "postgres", "embedded"])
def test_the_shop_suite_passes(database: str, tmp_path: Path) -> None:
    """``embedded``: TASKS without OPTIONS, durq's default broker file in the working
    directory (a temporary one here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DURQ_"))}
    env["SHOP_DB"] = "sqlite" if database == "embedded" else database
    if database == "embedded":
        env["SHOP_TASKS"] = "embedded"
    if env["SHOP_DB"] == "postgres":
        require_server("postgres")
        env["SHOP_PG_NAME"] = f"durq_shop_{uuid.uuid4().hex[:10]}"
    else:
        env["SHOP_SQLITE"] = str(tmp_path / "shop.sqlite3")
        env["SHOP_SQLITE_TEST"] = str(tmp_path / "test.sqlite3")
    run = subprocess.run(
        [sys.executable, str(SHOP / "manage.py"), "test", "shop", "--noinput", "-v", "2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Ran 3 tests" in run.stderr and "OK" in run.stderr
    if database == "embedded":
        assert (tmp_path / "durq.sqlite3").exists()
