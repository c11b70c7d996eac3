"""Fixtures of the conformance suite: every test here runs on every broker.

A backend that lacks a capability declares it in ``Broker.capabilities``; tests that need it
call :func:`requires` and are skipped by name, never silently."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import durq
from durq.brokers import FullBroker, open_broker
from durq.clock import FakeClock
from servers import BROKER_KINDS

#: Every broker kind of the shared fixtures, plus PostgreSQL behind PgBouncer in transaction
#: pooling mode and a Redis Cluster of 3 masters and 3 replicas (each started once per
#: session, by the ``pgbouncer`` and ``redis_cluster`` fixtures).
CONFORMANCE_KINDS = [*BROKER_KINDS, "postgres-pgbouncer", "redis-cluster"]


@pytest.fixture(params=CONFORMANCE_KINDS)
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def requires(broker: FullBroker, capability: str) -> None:
    if capability not in broker.capabilities:
        pytest.skip(f"{broker.name} lacks capability {capability!r}")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def make_broker(
    broker_url: str, clock: FakeClock
) -> AsyncIterator[Callable[..., Awaitable[FullBroker]]]:
    """Open more brokers on the same storage (several workers), closed at teardown."""
    opened: list[FullBroker] = []

    async def factory(*, fake_clock: bool = True) -> FullBroker:
        broker = open_broker(broker_url, clock=clock) if fake_clock else open_broker(broker_url)
        await broker.migrate()
        await broker.connect()
        opened.append(broker)
        return broker

    yield factory
    for broker in opened:
        await broker.close()


@pytest.fixture
async def broker(make_broker: Callable[..., Awaitable[FullBroker]]) -> FullBroker:
    """A migrated, connected broker on isolated storage, with a FakeClock."""
    return await make_broker()


@pytest.fixture
async def app(broker_url: str) -> AsyncIterator[durq.App]:
    """An App on isolated, migrated storage with the real clock (worker-level tests)."""
    application = durq.App(broker_url)
    migrator = application.new_broker()
    await migrator.migrate()
    await migrator.close()
    yield application
    await application.close()
