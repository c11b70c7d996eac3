"""Lease and due times come from the broker server's clock, not the worker host's (W1)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "conformance"))

from durq.brokers import open_broker
from durq.clock import FakeClock, ServerClock, SystemClock, server_clock_for


class SkewedClock(SystemClock):
    """A host whose clock runs an hour ahead."""

    def now(self) -> float:
        return time.time() + 3600


async def test_offset_is_measured_against_the_middle_of_the_round_trip() -> None:
    base = FakeClock(1000.0)
    clock = ServerClock(base, resync_every=60)
    assert clock.due

    async def read() -> float:
        base.advance(0.2)  # the round trip takes 0.2 s
        return 5000.0

    await clock.sync(read)
    assert clock.offset == pytest.approx(5000.0 - 1000.1)
    assert clock.now() == pytest.approx(5000.1) and not clock.due
    base.advance(61)
    assert clock.due


def test_injected_test_clocks_stay_in_charge() -> None:
    assert server_clock_for(FakeClock()) is None
    assert isinstance(server_clock_for(SystemClock()), ServerClock)


@pytest.mark.parametrize("kind", ["postgres", "redis"])
async def test_a_skewed_host_writes_server_times(kind: str, tmp_path) -> None:
    from servers import broker_url_for, drop_isolated

    url = broker_url_for(kind, tmp_path)
    broker = open_broker(url, clock=SkewedClock())
    try:
        await broker.migrate()
        await broker.connect()
        from brokerkit import params  # the conformance suite's params builder

        info = await broker.enqueue(params("skewed"))
        assert info.enqueued_at is not None
        # The host thinks it is an hour later; the task carries the server's time.
        assert abs(info.enqueued_at.timestamp() - time.time()) < 60
    finally:
        await broker.close()
        drop_isolated(kind, url)
