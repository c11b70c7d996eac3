"""The shop's tests use the kit's fixtures (durq_worker, durq_worker_sync) on the shop's own
app, pointed at a fresh in-memory broker for each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import durq
import durq.testing
from examples.testing import shop

# 2027-01-15 05:00 UTC: tests that look at the daily report know where they start.
START = 1_800_000_000.0 - 1_800_000_000.0 % 86400 + 5 * 3600


@pytest.fixture
def durq_app() -> Iterator[durq.App]:
    """The kit's ``durq_app`` fixture, overridden: our app, on memory://, clock at START."""
    shop.partner.asked = 0
    shop.SENT.clear()
    with durq.testing.in_memory(shop.app, start=START) as app:
        yield app
