"""W13 across worker processes, checked by a ledger the handlers write (not by the broker).

A short run for every broker; the full-size one (4 ``durq worker`` processes of 50 slots,
2,000 tasks, 20 s of rate), also in the default suite, is ``tests/chaos/test_limits_storm.py``."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from conformance import limits_app
from conformance.limitkit import (
    assert_rate,
    enqueue,
    needs_processes,
    run_concurrency,
    starts_after,
    wait_for_ledger,
    wait_for_starts_after,
    workers,
)

pytestmark = pytest.mark.timeout(180)


async def test_W13_worker_processes_never_run_more_of_a_key_than_its_limit(
    broker_url: str, tmp_path: Path
) -> None:
    await needs_processes(broker_url)
    ledger = tmp_path / "ledger.txt"
    got = await run_concurrency(
        broker_url, ledger, procs=2, concurrency=20, keys=5, tasks=200, seconds=0.02,
        timeout=90,
    )  # fmt: skip
    assert len(got.started()) == 200
    peak = got.peak_overlap()
    assert len(peak) == 5 and max(peak.values()) <= 3, peak


async def test_W13_rate_across_worker_processes(broker_url: str, tmp_path: Path) -> None:
    """20/s: a bucket of 20 at once, then never faster than one start per 50 ms."""
    await needs_processes(broker_url)
    ledger = tmp_path / "ledger.txt"
    await enqueue(broker_url, rated=60)
    with workers(broker_url, ledger, 2, concurrency=20):
        got = await wait_for_ledger(ledger, 60, timeout=60, prefix="api")
    starts = got.starts("api")
    first = starts[0]
    assert_rate(starts, 20, slack=0.1)
    assert starts[-1] - first < 20  # 2 s of tokens; generous on a loaded machine


async def test_W13_a_killed_workers_slots_come_back_after_its_lease(
    broker_url: str, tmp_path: Path
) -> None:
    await needs_processes(broker_url)
    ledger = tmp_path / "ledger.txt"
    # Three long attempts fill the key; three more wait on it.
    await enqueue(broker_url, calls=(1, 3, 600))
    await enqueue(broker_url, calls=(1, 3, 0.01))
    lease = 2.0
    with workers(broker_url, ledger, 1, concurrency=10, lease=lease) as (victim,):
        await wait_for_ledger(ledger, 3, timeout=30, kind="start")
        time.sleep(0.5)  # nothing else may start: the key is full
        assert len(limits_app.Ledger.read(ledger).started()) == 3
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        killed = time.time()
    with workers(broker_url, ledger, 1, concurrency=10, lease=lease):
        await wait_for_starts_after(ledger, killed, 3, timeout=30)
    after = starts_after(ledger, killed)
    # The rescuer (every 0.3 s here) frees the slots once the 2 s lease is over.
    assert after and min(after) - killed < lease + 10, min(after) - killed
