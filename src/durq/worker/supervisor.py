"""``durq worker --processes N``: one supervisor, N worker processes.

A durq worker runs on one event loop, so it uses one core. The supervisor starts ``N`` copies
of the worker command as child processes (each with its own ``concurrency``), restarts one
that exits or crashes with a capped exponential backoff (one that exits with a usage or
configuration error stops them all: it would fail again), replaces at once one that exits 0
(recycled: ``--max-tasks-per-child``/``--max-memory-per-child``; under ``--burst`` a 0 means
the queues are drained and the slot is done), passes the first SIGTERM/SIGINT to every child
once (each drains gracefully, as a lone worker does) and a second one too (each stops at
once), kills one still running :data:`KILL_AFTER` seconds past the shutdown timeout, and
serves one metrics endpoint for all of them.

Metrics: the children run in prometheus-client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``
set to a private temporary directory): each writes its counters to files there, and the
supervisor's ``/metrics`` reads them all (``MultiProcessCollector``), beside the queue gauges
and health probes it answers itself.

Children run in their own session, so Ctrl-C in a terminal reaches only the supervisor (which
passes it on once); a child whose supervisor died (SIGKILL) notices it is orphaned within a
second and stops gracefully (:class:`OrphanWatch`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from durq import ranges
from durq.errors import ConfigurationError
from durq.worker.service import PeriodicService

if TYPE_CHECKING:
    from durq.appview import MetricsHost
    from durq.observability.metrics import MetricsServer

log = logging.getLogger("durq.supervisor")

#: Set in a child's environment: the supervisor's pid (the child watches it).
SUPERVISOR_ENV = "DURQ_SUPERVISOR_PID"
#: prometheus-client's switch to its multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: A child's exit code for bad usage or configuration (the CLI's): the same command would
#: fail again, so the supervisor stops instead of starting it again.
USAGE_EXIT = 2
#: ``--processes`` may ask for at most this many worker processes per available CPU.
PROCESSES_PER_CPU = 4
#: Past the shutdown timeout, how long a child may take to hand its tasks back and close
#: before the supervisor kills it (SIGKILL).
KILL_AFTER = 5.0


def resolve_processes(value: str, name: str = "processes") -> int:
    """``"auto"`` (:func:`available_cpus`) or an integer from 1 to :func:`max_processes`;
    ConfigurationError (naming ``name``) otherwise."""
    if value == "auto":
        return available_cpus()
    cap = max_processes()
    try:
        return ranges.integer(name, value, 1, cap)
    except ConfigurationError:
        raise ConfigurationError(
            f"{name} must be auto or an integer from 1 to {cap} "
            f"({PROCESSES_PER_CPU} per available CPU), got {value!r}"
        ) from None


def max_processes() -> int:
    """The most worker processes one supervisor starts: :data:`PROCESSES_PER_CPU` per
    available CPU. Each is a whole interpreter; past a few per core they only compete for
    the CPU (``--concurrency`` is the way to run more tasks at once)."""
    return PROCESSES_PER_CPU * available_cpus()


def available_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs this process may use: its affinity mask, capped by a cgroup CPU quota (a
    container's CPU limit, rounded up), at least 1. ``os.cpu_count()`` alone counts the
    host's CPUs, which in a container limited to 2 CPUs on a 64-CPU node meant 64 processes."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        count = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root)
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(1, count)


def cgroup_cpu_quota(root: Path, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs allowed by the cgroup quota (``cpu.max`` of cgroup v2, ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` of v1); ``None`` when unlimited or unknown."""
    own = ""
    with contextlib.suppress(OSError):
        for line in proc_cgroup.read_text().splitlines():
            if line.startswith("0::"):  # cgroup v2: this process's group under the root
                own = line[3:].strip("/")
    for path in dict.fromkeys([root / own / "cpu.max", root / "cpu.max"]):
        with contextlib.suppress(OSError, ValueError):
            quota, period = path.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
    with contextlib.suppress(OSError, ValueError):
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        if quota_us > 0 and period_us > 0:
            return quota_us / period_us
    return None


