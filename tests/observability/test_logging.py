"""O3: every log line about a task carries its id, type, queue and attempt; JSON on request."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import pytest

import durq
from durq.observability.logging import setup_logging


@pytest.fixture(autouse=True)
def restore_logging():
    logger = logging.getLogger("durq")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


async def test_O3_json_lines_carry_task_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging("DEBUG", "json")  # a completed task is logged at DEBUG
    app = durq.App(f"sqlite:///{tmp_path / 'logs.sqlite3'}")
    finished = asyncio.Event()

    @app.task("mail:send", max_retry=1, retry_delay=durq.fixed(0.01))
    async def send(payload: dict[str, str], ctx: durq.TaskContext) -> None:
        if ctx.attempt == 1:
            raise ConnectionError("smtp down")
        finished.set()

    async with app.worker(poll_interval=0.05, promote_interval=0.05):
        info = await send.enqueue({"to": "a@b.c"})
        await asyncio.wait_for(finished.wait(), 10)
        await asyncio.sleep(0.1)
    await app.close()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]
    about_task = [line for line in lines if line.get("task_id") == info.id]
    assert {line["level"] for line in about_task} >= {"WARNING", "DEBUG"}
    for line in about_task:
        assert line["task_type"] == "mail:send" and line["queue"] == "default"
        assert line["attempt"] in (1, 2)
    assert [line["attempt"] for line in about_task if "retry" in line["message"]] == [1]


async def test_O3_completed_tasks_are_counted_in_a_summary_line_not_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging("INFO", "json")
    app = durq.App(f"sqlite:///{tmp_path / 'logs.sqlite3'}")
    done: list[int] = []

    @app.task("count:one", max_retry=0)
    async def one(payload: dict[str, int]) -> None:
        if payload["n"] == 3:
            raise ValueError("three")
        done.append(payload["n"])

    worker = app.worker(poll_interval=0.05, summary_interval=3600)
    async with worker:
        for n in range(4):
            await one.enqueue({"n": n})

        async def archived() -> int:
            stats = await app.inspector.queue_stats("default")
            return stats.sizes.get(durq.TaskState.ARCHIVED, 0)

        # All four ended: the worker may have claimed the first three before the fourth
        # was enqueued, and a stop then would leave the fourth unclaimed.
        while len(done) < 3 or await archived() < 1:
            await asyncio.sleep(0.01)
    await app.close()  # the worker's stop logs the last (partial) period
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]
    assert not [line for line in lines if "completed" in line["message"] and "task_id" in line]
    (summary,) = [line for line in lines if "task(s) in the last" in line["message"]]
    assert summary["level"] == "INFO"
    assert re.search(r": 4 task\(s\) in the last \d+s: completed=3 archived=1$", summary["message"])
    assert worker.id in summary["message"]


async def test_O3_periodic_ticks_are_logged_at_debug_and_counted_in_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging("INFO", "json")
    app = durq.App(f"sqlite:///{tmp_path / 'ticks.sqlite3'}")
    ran = asyncio.Event()

    @app.periodic("@every 1s", type="job:tick")
    async def tick(payload: dict[str, int]) -> None:
        ran.set()

    worker = app.worker(poll_interval=0.05, summary_interval=3600)
    async with worker:
        await asyncio.wait_for(ran.wait(), 10)
    await app.close()  # the worker's stop logs the last (partial) period
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]
    assert not [line for line in lines if "enqueued tick" in line["message"]]
    (summary,) = [line for line in lines if "task(s) in the last" in line["message"]]
    assert re.search(r"completed=\d+; \d+ periodic tick\(s\) enqueued$", summary["message"])


async def test_O3_a_logged_traceback_starts_at_the_handler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup_logging("INFO", "text")
    app = durq.App(f"sqlite:///{tmp_path / 'tb.sqlite3'}")
    failed = asyncio.Event()

    @app.task("tb:sync", max_retry=0)
    def broken(payload: dict[str, int]) -> None:
        raise ValueError("broken on purpose")

    class Done(durq.WorkerHooks):
        def task_finished(self, task: durq.TaskInfo, outcome: str, duration: float) -> None:
            failed.set()

    async with app.worker(poll_interval=0.05, hooks=[Done()]):
        await broken.enqueue({})
        await asyncio.wait_for(failed.wait(), 10)
    await app.close()
    err = capsys.readouterr().err
    assert "task archived:" in err and 'raise ValueError("broken on purpose")' in err
    # The executor, its thread pool and asyncio are not in it.
    assert "executor.py" not in err and "concurrent/futures" not in err, err


def test_O3_text_format_appends_task_fields() -> None:
    from durq.observability.logging import TextFormatter

    record = logging.LogRecord("durq.worker", logging.INFO, __file__, 1, "task done", (), None)
    record.task_id, record.task_type, record.queue, record.attempt = "t1", "a:b", "q", 2
    assert TextFormatter().format(record).endswith("[task_id=t1 task_type=a:b queue=q attempt=2]")


def test_O3_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError):
        setup_logging("INFO", "yaml")


def _record(message: str, exc: BaseException | None = None, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("durq.worker", logging.ERROR, __file__, 1, "%s", (message,), None)
    if exc is not None:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_text_lines_cannot_be_forged_or_carry_terminal_escapes() -> None:
    """A newline in an error (or a field) would forge a second log line; an ANSI escape
    would rewrite the operator's terminal. The text format escapes both."""
    from durq.observability.logging import TextFormatter

    forged = "boom\n2027-01-15 09:00:00,000 INFO    durq.worker: task t1 completed"
    ansi = "\x1b[2J\x1b[31mred\x1b[0m \u2028 \x85 \r"
    try:
        raise RuntimeError(forged)
    except RuntimeError as exc:
        caught = exc
    text = TextFormatter().format(_record(forged + ansi, caught, task_id="t\n1\x1b"))
    first, *rest = text.split("\n")
    assert "\\n2027-01-15" in first and "\\x1b[2J" in first and "\\u2028" in first
    assert "task_id=t\\n1\\x1b]" in first
    assert "\x1b" not in text and "\r" not in text and "\u2028" not in text
    # The traceback follows on indented lines: none of them can pass for a log line.
    assert rest and all(line.startswith("  ") for line in rest), rest
    assert any("RuntimeError: boom" in line for line in rest)
