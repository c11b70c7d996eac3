"""Shared test fixtures: brokers of every kind on isolated storage (see ``servers.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import durq
from apptools import START, AppFactory
from durq.clock import FakeClock
from servers import (  # noqa: F401 - old imports
    BROKER_KINDS,
    PG_DSN,
    REDIS_URL,
    PgBouncer,
    RedisCluster,
    broker_url_for,
    drop_isolated,
    require_pgbouncer,
    require_redis_cluster,
    require_server,
    unique_name,
)


@pytest.fixture(params=BROKER_KINDS)
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def pgbouncer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgBouncer]:
    """One PgBouncer (transaction pooling) in front of the test PostgreSQL, for the session."""
    require_pgbouncer()
    bouncer = PgBouncer(tmp_path_factory.mktemp("pgbouncer"))
    yield bouncer
    bouncer.close()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """One Redis Cluster (3 masters, 3 replicas) on free loopback ports, for the session."""
    require_redis_cluster()
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    yield cluster
    cluster.close()


@pytest.fixture
def broker_url(broker_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    if broker_kind == "postgres-pgbouncer":
        bouncer: PgBouncer = request.getfixturevalue("pgbouncer")
        url = bouncer.url(unique_name("durq_test"))
    elif broker_kind == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        prefix = unique_name("durqtest")
        yield cluster.url(prefix)
        cluster.delete_prefix(prefix)
        return
    else:
        url = broker_url_for(broker_kind, tmp_path)
    yield url
    drop_isolated(broker_kind, url)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
async def make_app(broker_url: str, clock: FakeClock) -> AsyncIterator[AppFactory]:
    """Build apps on the same isolated, migrated storage (one per process), closed at teardown."""
    apps: list[durq.App] = []
    migrated = False

    async def factory(*, fake_clock: bool = True, **options: object) -> durq.App:
        nonlocal migrated
        app = (
            durq.App(broker_url, clock=clock, **options)
            if fake_clock
            else durq.App(broker_url, **options)
        )  # type: ignore[arg-type]
        if not migrated:
            migrator = app.new_broker()
            await migrator.migrate()
            await migrator.close()
            migrated = True
        apps.append(app)
        return app

    yield factory
    for app in apps:
        await app.close()