class Supervisor:
    """Keeps ``processes`` copies of ``command`` running until SIGTERM/SIGINT.

    ``command``: the child's argv (a ``durq worker`` without ``--processes``).
    ``metrics_port``: serve ``/metrics``, ``/healthz``, ``/readyz`` for all children (needs
    ``app`` for the queue gauges and the broker probe; ``readyz_details``: see
    :class:`~durq.observability.metrics.MetricsServer`). ``backoff``: the first and the longest
    delay before restarting a child; a child that lived ``stable_after`` seconds starts again
    from the first delay. ``shutdown_timeout``: the children's grace at shutdown; a child
    still running :data:`KILL_AFTER` seconds past it is killed, so the supervisor stops
    within ``shutdown_timeout + KILL_AFTER`` of the first signal whatever the children do.

    Children are started one at a time, so a signal that comes while they are still being
    started is handled before the next one: none is started after it."""

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        app: MetricsHost | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "0.0.0.0",  # noqa: S104  # scraped from outside the host
        backoff: tuple[float, float] = (0.5, 30.0),
        stable_after: float = 10.0,
        readyz_details: bool = False,
        shutdown_timeout: float = 10.0,
        burst: bool = False,
    ) -> None:
        if processes < 1:
            raise ValueError("processes must be >= 1")
        if metrics_port is not None and app is None:
            raise ValueError("metrics_port needs the app")
        self.command = list(command)
        self.processes = processes
        self.app = app
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.readyz_details = readyz_details
        self.backoff = backoff
        self.stable_after = stable_after
        self.shutdown_timeout = shutdown_timeout
        #: Children run ``--burst``: one that exits 0 drained the queues and is not replaced.
        self.burst = burst
        #: Live children by slot.
        self.children: dict[int, asyncio.subprocess.Process] = {}
        #: How many times a child was started again after it exited.
        self.restarts = 0
        self._stopping = asyncio.Event()
        self._signals = 0
        self._multiproc_dir: str | None = None
        self._spawning = asyncio.Lock()

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[SUPERVISOR_ENV] = str(os.getpid())
        # The children neither serve metrics nor supervise: the supervisor does both.
        env.pop("DURQ_METRICS_PORT", None)
        env.pop("DURQ_PROCESSES", None)
        if self._multiproc_dir is not None:
            env[MULTIPROC_ENV] = self._multiproc_dir
        return env

    async def run(self) -> int:
        """Run until a signal stopped every child; the exit code for the command (0 when
        every child stopped cleanly)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        server = None
        reaper = asyncio.create_task(self._kill_after_grace())
        try:
            if self.metrics_port is not None:
                self._multiproc_dir = tempfile.mkdtemp(prefix="durq-metrics-")
                server = await self._start_metrics()
            log.info("supervisor %d: starting %d worker processes", os.getpid(), self.processes)
            codes = await asyncio.gather(*(self._keep(slot) for slot in range(self.processes)))
        finally:
            reaper.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            if server is not None:
                await server.stop()
            if self._multiproc_dir is not None:
                shutil.rmtree(self._multiproc_dir, ignore_errors=True)
        log.info("supervisor %d stopped", os.getpid())
        if USAGE_EXIT in codes:
            return USAGE_EXIT
        return 0 if all(code == 0 for code in codes) else 1

    async def _start_metrics(self) -> MetricsServer:
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        from durq.observability.metrics import MetricsServer as Server

        assert self.app is not None and self.metrics_port is not None
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self._multiproc_dir)  # type: ignore[no-untyped-call]
        server = Server(
            self.app,
            self.metrics_port,
            self.metrics_host,
            registries=[registry],
            readyz_details=self.readyz_details,
        )
        await server.start()
        return server

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info(
                "%s received: stopping %d worker processes gracefully", sig.name, len(self.children)
            )
        else:
            log.warning("second %s: worker processes stop at once", sig.name)
        self._stop_children()

    async def _kill_after_grace(self) -> None:
        """Once stopping: kill (SIGKILL) the children still running past their grace."""
        await self._stopping.wait()
        await asyncio.sleep(self.shutdown_timeout + KILL_AFTER)
        for child in list(self.children.values()):
            log.warning(
                "worker process %d still running %.0fs after the stop: killing it",
                child.pid,
                self.shutdown_timeout + KILL_AFTER,
            )
            with contextlib.suppress(ProcessLookupError):
                child.kill()

    async def _spawn(self, slot: int) -> asyncio.subprocess.Process | None:
        """Start the child of ``slot``; ``None`` once stopping (nothing started)."""
        # One fork at a time: each start yields to the event loop, so a signal that came
        # meanwhile is handled (and stops the rest) before the next fork.
        async with self._spawning:
            if self._stopping.is_set():
                return None
            child = await asyncio.create_subprocess_exec(
                *self.command, env=self._child_env(), start_new_session=True
            )
            self.children[slot] = child
            if self._stopping.is_set():  # a signal came while it was starting
                child.send_signal(signal.SIGTERM)
            return child

    def _stop_children(self) -> None:
        """Stop taking children back and send each live one SIGTERM (its graceful drain)."""
        self._stopping.set()
        for child in list(self.children.values()):
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)

    async def _keep(self, slot: int) -> int:
        """Run the child of ``slot`` until the supervisor stops; its last exit code."""
        loop = asyncio.get_running_loop()
        delay = self.backoff[0]
        while True:
            started = loop.time()
            child = await self._spawn(slot)
            if child is None:
                return 0
            code = await child.wait()
            del self.children[slot]
            self._forget(child.pid)
            if self._stopping.is_set():
                # A child still importing when the signal came had no handler yet: the
                # SIGTERM it was sent ended it, which is the stop that was asked for.
                return 0 if code == -signal.SIGTERM else code
            if code == USAGE_EXIT:
                log.error(
                    "worker process %d exited with a usage or configuration error (%d); "
                    "stopping the others, not starting it again",
                    child.pid,
                    code,
                )
                self._stop_children()
                return code
            if code == 0 and self.burst:  # the queues are drained: this slot is done
                return code
            if code == 0:  # recycled (--max-tasks/--max-memory-per-child): replace it now
                log.info("worker process %d retired; starting a fresh one", child.pid)
                self.restarts += 1
                continue
            if loop.time() - started >= self.stable_after:
                delay = self.backoff[0]
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited ({code})"
            log.warning("worker process %d %s; starting it again in %.1fs", child.pid, how, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            if self._stopping.is_set():
                return code
            delay = min(delay * 2, self.backoff[1])
            self.restarts += 1

    def _forget(self, pid: int) -> None:
        """Drop a dead child's live gauges from the shared metrics (its counters stay)."""
        if self._multiproc_dir is None:
            return
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, self._multiproc_dir)  # type: ignore[no-untyped-call]


class OrphanWatch(PeriodicService):
    """In a supervised child: stop gracefully (SIGTERM to itself) once the supervisor is gone,
    so a supervisor killed with SIGKILL does not leave its workers running unsupervised."""

    name = "orphan-watch"

    def __init__(self, supervisor_pid: int, interval: float = 1.0) -> None:
        super().__init__(interval)
        self.supervisor_pid = supervisor_pid
        self._told = False

    async def tick(self) -> None:
        if os.getppid() != self.supervisor_pid and not self._told:
            self._told = True
            log.warning("supervisor %d is gone: stopping", self.supervisor_pid)
            os.kill(os.getpid(), signal.SIGTERM)


def supervised_child() -> int | None:
    """The supervisor's pid when this process is one of its workers."""
    value = os.environ.get(SUPERVISOR_ENV)
    return int(value) if value and value.isdigit() else None


def this_interpreter() -> list[str]:
    """The argv prefix that runs the ``durq`` CLI with this interpreter."""
    return [sys.executable, "-m", "durq"]
