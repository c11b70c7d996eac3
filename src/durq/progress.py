"""A running task's progress and log lines: what a handler reports through its
:class:`~durq.task.TaskContext`, how it is bounded, and the stored form every broker keeps.

A task keeps its **latest progress** (a fraction, a short message, the attempt that reported
it) and its **last** :data:`MAX_LOG_LINES` **log lines** (each cut to :data:`MAX_LINE_BYTES`
of UTF-8, each marked with its attempt; older lines are dropped). Log lines are kept across
attempts; a new attempt's first report replaces the earlier attempt's progress, and a running
attempt never shows an earlier one's (:func:`progress_of`).

Stored form (the same on every broker): the progress is one JSON object, the log one JSON
object per line joined by ``\\n`` (JSON text holds no raw newline), so a broker appends and
trims lines without parsing them (:func:`append_lines`; the PostgreSQL statement and the
Redis script do the same in their own language)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from durq import codec
from durq.clock import to_datetime
from durq.states import TaskState

#: Log lines a task keeps, over all its attempts; the oldest go first.
MAX_LOG_LINES = 50
#: Longest log line (and progress message) stored, in bytes of UTF-8; longer ones are cut.
MAX_LINE_BYTES = 1024
#: Levels a log line may have.
LEVELS = ("debug", "info", "warning", "error")
#: Seconds between two writes of one attempt's reports (they are coalesced meanwhile).
FLUSH_INTERVAL = 0.5


@dataclass(frozen=True, slots=True)
class TaskProgress:
    """The latest progress a task's handler reported."""

    #: The attempt that reported it (1 for the first).
    attempt: int
    #: Done so far, from 0.0 to 1.0.
    fraction: float
    message: str | None
    #: When the worker took the report (epoch seconds on its app's clock).
    at: float

    @property
    def percent(self) -> int:
        """The fraction as a whole percentage (rounded down)."""
        return int(self.fraction * 100)

    def describe(self) -> str:
        """``40% rows 400/1000 (attempt 1)``: the progress in one line."""
        text = f"{self.percent}%"
        if self.message:
            text += f" {self.message}"
        return f"{text} (attempt {self.attempt})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "fraction": self.fraction,
            "message": self.message,
            "at": _iso(self.at),
        }


@dataclass(frozen=True, slots=True)
class TaskLogLine:
    """One line a task's handler logged (``ctx.log``)."""

    attempt: int
    at: float
    level: str
    message: str

    def describe(self) -> str:
        """``attempt 1 12:00:01 info started``: the line as a log shows it."""
        moment = to_datetime(self.at)
        when = moment.strftime("%H:%M:%S") if moment else "?"
        return f"attempt {self.attempt} {when} {self.level} {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "at": _iso(self.at),
            "level": self.level,
            "message": self.message,
        }


def _iso(at: float) -> str | None:
    moment: datetime | None = to_datetime(at)
    return moment.isoformat() if moment else None


def clip(text: str) -> str:
    """``text`` made storable (:func:`durq.codec.storable_text`) and cut to
    :data:`MAX_LINE_BYTES` bytes of UTF-8 (ending with ``…`` when cut)."""
    text = codec.storable_text(text)
    data = text.encode("utf-8")
    if len(data) <= MAX_LINE_BYTES:
        return text
    # "…" is 3 bytes; "ignore" drops a character cut in the middle.
    return data[: MAX_LINE_BYTES - 3].decode("utf-8", "ignore") + "…"


def check_fraction(fraction: float) -> float:
    """``fraction`` as a float from 0 to 1; ValueError otherwise."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ValueError(f"progress must be a number from 0 to 1, not {fraction!r}")
    value = float(fraction)
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"progress must be from 0 to 1, not {fraction!r}")
    return value


def check_level(level: str) -> str:
    """``level`` in lower case if it is one of :data:`LEVELS`; ValueError otherwise."""
    name = level.lower() if isinstance(level, str) else level
    if name not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    return str(name)


def encode_progress(attempt: int, fraction: float, message: str | None, at: float) -> str:
    """The stored form of one progress report (``fraction`` already checked)."""
    return json.dumps(
        {"attempt": attempt, "fraction": fraction, "message": message, "at": at},
        separators=(",", ":"),
    )


def encode_line(attempt: int, at: float, level: str, message: str) -> str:
    """The stored form of one log line (one line of JSON: ``\\n`` inside is escaped)."""
    return json.dumps(
        {"attempt": attempt, "at": at, "level": level, "message": message},
        separators=(",", ":"),
    )


def append_lines(stored: str | None, lines: list[str] | tuple[str, ...]) -> str | None:
    """The stored log after appending ``lines`` (stored forms): the last
    :data:`MAX_LOG_LINES` of the two. The reference for the brokers' own copies."""
    kept = [*(stored.split("\n") if stored else ()), *lines][-MAX_LOG_LINES:]
    return "\n".join(kept) if kept else None


def decode_progress(raw: str | bytes | None) -> TaskProgress | None:
    """The stored progress (``None``, empty: none)."""
    if not raw:
        return None
    o = json.loads(raw)
    return TaskProgress(int(o["attempt"]), float(o["fraction"]), o["message"], float(o["at"]))


def decode_logs(raw: str | bytes | None) -> tuple[TaskLogLine, ...]:
    """The stored log, oldest line first."""
    if not raw:
        return ()
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    out = []
    for line in text.split("\n"):
        if line:
            o = json.loads(line)
            out.append(
                TaskLogLine(int(o["attempt"]), float(o["at"]), str(o["level"]), o["message"])
            )
    return tuple(out)


def progress_of(raw: str | bytes | None, state: TaskState, retried: int) -> TaskProgress | None:
    """The progress to show for a task: the stored one, except that a running attempt that
    has not reported yet does not show an earlier attempt's (reset at a new attempt)."""
    progress = decode_progress(raw)
    if progress is not None and state is TaskState.ACTIVE and progress.attempt < retried + 1:
        return None
    return progress
