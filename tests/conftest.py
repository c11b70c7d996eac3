"""Shared test fixtures: brokers of every kind on isolated storage (see ``servers.py``).

``make test`` runs the suite in pytest-xdist worker processes (``-n N --dist loadgroup``).
Every test is isolated already (its own SQLite file, PostgreSQL schema, Redis key prefix,
private servers on free ports), so tests run side by side in any order; the session-scoped
servers (PgBouncer, the Redis Cluster, the partner simulator) are started once per worker.
:func:`pytest_collection_modifyitems` below adds two groups, each run by one worker in turn:

* the tests of a module that share a module-scoped fixture (a built wheel, a browser, a
  TLS server, a fresh checkout), so that fixture is built once rather than once per worker;
* ``serial``: tests marked ``serial``, which act on the whole machine or measure it.
"""

from __future__ import annotations

import os
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
    """One Redis Cluster (3 masters, 3 replicas) on free loopback ports, for the session.

    No test stops a node of this one: a long node timeout keeps a node that a loaded machine
    starves for a moment from being voted dead (a failover loses unreplicated writes)."""
    require_redis_cluster()
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"), node_timeout=15000)
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


def _module_scoped(item: pytest.Item) -> bool:
    """Whether the test uses a fixture built once per module (or package)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs and defs[-1].scope in ("module", "package") for defs in info.name2fixturedefs.values()
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist: group the tests that must share a worker (see the module's
    docstring) and start the slow ones first, so none of them is left running alone at the end."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    for item in items:
        if item.get_closest_marker("serial") is not None:
            item.add_marker(pytest.mark.xdist_group("serial"))
        elif _module_scoped(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    # Stable: the same order on every worker, as xdist requires.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under pytest-xdist, captured output crosses a pipe as strict UTF-8: a lone surrogate
    that a test logs on purpose (an unstorable error message) would crash the worker."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        report.sections = [
            (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
            for title, text in report.sections
        ]
