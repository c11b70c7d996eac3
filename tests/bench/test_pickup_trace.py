"""``benchmarks/pickup_trace.py``'s reading of a worker's trace: each probe's steps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

from pickup_trace import steps


def test_a_probe_splits_into_the_steps_of_its_wake_up_and_claim(tmp_path: Path) -> None:
    log = tmp_path / "trace.log"
    log.write_text(
        "start 99.000000 98.000000\n"  # enqueued before the worker: left out
        "wait_for_work 95.000000 100.002000\n"
        "claim 100.003000 100.007000\n"
        "start 100.008000 100.000000\n"
        # picked up by a claim that did not follow a wake-up for it: left out
        "claim 101.000000 101.004000\n"
        "start 101.005000 100.900000\n"
    )
    got = steps(log)
    assert got["probes"] == 1
    expected = {
        "enqueue → woken": 2.0,
        "woken → claim": 1.0,
        "claim": 4.0,
        "claim → handler": 1.0,
        "total": 8.0,
    }
    for step, ms in expected.items():
        assert got[step] == pytest.approx(ms, abs=1e-6)


def test_a_wait_that_claims_ends_both_steps(tmp_path: Path) -> None:
    log = tmp_path / "trace.log"
    log.write_text(
        "start 98.000000 97.000000\n"  # enqueued before the worker: left out
        "wait_and_claim 99.000000 100.005000\n"
        "start 100.006000 100.000000\n"
        # woken before this probe was enqueued: left out
        "wait_and_claim 100.100000 100.200000\n"
        "start 100.260000 100.250000\n"
    )
    got = steps(log)
    assert got["probes"] == 1
    expected = {
        "enqueue → woken": 5.0,
        "woken → claim": 0.0,
        "claim": 0.0,
        "claim → handler": 1.0,
        "total": 6.0,
    }
    for step, ms in expected.items():
        assert got[step] == pytest.approx(ms, abs=1e-6), step


def test_a_trace_without_a_woken_probe_is_an_error(tmp_path: Path) -> None:
    log = tmp_path / "trace.log"
    log.write_text("start 1.000000 0.500000\nstart 2.000000 1.500000\n")
    with pytest.raises(RuntimeError, match="no probe"):
        steps(log)


def test_a_percentile_other_than_the_median_takes_the_nearest_rank(tmp_path: Path) -> None:
    log = tmp_path / "trace.log"
    lines = []
    for i in range(10):  # ten probes; the claim of probe i takes i + 1 ms
        t = 100.0 + i
        lines += [
            f"wait_for_work 90.000000 {t + 0.001:.6f}",
            f"claim {t + 0.002:.6f} {t + 0.003 + i / 1000:.6f}",
            f"start {t + 0.004 + i / 1000:.6f} {t:.6f}",
        ]
    log.write_text("start 1.000000 0.000000\n" + "\n".join(lines) + "\n")
    assert steps(log)["claim"] == pytest.approx(5.5, abs=1e-6)
    assert steps(log, 90)["claim"] == pytest.approx(10.0, abs=1e-6)


def test_probes_follow_the_history_the_worker_ran_first(tmp_path: Path) -> None:
    """``--history``: a real ``durq worker`` runs N tasks in the probes' queue first, then
    the probes come (on SQLite, the broker with nothing to start)."""
    from pickup_trace import APP, run_once

    (tmp_path / "trace_app.py").write_text(APP)
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    got = run_once(sys.executable, url, tmp_path, probes=10, rate=50.0, history=30)
    assert (tmp_path / "trace.log.done").read_bytes() == b"." * 30
    assert 1 <= got["probes"] <= 10
    assert got["total"] > 0
