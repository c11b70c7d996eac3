"""Structured logs: one line per event, with the business fields (order, customer, task) as
``key=value`` pairs or as JSON (``INSURANCE_LOG_FORMAT=json``)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

#: ``extra=`` keys that are written out when present.
FIELDS = (
    "order_id",
    "customer",
    "task_id",
    "task_type",
    "queue",
    "attempt",
    "status",
    "method",
    "path",
)
LOGGERS = ("insurance", "durq", "uvicorn.error")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message and the business fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in FIELDS:
            if hasattr(record, key):
                data[key] = getattr(record, key)
        if record.exc_info:
            data["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class TextFormatter(logging.Formatter):
    """``time level logger: message [order_id=… task_id=…]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{k}={getattr(record, k)}" for k in FIELDS if hasattr(record, k)]
        return f"{line} [{' '.join(fields)}]" if fields else line


def setup_logging(fmt: str = "text", level: str = "INFO") -> None:
    """Send the service's, durq's and uvicorn's logs to stderr in one format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False
