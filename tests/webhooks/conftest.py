"""Fixtures for periodic-task tests: apps on isolated, migrated storage of every broker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import durq
from durq.clock import FakeClock

# 2027-01-15 09:00:00 UTC: a Friday, clear of DST changes; a multiple of 60 s.
START = 1_800_003_600.0

AppFactory = Callable[..., Awaitable[durq.App]]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
async def make_app(broker_url: str, clock: FakeClock) -> AsyncIterator[AppFactory]:
    """Build apps on the same isolated storage (one per scheduler process), closed at teardown."""
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
