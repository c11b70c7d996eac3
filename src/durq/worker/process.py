"""How a worker process starts its metrics endpoint and exits: shared by ``durq worker`` and
Django's ``manage.py durq_worker``."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TYPE_CHECKING

from durq.errors import ConfigurationError

if TYPE_CHECKING:
    from durq.appview import MetricsHost

log = logging.getLogger("durq.worker")


def start_metrics(app: MetricsHost, port: int, readyz_details: bool = False) -> None:
    """Expose Prometheus metrics on ``port`` from a thread of their own; ConfigurationError
    when the metrics extra is not installed."""
    try:
        from durq.observability import metrics
    except ImportError as exc:
        raise ConfigurationError(
            f"--metrics-port needs durq.observability.metrics (pip install 'durq[metrics]'): {exc}"
        ) from None
    metrics.serve(app, port, readyz_details=readyz_details)


def exit_past_stuck_threads() -> None:
    """Sync handlers cannot be cancelled: after a graceful stop their tasks are already handed
    back, so do not let interpreter exit wait (join) for their threads."""
    stuck = [t for t in threading.enumerate() if t.name.startswith("durq-task") and t.is_alive()]
    if not stuck:
        return
    log.warning(
        "exiting with %d sync handler(s) still running; their tasks were handed back", len(stuck)
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
