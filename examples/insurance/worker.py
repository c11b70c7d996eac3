"""The split topology's worker: ``durq worker examples.insurance.worker:app``
(or ``python -m examples.insurance.worker``), pointed at the same broker and database as the
API. The app object is the same one the monolith runs inside the API (H5)."""

from __future__ import annotations

import asyncio

from .config import Settings
from .logs import setup_logging
from .tasks import COVERAGE_QUEUE, build

settings = Settings.from_env()
app, runtimes = build(settings)


async def main() -> None:
    """Run one worker until SIGTERM/SIGINT (graceful: running polls finish or go back)."""
    setup_logging(settings.log_format, settings.log_level)
    worker = app.worker(
        queues=[COVERAGE_QUEUE],
        concurrency=settings.concurrency,
        shutdown_timeout=settings.shutdown_timeout,
        poll_interval=settings.worker_poll,
        promote_interval=settings.worker_poll,
    )
    try:
        await worker.run()
    finally:
        await runtimes.close()
        await app.close()


def run() -> None:
    """:func:`main` on uvloop's event loop when it is installed (as uvicorn picks it for the
    API): less CPU per socket event than asyncio's."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


if __name__ == "__main__":
    run()
