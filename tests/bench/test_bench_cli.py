"""Smoke test of ``durq bench --tasks 200 --json`` on every reachable broker.

It runs the real command in a subprocess (a real worker process underneath) and checks the
JSON document, that the counts were verified, and that the isolated storage was removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servers import PG_DSN, REDIS_URL, require_server

KEYS = {
    "enqueue_per_s",
    "enqueue_bulk_per_s",
    "process_per_s",
    "latency_ms",
    "broker",
    "tasks",
    "concurrency",
    "machine",
}


def run_bench(tmp_path: Path, *args: str) -> dict:
    env = {**os.environ, "DURQ_BROKER_URL": ""}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "durq",
            "bench",
            "--tasks",
            "200",
            "--latency-tasks",
            "20",
            "--latency-rate",
            "200",
            "--concurrency",
            "20",
            "--json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert KEYS <= result.keys()
    assert result["tasks"] == 200 and result["processed_verified"] == 200
    assert result["concurrency"] == 20 and result["failed"] == 0
    for key in ("enqueue_per_s", "enqueue_bulk_per_s", "process_per_s"):
        assert result[key] > 0
    lat = result["latency_ms"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"]
    assert result["machine"]["cpu_count"] >= 1 and result["machine"]["python"]
    return result


def test_bench_sqlite_default_uses_a_temporary_file(tmp_path: Path) -> None:
    result = run_bench(tmp_path)
    assert result["broker"] == "sqlite"
    # Never the user's durq.sqlite3 in the working directory, and nothing left behind.
    assert list(tmp_path.iterdir()) == []


def test_bench_postgres_cleans_its_schema(tmp_path: Path) -> None:
    require_server("postgres")
    import psycopg

    result = run_bench(tmp_path, "--broker", PG_DSN)
    assert result["broker"] == "postgresql"
    assert result["isolated"].startswith("durq_bench_")
    with psycopg.connect(PG_DSN) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (result["isolated"],)
        ).fetchone()
    assert left == (0,)


def test_bench_redis_cleans_its_prefix(tmp_path: Path) -> None:
    require_server("redis")
    import redis

    result = run_bench(tmp_path, "--broker", REDIS_URL)
    assert result["broker"] == "redis"
    assert result["isolated"].startswith("durqbench_")
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert list(client.scan_iter(match=f"{result['isolated']}:*", count=1000)) == []
    finally:
        client.close()


def test_bench_rejects_bad_options(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "durq", "bench", "--tasks", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error:")


@pytest.mark.parametrize("p,expected", [(50, 5.0), (99, 10.0), (100, 10.0)])
def test_percentile_nearest_rank(p: float, expected: float) -> None:
    from durq.bench.runner import percentile

    assert percentile([float(i) for i in range(1, 11)], p) == expected
