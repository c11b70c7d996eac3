"""The periodic scheduler service (P1): enqueues each due tick of the app's schedules.

It keeps no state that matters: the last tick it handled per entry lives in memory only to
avoid needless round trips. After a restart it simply tries the most recent due tick again;
the tick's task id (``periodic:<entry>:<epoch>``) makes that enqueue idempotent, and the
broker's :class:`~durq.errors.TaskIDConflictError` (E3) is the "already done" answer. Any
number of these services, in any number of processes, enqueue each tick exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from durq import lifecycle
from durq.errors import (
    ConfigurationError,
    DuplicateTaskError,
    InvalidStateError,
    QueueNotFoundError,
    TaskIDConflictError,
    TaskNotFoundError,
)
from durq.periodic import PeriodicEntry
from durq.schedules import entry_of
from durq.states import TaskState
from durq.worker.service import PeriodicService

if TYPE_CHECKING:
    from durq.appview import WorkerView
    from durq.brokers.contract import Broker, FullBroker
    from durq.task import TaskInfo

log = logging.getLogger("durq.scheduler")

#: How many ticks back a starting scheduler looks for a task of a ``run_once`` entry before
#: it catches up a missed tick (the entry's tasks must still be stored: see its retention).
CATCH_UP_LOOKBACK = 64

#: Seconds (of the app's clock) between two reads of the stored schedules: an edit, pause
#: or delete takes effect on every scheduler within this.
RELOAD_INTERVAL = 5.0

#: A run in one of these states is unfinished (the overlap policies look at it).
UNFINISHED = frozenset({TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY, TaskState.ACTIVE})


class PeriodicScheduler(PeriodicService):
    """Checks the app's periodic entries and enqueues due ticks.

    It wakes at the next due tick, and at least every ``max_interval`` seconds so that a
    jump of the wall clock is noticed promptly. ``broker``: the connection to enqueue on
    (a worker passes its own); default: the app's broker for the running loop."""

    name = "scheduler"

    def __init__(
        self,
        app: WorkerView,
        broker: Broker | None = None,
        *,
        max_interval: float = 1.0,
        min_interval: float = 0.01,
        reload_interval: float = RELOAD_INTERVAL,
        on_enqueued: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(max_interval)
        self.app = app
        self.broker = broker
        self.max_interval = max_interval
        self.min_interval = min_interval
        #: Called for each tick this instance enqueues (the worker's summary counts them).
        self.on_enqueued = on_enqueued
        #: The last tick handled per entry name (enqueued, found enqueued, or skipped).
        self.last: dict[str, float] = {}
        #: Ticks this instance created (not those another scheduler created first).
        self.enqueued = 0
        self.reload_interval = reload_interval
        #: The stored schedules that tick (not paused, not shadowed by a code entry), as
        #: last read, and when (the app's clock).
        self.stored: list[PeriodicEntry] = []
        self._loaded_at: float | None = None
        #: The last version of each stored record that could not be used (logged once).
        self._refused: dict[str, int] = {}
        #: Per ``buffer_one`` entry: a tick held back while the previous run is unfinished.
        self.buffered: dict[str, float] = {}

    async def _broker(self) -> Broker:
        if self.broker is None:
            self.broker = await self.app.broker()
        return self.broker

    async def tick(self) -> None:
        now = self.app.clock.now()
        try:
            for entry in self.app.schedules:
                await self.check(entry, now)
            for entry in await self.load_stored(now):
                await self.check(entry, now)
        finally:
            self._plan_wake(self.app.clock.now())

    async def load_stored(self, now: float) -> list[PeriodicEntry]:
        """The stored schedules to tick, read again once ``reload_interval`` has passed."""
        if self._loaded_at is not None and abs(now - self._loaded_at) < self.reload_interval:
            return self.stored
        broker = cast("FullBroker", await self._broker())
        records = await broker.admin.list_schedules()
        self._loaded_at = now
        entries = []
        for record in records:
            if record.paused:
                continue
            if record.name in self.app.schedules:
                if self._refused.get(record.name) != record.version:
                    self._refused[record.name] = record.version
                    log.warning(
                        "stored schedule %s is shadowed by the code entry of that name",
                        record.name,
                    )
                continue
            try:
                entries.append(entry_of(self.app.schedules, record))
            except ConfigurationError as exc:
                if self._refused.get(record.name) != record.version:
                    self._refused[record.name] = record.version
                    log.error("stored schedule %s cannot tick: %s", record.name, exc)
        self.stored = entries
        return entries

    async def check(self, entry: PeriodicEntry, now: float) -> str | None:
        """Enqueue ``entry``'s due tick, if any. Returns ``"enqueued"``, ``"exists"``,
        ``"duplicate"``, ``"skipped"``, ``"overlap"`` (skipped: the previous run is
        unfinished), ``"buffered"`` or ``None`` (nothing due)."""
        last = self.last.get(entry.name)
        latest = entry.schedule.latest(now)
        if latest is None or (last is not None and latest <= last):
            return None
        # A tick held back by buffer_one runs when the previous run ends, whatever its age.
        held = entry.name in self.buffered
        tick = latest if held else entry.due(now, last)
        if not held and tick is not None and last is None and now - tick > entry.tolerance:
            # A late tick at this scheduler's first look: a catch-up (run_once) only if the
            # entry ran before; on the very first start there was no missed run.
            if not await self._ran_before(entry, tick):
                self.last[entry.name] = tick
                log.info(
                    "periodic %s: first start, no earlier tick found; waiting for the next",
                    entry.name,
                )
                return "skipped"
        if tick is None:
            # Only the skip policy drops a tick: it is older than the entry's tolerance.
            self.last[entry.name] = latest
            log.warning(
                "periodic %s: tick %d missed by %.0fs (missed=skip); waiting for the next",
                entry.name,
                int(latest),
                now - latest,
            )
            return "skipped"
        try:
            params = self.app.schedules.params(entry, tick)
        except ConfigurationError:
            # E.g. a payload that no longer fits the task's model: fail loudly, once a tick.
            self.last[entry.name] = tick
            log.exception("periodic %s: cannot enqueue tick %d", entry.name, int(tick))
            return None
        if entry.overlap != "allow":
            held_back = await self._overlap(entry, tick)
            if held_back is not None:
                return held_back
        broker = await self._broker()
        try:
            # BrokerUnavailableError propagates: ``last`` is unchanged and the next round
            # tries the same tick again (subject to the missed policy).
            await broker.enqueue(params)
        except TaskIDConflictError:
            self.last[entry.name] = tick
            self.buffered.pop(entry.name, None)
            return "exists"  # another scheduler (or this one before a restart) was first
        except DuplicateTaskError:
            # The task type is unique= and an earlier tick is still queued (E4): this tick is
            # refused for good; retrying it every round would stall the entries after it.
            self.last[entry.name] = tick
            log.warning(
                "periodic %s: tick %d refused: an identical task is still queued (unique)",
                entry.name,
                int(tick),
            )
            return "duplicate"
        self.last[entry.name] = tick
        self.buffered.pop(entry.name, None)
        self.enqueued += 1
        if self.on_enqueued is not None:
            self.on_enqueued()
        # DEBUG: a line per tick drowns the log of a busy schedule; the summary counts them.
        log.debug(
            "periodic %s: enqueued tick %d as task %s (late by %.2fs)",
            entry.name,
            int(tick),
            params.id,
            now - tick,
        )
        return "enqueued"

    async def _ran_before(self, entry: PeriodicEntry, tick: float) -> bool:
        """Whether a task of one of the ``CATCH_UP_LOOKBACK`` ticks up to ``tick`` exists."""
        return await self._latest_run(entry, tick) is not None

    async def _latest_run(self, entry: PeriodicEntry, tick: float | None) -> TaskInfo | None:
        """The task of the latest of the ``CATCH_UP_LOOKBACK`` ticks up to ``tick`` that is
        still stored, if any."""
        if tick is None:
            return None
        queue = self.app.schedules.params(entry, tick).queue
        # The scheduler's own connection (a worker's), not a second one through the app.
        broker = cast("FullBroker", await self._broker())
        candidate: float | None = tick
        for _ in range(CATCH_UP_LOOKBACK):
            if candidate is None:
                return None
            try:
                return await broker.admin.get_task(queue, entry.task_id(candidate))
            except QueueNotFoundError:
                return None  # nothing was ever enqueued to its queue
            except TaskNotFoundError:
                candidate = entry.schedule.latest(candidate - 1)
        return None

    async def _overlap(self, entry: PeriodicEntry, tick: float) -> str | None:
        """Apply the entry's overlap policy before enqueueing ``tick``: ``None`` to go on,
        else why the tick is not enqueued now (``"overlap"``: dropped, ``"buffered"``:
        held until the previous run ends). The previous run is the latest tick's task
        still stored before ``tick``; runs started by hand (trigger) are not looked at."""
        previous = await self._latest_run(entry, entry.schedule.latest(tick - 1))
        if previous is None or previous.state not in UNFINISHED:
            return None
        if entry.overlap == "skip":
            self.last[entry.name] = tick
            log.info(
                "periodic %s: tick %d skipped: run %s is unfinished (overlap=skip)",
                entry.name,
                int(tick),
                previous.id,
            )
            return "overlap"
        if entry.overlap == "buffer_one":
            # ``last`` stays: each round looks again, and only the latest tick is a
            # candidate, so at most one waits.
            self.buffered[entry.name] = tick
            return "buffered"
        try:  # cancel_other
            broker = cast("FullBroker", await self._broker())
            await lifecycle.cancel_task(broker.admin, previous.queue, previous.id)
        except (TaskNotFoundError, InvalidStateError):
            pass  # it ended (or another scheduler cancelled it) meanwhile
        log.info(
            "periodic %s: cancelled unfinished run %s for tick %d (overlap=cancel_other)",
            entry.name,
            previous.id,
            int(tick),
        )
        return None

    def _plan_wake(self, now: float) -> None:
        # PeriodicService waits ``interval`` between ticks: aim it at the next due tick.
        entries = [*self.app.schedules, *self.stored]
        upcoming = [e.schedule.next_after(now) for e in entries]
        wait = min(upcoming, default=now + self.max_interval) - now
        self.interval = min(self.max_interval, max(self.min_interval, wait))
