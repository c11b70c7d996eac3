"""Broker backends, chosen by URL scheme. Drivers are imported only when their scheme is used."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from durq.brokers.contract import Admin, Broker, FullBroker
from durq.clock import SYSTEM_CLOCK, Clock
from durq.errors import ConfigurationError

DEFAULT_URL = "sqlite:///durq.sqlite3"

__all__ = ["DEFAULT_URL", "Admin", "Broker", "FullBroker", "open_broker", "resolve_url"]


def resolve_url(url: str | None = None) -> str:
    """The broker URL: the argument, else ``DURQ_BROKER_URL``, else the SQLite default."""
    return url or os.environ.get("DURQ_BROKER_URL") or DEFAULT_URL


def open_broker(url: str | None = None, *, clock: Clock = SYSTEM_CLOCK) -> FullBroker:
    """Build (without connecting) the broker for ``url``.

    Schemes: ``sqlite:///relative.db``, ``sqlite:////abs/path.db``; ``postgresql://`` (also
    ``postgres://``) with an optional ``?schema=`` (default ``durq``); ``redis://``,
    ``rediss://``, ``unix://`` with an optional ``?prefix=`` (default ``durq``);
    ``redis+cluster://host:port[,host:port...]/`` (``rediss+cluster://``: TLS) for a Redis
    Cluster; ``memory://``
    or ``memory://name`` (tasks kept in this process, shared by the brokers on one name)."""
    url = resolve_url(url)
    scheme = urlsplit(url).scheme.lower()
    if scheme == "sqlite":
        from durq.brokers.sqlite import SQLiteBroker

        return SQLiteBroker.from_url(url, clock=clock)
    if scheme in ("postgresql", "postgres"):
        try:
            from durq.brokers.postgres import PostgresBroker
        except ImportError as exc:
            raise ConfigurationError(
                "the PostgreSQL broker needs psycopg: pip install 'durq[postgres]'"
            ) from exc
        return PostgresBroker.from_url(url, clock=clock)
    if scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        try:
            from durq.brokers.redis import RedisBroker
        except ImportError as exc:
            raise ConfigurationError(
                "the Redis broker needs redis-py: pip install 'durq[redis]'"
            ) from exc
        return RedisBroker.from_url(url, clock=clock)
    if scheme == "memory":
        from durq.brokers.memory import MemoryBroker

        return MemoryBroker.from_url(url, clock=clock)
    raise ConfigurationError(
        f"unknown broker URL scheme {scheme!r} in {url!r}: "
        "use sqlite:///path, postgresql://..., redis://... or memory://"
    )
