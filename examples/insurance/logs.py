"""Structured logs: one line per event, with the business fields (order, customer, task) as
``key=value`` pairs or as JSON (``INSURANCE_LOG_FORMAT=json``)."""

from __future__ import annotations

import logging
import sys

from durq.observability.logging import JsonFormatter, TextFormatter

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


def setup_logging(fmt: str = "text", level: str = "INFO") -> None:
    """Send the service's, durq's and uvicorn's logs to stderr in one format."""
    handler = logging.StreamHandler(sys.stderr)
    # durq's formatters, with the business fields added to the task fields.
    handler.setFormatter(JsonFormatter(FIELDS) if fmt == "json" else TextFormatter(FIELDS))
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False
