"""The task types that ``durq bench`` runs: a no-op and a pickup-latency probe.

The app has no broker of its own: the bench worker process points it at the isolated broker
it is given, so running the bench never touches the user's ``durq.sqlite3``."""

from __future__ import annotations

import time
from typing import Any

from durq.app import App
from durq.brokers import FullBroker

#: Queue drained by the processing phase.
PROCESS_QUEUE = "bench"
#: Queue filled by the one-by-one enqueue phase (deleted afterwards, never processed).
ENQUEUE_QUEUE = "bench_one"
#: Queue of the pickup-latency probes; their results are kept so the parent can read them.
LATENCY_QUEUE = "bench_latency"

NOOP = "bench:noop"
LATENCY = "bench:latency"

#: Probes for a worker inside the producer's process (the monolith layout).
LOCAL_LATENCY_QUEUE = "bench_latency_local"
LOCAL_LATENCY = "bench:latency_local"

#: Completed latency probes are kept this long so their results can be read back.
LATENCY_RETENTION = 3600.0


async def noop(payload: dict[str, Any]) -> None:
    """Does nothing: the processing phase measures the queue, not the handler."""


async def latency(payload: dict[str, Any]) -> dict[str, float]:
    """Returns seconds from the producer's timestamp (taken just before enqueue) to now.

    Both ends use the wall clock of the same machine, so no skew enters the figure."""
    return {"latency": time.time() - float(payload["t"])}


def build_app(broker: str | FullBroker) -> App:
    """An app on ``broker`` with the two bench task types registered."""
    application = App(broker)
    # Throughput is measured with results not kept (retention 0), as the peers' no-op tasks
    # keep none; the default (an hour) would add a retained row per task to the figure.
    application.task(NOOP, queue=PROCESS_QUEUE, max_retry=0, retention=0)(noop)
    application.task(LATENCY, queue=LATENCY_QUEUE, max_retry=0, retention=LATENCY_RETENTION)(
        latency
    )
    application.task(
        LOCAL_LATENCY, queue=LOCAL_LATENCY_QUEUE, max_retry=0, retention=LATENCY_RETENTION
    )(latency)
    return application
