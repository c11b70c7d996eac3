"""The worker process: wires the services and owns their start/stop order.

Start: connect, register, the fetcher (the first claim goes first), then heartbeat, rescuer,
promoter and janitor.
Stop: the fetcher first (no new claims), wait up to ``shutdown_timeout`` for running tasks,
hand back the rest as pending, then the services, then unregister and close."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from durq import names, ranges
from durq.brokers.views import WorkerInfo
from durq.child_workflows import DONE_TYPE
from durq.errors import BrokerUnavailableError, ConfigurationError
from durq.observability.logging import TaskSummary
from durq.worker.courtesy import LoopCourtesy
from durq.worker.executor import SHUTDOWN, Executor
from durq.worker.fetcher import Fetcher
from durq.worker.heartbeat import Heartbeat
from durq.worker.hooks import WorkerHooks
from durq.worker.maintenance import Janitor, Promoter, Rescuer
from durq.worker.periodic import PeriodicScheduler
from durq.worker.recycle import MAX_MEMORY_RANGE, MAX_TASKS_RANGE, MemoryWatch
from durq.worker.service import PeriodicService

if TYPE_CHECKING:
    from durq.appview import WorkerView
    from durq.brokers.contract import FullBroker

log = logging.getLogger("durq.worker")


def parse_queues(spec: str | Mapping[str, int] | Sequence[str]) -> dict[str, int]:
    """``"critical=6,default=3,low=1"``, a mapping, or a list of names (weight 1 each)."""
    if isinstance(spec, str):
        out: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, _, weight = part.partition("=")
            try:
                out[names.check_queue(name.strip())] = int(weight) if weight else 1
            except ValueError as exc:
                raise ConfigurationError(f"invalid queue weight in {part!r}") from exc
        spec = out
    elif not isinstance(spec, Mapping):
        spec = {q: 1 for q in spec}
    result = {names.check_queue(q): int(w) for q, w in spec.items()}
    if not result or any(w < 1 for w in result.values()):
        raise ConfigurationError("queues need at least one name, each with a weight >= 1")
    return result


#: The most task slots one worker may run at once (``concurrency``).
MAX_CONCURRENCY = 10_000
#: ``yield_to_requests=True``: claims wait while the loop wakes a short sleep this late (s).
DEFAULT_YIELD_LAG = 0.010


class Worker:
    """Runs the app's handlers for tasks of ``queues``.

    Use ``await worker.run()`` (until SIGTERM/SIGINT), or ``async with worker:`` inside a web
    process (monolith). Options:

    * ``queues``: ``{"critical": 6, "default": 3, "low": 1}`` or ``"critical=6,default=3"``;
      default: every queue named by a registered task, weight 1.
    * ``strict``: empty higher-weight queues first instead of weighted picking.
    * ``concurrency``: attempts at once. ``shutdown_timeout``: grace for running tasks.
    * ``scheduler``: also enqueue the app's periodic tasks (default ``True``; any number of
      workers may do so, each tick is enqueued once).
    * ``lease_seconds``: how long a claim holds without a heartbeat; a dead worker's tasks
      run again after it. ``max_lost``: worker losses before a task is archived.
    * ``max_tasks`` / ``max_memory`` (MB of resident memory): past either, stop claiming,
      let the running tasks end and stop (``run()`` returns): recycling, for a process
      manager or ``durq worker --processes`` to start a fresh process.
    * ``burst``: stop (``run()`` returns) once no task is claimable, due scheduled and retry
      tasks promoted, and none of this worker's runs; tasks due later stay queued.
    * ``yield_to_requests``: for a worker inside a web process (``durq_lifespan`` turns it
      on): no new claims while the event loop it shares with the requests is late (a short
      sleep wakes more than 10 ms late; a number sets that lag in seconds) or the process's
      CPU is saturated; running tasks go on, claims resume once the loop is on time, and a
      hold lasts at most 2 s so work never stops.
    * ``summary_interval``: seconds between INFO lines counting the outcomes of the period
      and the periodic ticks enqueued (each completed task and each tick is logged at DEBUG
      only); ``None`` for none.
    """

    def __init__(
        self,
        app: WorkerView,
        *,
        queues: str | Mapping[str, int] | Sequence[str] | None = None,
        concurrency: int = 10,
        strict: bool = False,
        shutdown_timeout: float = 10.0,
        lease_seconds: float = 30.0,
        heartbeat_interval: float | None = None,
        poll_interval: float = 1.0,
        promote_interval: float = 1.0,
        rescue_interval: float = 5.0,
        janitor_interval: float = 30.0,
        max_lost: int = 3,
        hooks: Sequence[WorkerHooks] = (),
        services: Sequence[PeriodicService] = (),
        scheduler: bool = True,
        summary_interval: float | None = 60.0,
        max_tasks: int | None = None,
        max_memory: float | None = None,
        burst: bool = False,
        yield_to_requests: bool | float = False,
    ) -> None:
        ranges.integer("concurrency", concurrency, 1, MAX_CONCURRENCY)
        ranges.seconds("shutdown_timeout", shutdown_timeout)
        for name, interval in (
            ("lease_seconds", lease_seconds),
            ("poll_interval", poll_interval),
            ("promote_interval", promote_interval),
            ("rescue_interval", rescue_interval),
            ("janitor_interval", janitor_interval),
        ):
            ranges.seconds(name, interval, positive=True)
        if queues is None:
            # Not the queue of durq's own workflow node: it goes to its waiting task's queue.
            theirs = {t.defaults.queue for t in app.tasks.values() if t.type != DONE_TYPE}
            queues = sorted(theirs or {app.default_queue})
        self.app = app
        self.queues = parse_queues(queues)
        self.concurrency = concurrency
        self.strict = strict
        self.shutdown_timeout = shutdown_timeout
        self.lease_seconds = lease_seconds
        self.heartbeat_interval = heartbeat_interval or min(lease_seconds / 3, 2.0)
        self.poll_interval = poll_interval
        self.promote_interval = promote_interval
        self.rescue_interval = rescue_interval
        self.janitor_interval = janitor_interval
        self.max_lost = max_lost
        self.hooks = [*app.worker_hooks, *hooks]
        self.extra_services = list(services)
        #: Run the periodic scheduler (code and stored schedules); see durq.worker.periodic.
        self.scheduler = scheduler
        self.summary_interval = summary_interval
        if max_tasks is not None:
            ranges.integer("max_tasks", max_tasks, *MAX_TASKS_RANGE)
        if max_memory is not None:
            ranges.real("max_memory", max_memory, *MAX_MEMORY_RANGE)
        self.max_tasks = max_tasks
        self.max_memory = max_memory
        self.burst = burst
        #: The loop lag (seconds) past which claims wait, when this worker shares its loop
        #: with a web server (``True``: the default lag); ``None``: off.
        self.yield_lag: float | None = None
        if yield_to_requests is True:
            self.yield_lag = DEFAULT_YIELD_LAG
        elif yield_to_requests is not False:
            self.yield_lag = ranges.seconds(
                "yield_to_requests", yield_to_requests, high=1.0, positive=True
            )
        self._courtesy: LoopCourtesy | None = None
        if scheduler:
            self._check_periodic_handlers()
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.started_at = 0.0
        self.broker: FullBroker | None = None
        #: Whether this worker opened its broker (and so closes it when it stops).
        self._owns_broker = False
        self._executor: Executor | None = None
        self._fetcher: Fetcher | None = None
        self._services: list[PeriodicService] = []
        self._stopped = asyncio.Event()
        self._stopping = False

    def _check_periodic_handlers(self) -> None:
        """Refuse a schedule whose ticks this worker would take but could not run: without
        this each tick would be retried ``max_retry`` times as "no handler"."""
        for entry in self.app.schedules:
            queue = self.app.schedules.params(entry, 0.0).queue
            if entry.type not in self.app.tasks and queue in self.queues:
                raise ConfigurationError(
                    f"periodic entry {entry.name!r} enqueues type {entry.type!r} on queue "
                    f"{queue!r}, which has no handler in this app: declare the handler with "
                    "@app.task, or run this worker without the scheduler (--no-scheduler)"
                )

    def info(self) -> WorkerInfo:
        """This worker as the inspector shows it."""
        return WorkerInfo(
            id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=dict(self.queues),
            concurrency=self.concurrency,
            started_at=self.started_at,
            last_heartbeat=self.app.clock.now(),
            active=len(self._executor.running) if self._executor else 0,
            strict=self.strict,
        )

    async def start(self) -> None:
        """Connect and start every service; returns once the worker is taking tasks."""
        self._stopped.clear()
        self.started_at = self.app.clock.now()
        # One broker per process: handlers that enqueue, and a web app running this worker
        # inside, share the worker's connections instead of opening a second pool.
        broker, self._owns_broker = self.app.worker_broker()
        self.broker = broker
        await broker.connect()
        await self._warn_if_not_durable(broker)
        await broker.register_worker(self.info())
        hooks = list(self.hooks)
        summary: list[PeriodicService] = []
        counts: TaskSummary | None = None
        if self.summary_interval:
            counts = TaskSummary(self.id)
            hooks.append(counts)
            summary.append(counts.service(self.summary_interval))
        self._executor = Executor(
            self.app, broker, concurrency=self.concurrency, worker_id=self.id, hooks=hooks
        )
        self._services = [
            Heartbeat(
                broker,
                self._executor,
                interval=self.heartbeat_interval,
                lease_seconds=self.lease_seconds,
                worker_info=self.info,
            ),
            Rescuer(broker, self.rescue_interval, self.max_lost),
            Promoter(broker, self.promote_interval),
            Janitor(broker, self.janitor_interval, self.app.archived_retention),
            *self.extra_services,
            *summary,
        ]
        # Even without code entries: stored schedules may be added at any time.
        if self.scheduler:
            self._services.append(
                PeriodicScheduler(
                    self.app, broker, on_enqueued=counts.tick_enqueued if counts else None
                )
            )
        if self.yield_lag is not None:
            self._courtesy = LoopCourtesy(self.yield_lag)
            self._courtesy.start()
        self._fetcher = Fetcher(
            broker,
            self._executor,
            queues=self.queues,
            strict=self.strict,
            worker_id=self.id,
            lease_seconds=self.lease_seconds,
            poll_interval=self.poll_interval,
            max_tasks=self.max_tasks,
            burst=self.burst,
            courtesy=self._courtesy,
        )
        if self.max_memory is not None:
            self._services.append(MemoryWatch(self.max_memory, self._fetcher.retire))
        # The fetcher first: its first claim takes the connection opened above instead of
        # waiting behind (or for a new connection beside) the services' first round trips.
        self._fetcher.start()
        for service in self._services:
            service.start()
        log.info(
            "worker %s started: queues=%s concurrency=%d broker=%s",
            self.id,
            ",".join(f"{q}={w}" for q, w in self.queues.items()),
            self.concurrency,
            broker.name,
        )

    async def _warn_if_not_durable(self, broker: FullBroker) -> None:
        """One WARNING line when the broker's server could lose acknowledged tasks
        (docs/guarantees.md)."""
        try:
            problems = await broker.durability_warnings()
        except Exception as exc:  # a check must never stop a worker from starting
            log.debug("durability check failed: %s", exc)
            return
        if problems:
            log.warning(
                "%s broker may lose acknowledged tasks on a server crash: %s "
                "(see docs/guarantees.md)",
                broker.name,
                "; ".join(problems),
            )

    async def stop(self, timeout: float | None = None) -> None:
        """Graceful stop: no new tasks, wait up to ``timeout`` (default
        ``shutdown_timeout``), then cancel the rest and hand them back as pending."""
        if self._stopping:  # e.g. a lifespan exit racing a signal: return once stopped
            await self._stopped.wait()
            return
        self._stopping = True
        grace = self.shutdown_timeout if timeout is None else timeout
        try:
            if self._fetcher is not None:
                await self._fetcher.stop()
            if self._courtesy is not None:
                await self._courtesy.stop()
                if self._courtesy.holds:
                    log.info(
                        "worker %s held its claims %d times, %.1fs in all, for requests",
                        self.id,
                        self._courtesy.holds,
                        self._courtesy.held_seconds,
                    )
                self._courtesy = None
            if self._executor is not None:
                if not await self._executor.drain(grace):
                    log.warning("shutdown: handing unfinished tasks back to the queue")
                    self._executor.cancel_all(SHUTDOWN)
                    await self._executor.drain(None)
                await self._executor.close()
            # Hooks may have work in flight (WorkerHooks.drain): let it finish first.
            for hook in self.hooks:
                await hook.drain()
            for service in reversed(self._services):
                await service.stop()
            if self.broker is not None:
                try:
                    await self.broker.unregister_worker(self.id)
                except Exception as exc:  # the row expires on its own
                    log.warning("could not unregister worker: %s", exc)
                await self._close_broker()
        finally:
            self._stopping = False
            self._stopped.set()
            log.info("worker %s stopped", self.id)

    async def _close_broker(self) -> None:
        broker = self.broker
        if broker is not None and self._owns_broker:
            self.app.release(broker)
            await broker.close()

    async def _finish(self) -> None:
        """The fetcher ended by itself (``max_tasks``, ``max_memory``, ``burst``): let the
        running tasks end, however long they take, then stop."""
        if self._executor is not None:
            await self._executor.drain(None)
        if not self._stopped.is_set():
            await self.stop()

    def stop_now(self) -> None:
        """Second signal: cancel running tasks at once; they are still handed back."""
        if self._executor is not None:
            self._executor.cancel_all(SHUTDOWN)

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def run(
        self, *, install_signal_handlers: bool = True, wait_for_broker: float = 0.0
    ) -> None:
        """Run until SIGTERM/SIGINT (first: graceful; second: at once) or :meth:`stop`.

        ``wait_for_broker``: seconds to keep retrying (with capped backoff) while the broker
        is unreachable at start, e.g. a worker deployed before its database; 0 fails at once."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        stop_task: list[asyncio.Task[None]] = []
        signalled: list[signal.Signals] = []
        give_up = asyncio.Event()
        running = False

        def on_signal(sig: signal.Signals) -> None:
            if not running:  # still starting or waiting for the broker: stop once started
                give_up.set()
                return
            if signalled:
                log.warning("second %s: stopping at once", sig.name)
                self.stop_now()
                return
            signalled.append(sig)
            log.info(
                "%s received: stopping gracefully (grace %.0fs)", sig.name, self.shutdown_timeout
            )
            stop_task.append(asyncio.create_task(self.stop()))

        if install_signal_handlers:
            for sig in signals:
                loop.add_signal_handler(sig, on_signal, sig)
        try:
            if not await self._start_when_reachable(wait_for_broker, give_up):
                return
            if give_up.is_set():  # a signal came while start() was connecting
                await self.stop()
                return
            running = True
            assert self._fetcher is not None
            ended = asyncio.ensure_future(self._fetcher.done.wait())
            stopped = asyncio.ensure_future(self._stopped.wait())
            await asyncio.wait({ended, stopped}, return_when=asyncio.FIRST_COMPLETED)
            ended.cancel()
            if self._fetcher.done.is_set() and not self._stopped.is_set():
                log.info("worker %s: finishing its running tasks, then stopping", self.id)
                stop_task.append(asyncio.create_task(self._finish()))
            await stopped
            for task in stop_task:
                await task
        finally:
            if install_signal_handlers:
                for sig in signals:
                    loop.remove_signal_handler(sig)

    async def _start_when_reachable(self, patience: float, give_up: asyncio.Event) -> bool:
        deadline = asyncio.get_running_loop().time() + patience
        delay = 0.5
        while True:
            try:
                await self.start()
                return True
            except BrokerUnavailableError as exc:
                self.started_at = 0.0
                await self._close_broker()
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    raise
                log.warning("broker unavailable (%s); retrying in %.1fs", exc, min(delay, left))
                try:
                    await asyncio.wait_for(give_up.wait(), min(delay, left))
                    return False
                except TimeoutError:
                    delay = min(delay * 2, 10.0)
