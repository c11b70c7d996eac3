"""One attempt's progress and log lines on their way to the broker (``ctx.progress``,
``ctx.log``): stamped when the handler reports them, coalesced to at most one write per
:data:`~durq.progress.FLUSH_INTERVAL`, written under the attempt's lease, and flushed when
the attempt ends. A write the fence refuses (the lease was lost) ends reporting."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from durq import progress as p
from durq.brokers.contract import Broker
from durq.brokers.params import LeaseRef, ProgressParams
from durq.clock import Clock
from durq.errors import BrokerUnavailableError

log = logging.getLogger("durq.worker")


class AttemptReports:
    """The :class:`~durq.task.ReportSink` of one attempt. ``progress`` and ``log`` may be
    called from the handler's thread (sync handlers) or the event loop; writes happen on the
    loop, one at a time."""

    def __init__(
        self,
        broker: Broker,
        lease: LeaseRef,
        attempt: int,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        interval: float = p.FLUSH_INTERVAL,
    ) -> None:
        self._broker = broker
        self._lease = lease
        self._attempt = attempt
        self._clock = clock
        self._loop = loop
        self._interval = interval
        self._lock = threading.Lock()  # guards what is pending, shared with handler threads
        self._progress: str | None = None
        self._lines: list[str] = []
        #: The attempt's first write clears an earlier attempt's progress if it has none.
        self._first = True
        self._closed = False
        self._wanted = asyncio.Event()
        self._writing = asyncio.Lock()
        self._writer: asyncio.Task[None] | None = None

    # -- from the handler (any thread) -------------------------------------------------

    def progress(self, fraction: float, message: str | None) -> None:
        at = self._clock.now()
        with self._lock:
            if self._closed:
                return
            self._progress = p.encode_progress(self._attempt, fraction, message, at)
        self._poke()

    def log(self, level: str, message: str) -> None:
        at = self._clock.now()
        with self._lock:
            if self._closed:
                return
            self._lines.append(p.encode_line(self._attempt, at, level, message))
            # A handler logging in a tight loop keeps only what the task would keep.
            del self._lines[: -p.MAX_LOG_LINES]
        self._poke()

    def _poke(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._start()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: the worker stopped
                self._loop.call_soon_threadsafe(self._start)

    # -- on the loop --------------------------------------------------------------------

    def _start(self) -> None:
        self._wanted.set()
        if self._writer is None and not self._closed:
            self._writer = self._loop.create_task(self._run(), name="durq-task-reports")

    async def _run(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            # Shielded: closing stops the loop, not a write under way (close waits for it).
            await asyncio.shield(self._flush())
            await asyncio.sleep(self._interval)

    async def _flush(self) -> None:
        async with self._writing:
            with self._lock:
                progress, lines = self._progress, tuple(self._lines)
                self._progress, self._lines = None, []
            if progress is None and not lines:
                return
            if self._first and progress is None:
                progress = ""
            try:
                held = await self._broker.report_progress(
                    ProgressParams(self._lease, progress=progress, lines=lines)
                )
            except BrokerUnavailableError:
                with self._lock:  # keep them for the next write (newer progress wins)
                    if self._progress is None:
                        self._progress = progress
                    self._lines[:0] = lines
                    del self._lines[: -p.MAX_LOG_LINES]
                self._wanted.set()  # try again after the interval, reported or not
                return
            except Exception:
                log.exception("task %s: could not store its progress", self._lease.id)
                return
            self._first = False
            if not held:
                with self._lock:  # the lease is gone: this attempt may write no more
                    self._closed = True

    async def close(self) -> None:
        """Stop coalescing and write what is pending (the end of the attempt)."""
        with self._lock:
            already = self._closed
            self._closed = True
            # Most handlers that take a context never report: nothing to stop or write.
            if self._writer is None and self._progress is None and not self._lines:
                return
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        if not already:
            await self._flush()


class LazyReports:
    """The :class:`~durq.task.ReportSink` an attempt's context gets: it builds the
    :class:`AttemptReports` on the first report, since most handlers that take a context
    never report and the writer's locks and event cost more than a small task. Once closed,
    reports are dropped, as :class:`AttemptReports` drops them."""

    __slots__ = ("_build", "_built", "_closed")

    #: Guards the first build (a sync handler reports from its thread).
    _building = threading.Lock()

    def __init__(self, build: Callable[[], AttemptReports]) -> None:
        self._build = build
        self._built: AttemptReports | None = None
        self._closed = False

    def _reports(self) -> AttemptReports | None:
        built = self._built
        if built is None:
            with self._building:
                if self._closed:
                    return None
                if self._built is None:
                    self._built = self._build()
                built = self._built
        return built

    def progress(self, fraction: float, message: str | None) -> None:
        if (reports := self._reports()) is not None:
            reports.progress(fraction, message)

    def log(self, level: str, message: str) -> None:
        if (reports := self._reports()) is not None:
            reports.log(level, message)

    async def close(self) -> None:
        """Write what is pending (the end of the attempt); later reports are dropped."""
        with self._building:
            self._closed = True
            built = self._built
        if built is not None:
            await built.close()
