"""Log set-up: every line about a task carries its id, type, queue and attempt; JSON is
one flag away (``--log-format json``)."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from durq.errors import ConfigurationError
from durq.task import TaskInfo
from durq.worker import frames
from durq.worker.hooks import OUTCOMES, WorkerHooks
from durq.worker.service import PeriodicService

summary_log = logging.getLogger("durq.worker")

#: The level names ``setup_logging`` (and ``--log-level``) accept, in any case.
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

#: ``extra=`` keys durq puts on task log records.
TASK_FIELDS = ("task_id", "task_type", "queue", "attempt")


#: Control characters (C0, DEL, C1) and the Unicode line separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\x1b``):
    a message from a task or a request can neither start a forged log line nor send
    escape sequences to the operator's terminal."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def format_exc_info(exc_info: Any) -> str:
    """A log record's traceback, without the worker's machinery above a task's own frames
    (see :mod:`durq.worker.frames`)."""
    exc = exc_info[1]
    if isinstance(exc, BaseException):
        return frames.format_exception(exc).rstrip("\n")
    return logging.Formatter().formatException(exc_info)


class TextFormatter(logging.Formatter):
    """``time level logger message [task_id=… type=… queue=… attempt=… worker=…]``.

    ``fields``: the ``extra=`` keys written out when present (a service adds its own).
    One record is one line (control characters escaped); a traceback follows on lines
    indented by two spaces."""

    def __init__(self, fields: Sequence[str] = TASK_FIELDS) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        self.fields = tuple(fields)

    def format(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.getMessage())
        record.asctime = self.formatTime(record, self.datefmt)
        line = escape_controls(self.formatMessage(record))
        fields = [
            f"{k}={escape_controls(str(getattr(record, k)))}"
            for k in self.fields
            if hasattr(record, k)
        ]
        if _worker_id is not None:  # host:pid:random, so interleaved processes tell apart
            fields.append(f"worker={_worker_id}")
        if fields:
            line = f"{line} [{' '.join(fields)}]"
        extra = []
        if record.exc_info:
            extra.append(format_exc_info(record.exc_info))
        if record.stack_info:
            extra.append(self.formatStack(record.stack_info))
        for block in extra:
            line += "".join(f"\n  {escape_controls(part)}" for part in block.split("\n"))
        return line


#: The id of the worker this process runs (:func:`bind_worker_id`), on every log line.
_worker_id: str | None = None


def bind_worker_id(worker_id: str | None) -> None:
    """Put ``worker_id`` on every log line of this process from now on (``worker_id`` in
    JSON, ``worker=`` among a text line's fields; ``durq worker`` does, so the lines of
    ``--processes N`` workers, interleaved on one stream, tell apart)."""
    global _worker_id
    _worker_id = worker_id


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, pid, the worker id once bound
    (:func:`bind_worker_id`) and the ``fields`` present."""

    def __init__(self, fields: Sequence[str] = TASK_FIELDS) -> None:
        super().__init__()
        self.fields = tuple(fields)

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if _worker_id is not None:
            data["worker_id"] = _worker_id
        for key in self.fields:
            if hasattr(record, key):
                data[key] = getattr(record, key)
        if record.exc_info:
            data["exc_info"] = format_exc_info(record.exc_info)
        return json.dumps(data, default=str)


def setup_logging(level: str | int = "INFO", fmt: str = "text") -> None:
    """Configure the ``durq`` loggers on stderr, as ``text`` or ``json``.

    ConfigurationError for another format or an unknown level name (the CLI's exit 2)."""
    if fmt not in ("text", "json"):
        raise ConfigurationError(f"--log-format must be text or json, got {fmt!r}")
    if isinstance(level, str) and level.upper() not in LEVELS:
        raise ConfigurationError(f"--log-level must be one of {', '.join(LEVELS)}, got {level!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger = logging.getLogger("durq")
    logger.handlers[:] = [handler]
    logger.setLevel(level if isinstance(level, int) else level.upper())
    logger.propagate = False


class TaskSummary(WorkerHooks):
    """Counts attempt outcomes and periodic ticks enqueued, and logs one INFO line about
    them every ``interval`` seconds.

    The worker logs each completed task, and its scheduler each tick it enqueues, at DEBUG
    only: a formatted line per task costs more than a no-op task itself, and a line per tick
    buries the lines that matter. Failures, retries and archives keep their own lines.
    ``label``: who the line is about (``worker <id>``, ``scheduler <id>``)."""

    def __init__(self, worker_id: str, label: str = "worker") -> None:
        self.worker_id = worker_id
        self.label = label
        self.counts: Counter[str] = Counter()
        self.ticks = 0
        self._since = time.monotonic()

    def task_finished(self, task: TaskInfo, outcome: str, duration: float) -> None:
        self.counts[outcome] += 1

    def tick_enqueued(self) -> None:
        """Count one periodic tick enqueued (the scheduler's ``on_enqueued``)."""
        self.ticks += 1

    def flush(self) -> None:
        """Log the counts since the last line (nothing when there were none) and reset them."""
        now = time.monotonic()
        if self.counts or self.ticks:
            total = sum(self.counts.values())
            parts = " ".join(f"{k}={self.counts[k]}" for k in OUTCOMES if self.counts[k])
            period = f"in the last {now - self._since:.0f}s"
            ticks = f"{self.ticks} periodic tick(s) enqueued"
            if not total:  # a scheduler without a worker
                line = f"{ticks} {period}"
            else:
                line = f"{total} task(s) {period}: {parts}"
                if self.ticks:
                    line += f"; {ticks}"
            summary_log.info("%s %s: %s", self.label, self.worker_id, line)
            self.counts.clear()
            self.ticks = 0
        self._since = now

    def service(self, interval: float) -> PeriodicService:
        """The worker service that calls :meth:`flush` every ``interval`` seconds."""
        return _SummaryService(self, interval)


class _SummaryService(PeriodicService):
    name = "summary"

    def __init__(self, summary: TaskSummary, interval: float) -> None:
        super().__init__(interval)
        self.summary = summary
        self._first = True

    async def tick(self) -> None:
        if self._first:  # the service's loop ticks once at start: nothing to say yet
            self._first = False
            return
        self.summary.flush()

    async def stop(self) -> None:
        await super().stop()
        self.summary.flush()  # the last partial interval
