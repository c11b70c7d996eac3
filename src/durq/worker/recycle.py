"""Recycling a worker process: past a memory limit it stops claiming, finishes what it runs
and exits (0), and its supervisor, or the process manager, starts a fresh one. A handler that
leaks (a growing cache, a C extension) then costs a restart now and then, not an OOM kill
that hands every running task to the rescuer."""

from __future__ import annotations

import logging
import os
import resource
import sys
from collections.abc import Callable

from durq.worker.service import PeriodicService

log = logging.getLogger("durq.worker")

_MB = 1024 * 1024
#: The bounds of ``max_tasks`` (``--max-tasks-per-child``) and of ``max_memory`` in MB
#: (``--max-memory-per-child``; below 16 MB no Python worker fits).
MAX_TASKS_RANGE = (1, 10**9)
MAX_MEMORY_RANGE = (16, 10**7)


def rss_mb() -> float:
    """This process's resident memory in MB: the current size where /proc tells it, else
    the peak (``getrusage``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / _MB
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
        return peak / _MB if sys.platform == "darwin" else peak / 1024


class MemoryWatch(PeriodicService):
    """Calls ``retire`` once the process's resident memory exceeds ``limit_mb``."""

    name = "memory-watch"

    def __init__(self, limit_mb: float, retire: Callable[[], None], interval: float = 1.0) -> None:
        super().__init__(interval)
        self.limit_mb = limit_mb
        self.retire = retire
        self._told = False

    async def tick(self) -> None:
        used = rss_mb()
        if used > self.limit_mb and not self._told:
            self._told = True
            log.info(
                "memory %.0f MB is over the limit of %.0f MB: claiming no more tasks",
                used,
                self.limit_mb,
            )
            self.retire()
