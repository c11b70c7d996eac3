"""Log set-up: every line about a task carries its id, type, queue and attempt; JSON is
one flag away (``--log-format json``)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

#: ``extra=`` keys durq puts on task log records.
TASK_FIELDS = ("task_id", "task_type", "queue", "attempt")


class TextFormatter(logging.Formatter):
    """``time level logger message [task_id=… type=… queue=… attempt=…]``.

    ``fields``: the ``extra=`` keys written out when present (a service adds its own)."""

    def __init__(self, fields: Sequence[str] = TASK_FIELDS) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        self.fields = tuple(fields)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{k}={getattr(record, k)}" for k in self.fields if hasattr(record, k)]
        return f"{line} [{' '.join(fields)}]" if fields else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message and the ``fields`` present."""

    def __init__(self, fields: Sequence[str] = TASK_FIELDS) -> None:
        super().__init__()
        self.fields = tuple(fields)

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in self.fields:
            if hasattr(record, key):
                data[key] = getattr(record, key)
        if record.exc_info:
            data["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def setup_logging(level: str | int = "INFO", fmt: str = "text") -> None:
    """Configure the ``durq`` loggers on stderr, as ``text`` or ``json``."""
    if fmt not in ("text", "json"):
        raise ValueError(f"unknown log format {fmt!r} (text or json)")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger = logging.getLogger("durq")
    logger.handlers[:] = [handler]
    logger.setLevel(level if isinstance(level, int) else level.upper())
    logger.propagate = False
