"""The SQLite broker's clocks. One machine, several processes, one wall clock that may step
(NTP, a resumed VM, an operator): leases run on the machine's monotonic clock, scoped to its
boot, and the moments counted from a duration move with the wall clock when it steps."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path

from durq.clock import Clock, SystemClock

log = logging.getLogger("durq.brokers.sqlite")

#: Where Linux names the current boot (a new random id at each boot).
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
#: A change of (wall - monotonic) at least this large is a step of the wall clock. NTP slews
#: CLOCK_MONOTONIC along with the wall clock, so without a step the difference stays put.
STEP = 1.0


def boot_id(path: Path = BOOT_ID) -> str | None:
    """This boot of the machine, or ``None`` where the system does not say (not Linux)."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class Timeline:
    """Lease clock and step detection for one broker.

    With the real clock, a lease expires on ``CLOCK_MONOTONIC`` (system-wide, never steps,
    paused while the machine sleeps: a suspended machine's workers were suspended too) of the
    boot that wrote it; a lease of another boot has expired. Without a boot id (not Linux)
    leases fall back to the wall clock. An injected test clock drives both: its
    ``monotonic()`` for leases, its ``now()`` for the rest."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        boot = boot_id() if isinstance(clock, SystemClock) else "test"
        self.boot = boot or "wall"
        self._lease_clock: Callable[[], float] = clock.monotonic if boot else clock.now
        # (wall - monotonic) when this process last agreed with the database: while it holds,
        # no step happened and the database need not be read. A check's agreement counts
        # once its transaction committed (settle): a rolled-back shift never happened.
        self._seen: float | None = None
        self._unsettled: float | None = None

    def lease_params(self) -> dict[str, object]:
        """``:boot`` and ``:mono`` of the lease statements."""
        return {"boot": self.boot, "mono": self._lease_clock()}

    def check(
        self,
        conn: sqlite3.Connection | sqlite3.Cursor,
        q: Mapping[str, str],
        *,
        remember: bool = True,
    ) -> float:
        """Inside a write transaction: if the wall clock stepped since this machine last
        looked, move the relative moments by the step (once: the first process to notice does
        it under the write lock). Returns the wall clock it read, which the transaction uses
        as its now: the stored moments agree with it. (A step after this read is one this
        transaction's writes take part in: the next check moves them along with the rest.)

        ``remember``: call :meth:`settle` once the transaction committed, so later checks
        of this process skip the database while the clock holds. ``False`` for a caller's
        transaction (its commit is not ours to see, and it runs on the caller's thread)."""
        if remember:
            self._unsettled = None
        now = self.clock.now()
        offset = now - self.clock.monotonic()
        if self._seen is not None and abs(offset - self._seen) < STEP:
            return now
        execute = conn.execute
        row = execute(q["clock_get"]).fetchone()
        if row is None or row[0] != self.boot:
            execute(q["clock_set"], {"boot": self.boot, "wall_offset": offset})
        elif abs(offset - row[1]) >= STEP:
            step: float = offset - row[1]
            execute(q["clock_shift"], {"by": step})
            execute(q["clock_set"], {"boot": self.boot, "wall_offset": offset})
            log.warning(
                "the wall clock stepped by %+.1f s: delayed tasks, unique ttls and retention "
                "moved with it; leases are on the monotonic clock and stay valid",
                step,
            )
        else:
            offset = row[1]
        if remember:
            self._unsettled = offset
        return now

    def settle(self) -> None:
        """The transaction of the last :meth:`check` committed: the database agrees with it."""
        if self._unsettled is not None:
            self._seen, self._unsettled = self._unsettled, None
