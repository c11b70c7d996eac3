"""Where the real PostgreSQL and Redis are, and per-test isolation on them.

PostgreSQL and Redis suites run whenever those servers are reachable; without them they skip
with a visible reason, except under ``CI=true`` where a missing server is a failure."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

PG_DSN = os.environ.get("DURQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("DURQ_TEST_REDIS", "redis://127.0.0.1:6379/0")
IN_CI = os.environ.get("CI", "").lower() == "true"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def require_server(kind: str) -> None:
    """Skip (or fail under CI) when the named server is not reachable."""
    host, port = {"postgres": ("127.0.0.1", 5432), "redis": ("127.0.0.1", 6379)}[kind]
    if not _reachable(host, port):
        message = f"{kind} is not reachable on {host}:{port}"
        if IN_CI:
            pytest.fail(f"{message} (required when CI=true)")
        pytest.skip(message)


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def broker_url_for(kind: str, tmp_path: Path) -> str:
    """A fresh, isolated broker URL: a temp file, a PostgreSQL schema or a Redis key prefix."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'durq.sqlite3'}"
    require_server(kind)
    if kind == "postgres":
        return f"{PG_DSN}?schema={unique_name('durq_test')}"
    return f"{REDIS_URL}?prefix={unique_name('durqtest')}"


def drop_isolated(kind: str, url: str) -> None:
    """Remove what a test left in a shared server."""
    if kind == "postgres":
        import psycopg
        from psycopg import sql

        schema = url.split("schema=", 1)[1]
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    elif kind == "redis":
        import redis

        prefix = url.split("prefix=", 1)[1]
        client = redis.Redis.from_url(REDIS_URL)
        try:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()
