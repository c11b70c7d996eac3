"""An isolated place for one bench run on any broker, removed afterwards.

SQLite: a file in a new temporary directory (never the user's ``durq.sqlite3``).
PostgreSQL: a fresh schema ``durq_bench_<hex>`` in the given database, dropped at the end.
Redis: a fresh key prefix ``durqbench_<hex>`` in the given database, its keys deleted at the end.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

from durq.brokers import open_broker
from durq.errors import ConfigurationError
from durq.urls import unsplit


def broker_kind(url: str) -> str:
    """``sqlite``, ``postgresql`` or ``redis`` for a broker URL."""
    scheme = urlsplit(url).scheme.lower()
    if scheme == "sqlite":
        return "sqlite"
    if scheme in ("postgresql", "postgres"):
        return "postgresql"
    if scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        return "redis"
    raise ConfigurationError(
        f"unknown broker URL scheme {scheme!r}: use sqlite:///path, postgresql://... or redis://..."
    )


def _with_param(url: str, key: str, value: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != key]
    query.append((key, value))
    return unsplit(parts._replace(query=urlencode(query)))


def _without_param(url: str, key: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != key]
    return unsplit(parts._replace(query=urlencode(query)))


@dataclass
class Isolated:
    """A broker URL that only this run uses, and how to remove what it wrote."""

    kind: str
    url: str
    #: The URL as the user gave it (or ``None`` for the temporary SQLite default).
    base: str | None
    _tmpdir: Path | None = None
    _name: str = ""

    @classmethod
    def create(cls, base: str | None) -> Isolated:
        """A fresh isolated URL on the broker of ``base`` (default: a temporary SQLite file)."""
        token = uuid.uuid4().hex[:10]
        if base is None:
            tmpdir = Path(tempfile.mkdtemp(prefix="durq-bench-"))
            return cls("sqlite", f"sqlite:///{tmpdir / 'bench.sqlite3'}", None, tmpdir)
        kind = broker_kind(base)
        open_broker(base)  # a malformed URL is a usage error before any I/O
        if kind == "sqlite":
            # A file next to the given one, so the user's database itself is never written.
            path = Path(urlsplit(base).path[1:] or "durq.sqlite3")
            tmpdir = Path(tempfile.mkdtemp(prefix="durq-bench-", dir=path.parent or None))
            return cls("sqlite", f"sqlite:///{tmpdir.resolve() / 'bench.sqlite3'}", base, tmpdir)
        if kind == "postgresql":
            name = f"durq_bench_{token}"
            return cls(kind, _with_param(base, "schema", name), base, _name=name)
        name = f"durqbench_{token}"
        return cls(kind, _with_param(base, "prefix", name), base, _name=name)

    @property
    def name(self) -> str:
        """The schema (PostgreSQL), key prefix (Redis) or temporary directory (SQLite)."""
        return str(self._tmpdir) if self._tmpdir is not None else self._name

    async def prepare(self) -> None:
        """Create the schema (migrations) in the isolated place."""
        broker = open_broker(self.url)
        try:
            await broker.migrate()
        finally:
            await broker.close()

    async def cleanup(self) -> None:
        """Remove everything this run wrote (idempotent, best effort per kind)."""
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        elif self.kind == "postgresql" and self.base is not None:
            await self._drop_schema()
        elif self.kind == "redis" and self.base is not None:
            await self._delete_keys()

    async def _drop_schema(self) -> None:
        import psycopg
        from psycopg import sql

        dsn = _without_param(self.base or "", "schema")
        for ours in ("pool_min", "pool_max", "pool_max_idle"):
            dsn = _without_param(dsn, ours)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self._name))
            )

    async def _delete_keys(self) -> None:
        import redis.asyncio as aioredis

        if urlsplit(self.base or "").scheme.lower().endswith("+cluster"):
            await self._delete_cluster_keys()
            return

        client = aioredis.Redis.from_url(_without_param(self.base or "", "prefix"))
        try:
            batch: list[bytes] = []
            async for key in client.scan_iter(match=f"{self._name}:*", count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    await client.delete(*batch)
                    batch = []
            if batch:
                await client.delete(*batch)
        finally:
            await client.aclose()

    async def _delete_cluster_keys(self) -> None:
        """The same on a Redis Cluster: SCAN every master, one UNLINK per key (many slots)."""
        from durq.brokers.redis.cluster import ClusterWire
        from durq.brokers.redis.storage import RedisStorage

        storage = RedisStorage(_without_param(self.base or "", "prefix"))
        try:
            assert isinstance(storage.wire, ClusterWire)
            keys = await storage.wire.scan(f"{self._name}:*")
            for first in range(0, len(keys), 1000):
                await storage.commands([("UNLINK", key) for key in keys[first : first + 1000]])
        finally:
            await storage.close()
