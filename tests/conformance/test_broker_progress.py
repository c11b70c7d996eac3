"""A running attempt's progress and log lines (``Broker.report_progress``): stored on the
task, bounded, fenced by the lease, kept across attempts, read through ``get_task``."""

from __future__ import annotations

from brokerkit import LATER, LEASE, A, R, claim, params

from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import CompleteParams, ProgressParams, RetryParams
from durq.clock import FakeClock
from durq.progress import MAX_LINE_BYTES, MAX_LOG_LINES, clip, encode_line, encode_progress


def line(attempt: int, message: str, level: str = "info") -> str:
    return encode_line(attempt, 1000.0, level, message)


async def test_W14_progress_and_log_lines_are_stored_on_the_task(broker: FullBroker) -> None:
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    report = ProgressParams(
        lease.ref,
        progress=encode_progress(1, 0.4, "rows 400/1000", 1000.0),
        lines=(line(1, "started"), line(1, "halfway\nthere", "warning")),
    )
    assert await broker.report_progress(report)
    assert await broker.report_progress(
        ProgressParams(lease.ref, progress=encode_progress(1, 0.5, None, 1001.0))
    )
    info = await broker.admin.get_task("default", "t")
    assert info.state is A
    assert info.progress is not None
    assert (info.progress.fraction, info.progress.message) == (0.5, None)
    assert info.progress.attempt == 1 and info.progress.percent == 50
    assert [(x.attempt, x.level, x.message) for x in info.logs] == [
        (1, "info", "started"),
        (1, "warning", "halfway\nthere"),
    ]
    # The admin API's JSON form carries both.
    data = info.to_dict()
    assert data["progress"]["fraction"] == 0.5
    assert [x["message"] for x in data["logs"]] == ["started", "halfway\nthere"]
    # After the attempt ends they stay with the task.
    assert await broker.complete(CompleteParams(lease.ref, retention=60))
    done = await broker.admin.get_task("default", "t")
    assert done.progress is not None and done.progress.fraction == 0.5
    assert len(done.logs) == 2


async def test_W14_only_the_last_log_lines_are_kept(broker: FullBroker) -> None:
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    first = tuple(line(1, f"line {i}") for i in range(30))
    second = tuple(line(1, f"line {i}") for i in range(30, 70))
    assert await broker.report_progress(ProgressParams(lease.ref, lines=first))
    assert await broker.report_progress(ProgressParams(lease.ref, lines=second))
    info = await broker.admin.get_task("default", "t")
    assert [x.message for x in info.logs] == [f"line {i}" for i in range(70 - MAX_LOG_LINES, 70)]
    assert info.progress is None  # lines alone leave the progress as it was


async def test_W14_a_stale_lease_cannot_report(broker: FullBroker, clock: FakeClock) -> None:
    await broker.enqueue(params("t", max_retry=5))
    (first,) = await claim(broker, worker="zombie")
    clock.advance(LEASE + 1)
    (rescued,) = await lifecycle.rescue_expired(broker, 3)
    assert rescued.state is R
    stale = ProgressParams(
        first.ref, progress=encode_progress(1, 0.9, "zombie", 1.0), lines=(line(1, "zombie"),)
    )
    # Not active any more: refused.
    assert not await broker.report_progress(stale)
    (second,) = await claim(broker, worker="healthy")
    # Active again under another lease: still refused, and nothing changed.
    assert not await broker.report_progress(stale)
    info = await broker.admin.get_task("default", "t")
    assert info.progress is None and info.logs == ()
    assert await broker.report_progress(ProgressParams(second.ref, lines=(line(2, "ok"),)))
    assert await broker.complete(CompleteParams(second.ref, retention=60))
    # A completed task refuses its own (former) lease too.
    assert not await broker.report_progress(ProgressParams(second.ref, lines=(line(2, "late"),)))
    assert [x.message for x in (await broker.admin.get_task("default", "t")).logs] == ["ok"]


async def test_W14_logs_stay_across_attempts_and_progress_starts_again(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("t", max_retry=3))
    (first,) = await claim(broker)
    assert await broker.report_progress(
        ProgressParams(
            first.ref,
            progress=encode_progress(1, 0.7, "first try", 1.0),
            lines=(line(1, "try one"),),
        )
    )
    assert await broker.retry(RetryParams(first.ref, "boom", delay=0.0))
    waiting = await broker.admin.get_task("default", "t")
    assert waiting.progress is not None and waiting.progress.attempt == 1  # shown until rerun
    clock.advance(1)
    (second,) = await claim(broker)
    running = await broker.admin.get_task("default", "t")
    # The new attempt has not reported: the earlier attempt's progress is not shown.
    assert running.state is A and running.progress is None
    assert [x.attempt for x in running.logs] == [1]
    # Its first write with lines only clears the stored progress ("" = cleared).
    assert await broker.report_progress(
        ProgressParams(second.ref, progress="", lines=(line(2, "try two"),))
    )
    assert await broker.retry(RetryParams(second.ref, "boom", delay=LATER))
    after = await broker.admin.get_task("default", "t")
    assert after.progress is None
    assert [(x.attempt, x.message) for x in after.logs] == [(1, "try one"), (2, "try two")]


async def test_W14_text_is_made_storable_and_bounded(broker: FullBroker) -> None:
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    hostile = clip("nul\x00 lone\ud800 é")
    long = clip("x" * 5000)
    assert len(long.encode()) <= MAX_LINE_BYTES and long.endswith("…")
    assert await broker.report_progress(
        ProgressParams(
            lease.ref,
            progress=encode_progress(1, 1.0, hostile, 1.0),
            lines=(line(1, hostile), line(1, long)),
        )
    )
    info = await broker.admin.get_task("default", "t")
    assert info.progress is not None and info.progress.message == "nul\\x00 lone\\ud800 é"
    assert [x.message for x in info.logs] == ["nul\\x00 lone\\ud800 é", long]


async def test_W14_a_task_id_used_again_starts_without_logs(
    broker: FullBroker, clock: FakeClock
) -> None:
    await broker.enqueue(params("t"))
    (lease,) = await claim(broker)
    assert await broker.report_progress(
        ProgressParams(
            lease.ref, progress=encode_progress(1, 1.0, None, 1.0), lines=(line(1, "old"),)
        )
    )
    assert await broker.complete(CompleteParams(lease.ref, retention=10))
    clock.advance(11)  # past its retention: the id is free again, before the janitor runs
    again = await broker.enqueue(params("t"))
    assert again.progress is None and again.logs == ()
    info = await broker.admin.get_task("default", "t")
    assert info.progress is None and info.logs == ()
