"""A worker a test drives: the app's own executor, acker and housekeeping, one step at a time.

:meth:`TestWorker.drain` is the worker's loop without its waits: housekeeping (promote due
tasks, rescue expired leases, delete expired results, enqueue due periodic ticks), then a
claim, then the claimed attempts run on the real :class:`~durq.worker.executor.Executor`,
which decides every outcome (retry, archive, follow-ups) exactly as in production. It repeats
until a claim comes back empty. Time moves only when the test moves :attr:`TestWorker.clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from durq import codec, lifecycle
from durq import encryption as crypt
from durq.appview import WorkerView
from durq.brokers.params import ClaimParams, CompleteParams, Lease
from durq.brokers.views import WorkerInfo
from durq.clock import Clock, FakeClock
from durq.encryption import Encryption
from durq.errors import ConfigurationError, NotReady, SkipRetry, Snooze, TaskNotFoundError
from durq.inspector import parse_state
from durq.states import TaskState
from durq.sync import SyncRunner
from durq.task import TaskInfo
from durq.worker.acker import Acker
from durq.worker.executor import SHUTDOWN, Executor
from durq.worker.fetcher import queue_order
from durq.worker.hooks import WorkerHooks
from durq.worker.maintenance import Janitor, Promoter, Rescuer
from durq.worker.periodic import PeriodicScheduler
from durq.worker.server import parse_queues

if TYPE_CHECKING:
    from durq.brokers.contract import FullBroker

R = TypeVar("R")


class TestView(WorkerView, Protocol):
    """An app as the testing kit drives it: a worker's view, and rebinding to a test broker
    and clock."""

    @property
    def broker_target(self) -> str | FullBroker: ...
    def new_broker(self) -> FullBroker: ...
    def rebind(
        self, broker: str | FullBroker | None = None, *, clock: Clock | None = None
    ) -> dict[asyncio.AbstractEventLoop, FullBroker]: ...


A = TypeVar("A", bound=TestView)

#: Exceptions a handler raises on purpose: not reported as errors by :meth:`TestWorker.drain`.
EXPECTED = (NotReady, SkipRetry, Snooze)
_PAGE = 1000
#: Retention of completed tasks kept for the test (``keep_completed``): the test worker's
#: lifetime in practice, as the clock is fake; they are deleted when it stops.
KEEP_FOR = 100 * 365 * 86400.0


class DrainLimitError(AssertionError):
    """:meth:`TestWorker.drain` ran ``limit`` attempts and tasks were still due (a task that
    keeps creating work, or one retried at once forever). ``pending`` lists those tasks."""

    def __init__(self, limit: int, pending: Sequence[TaskInfo]) -> None:
        self.limit = limit
        self.pending = list(pending)
        lines = [f"drain stopped after {limit} attempts; still due:"]
        lines += [f"  {_describe(t)}" for t in self.pending[:20]]
        if len(self.pending) > 20:
            lines.append(f"  ... and {len(self.pending) - 20} more")
        super().__init__("\n".join(lines))


class TaskFailedError(AssertionError):
    """Handlers raised while draining (other than ``NotReady``/``SkipRetry``), or a task had
    no handler. The message holds each failed attempt with its traceback; ``attempts`` too."""

    def __init__(self, attempts: Sequence[Attempt]) -> None:
        self.attempts = list(attempts)
        parts = [f"{len(self.attempts)} failed attempt(s) while draining:"]
        for attempt in self.attempts:
            parts.append(
                f"--- {_describe(attempt.task)}: attempt {attempt.number} -> {attempt.outcome}"
            )
            parts.append(attempt.traceback or attempt.message)
        super().__init__("\n".join(parts))


@dataclass(frozen=True)
class Attempt:
    """One attempt the worker ran: the task as claimed, and how it ended."""

    task: TaskInfo
    #: ``completed``, ``retry``, ``archived``, ``requeued`` or ``lost``.
    outcome: str
    #: What the handler raised (``None`` when it returned, or never ran: no handler, a bad
    #: payload); its formatted traceback.
    error: BaseException | None = None
    traceback: str | None = None
    #: The encoded return value of a completed attempt.
    raw_result: bytes | None = None
    #: The error stored with the task when the attempt failed without raising.
    message: str = ""

    @property
    def id(self) -> str:
        return self.task.id

    @property
    def type(self) -> str:
        return self.task.type

    @property
    def number(self) -> int:
        """1 for the first attempt, 2 for the first retry, ..."""
        return self.task.retried + 1

    @property
    def result(self) -> Any:
        """The handler's return value, decoded from what the worker stored."""
        return codec.decode(self.raw_result)

    @property
    def unexpected(self) -> bool:
        """Failed, and not by a ``NotReady``/``SkipRetry`` the handler raised on purpose."""
        return self.outcome in ("retry", "archived") and not isinstance(self.error, EXPECTED)


class Drained(list[Attempt]):
    """What one :meth:`TestWorker.drain` ran, in the order the attempts finished."""

    def of(self, type: str) -> Drained:
        """The attempts of task type ``type``."""
        return Drained(a for a in self if a.type == type)

    @property
    def outcomes(self) -> list[tuple[str, str]]:
        """``[(type, outcome), ...]``: compact to assert on."""
        return [(a.type, a.outcome) for a in self]

    @property
    def errors(self) -> Drained:
        """Failed attempts other than ``NotReady``/``SkipRetry``."""
        return Drained(a for a in self if a.unexpected)


class _Recorder(WorkerHooks):
    """Sees each attempt through the worker's own hooks: the exception as it leaves the
    handler (with its traceback), and the outcome the executor reported."""

    def __init__(self) -> None:
        self.attempts: list[Attempt] = []
        self._errors: dict[int, BaseException] = {}
        self.results: dict[str, bytes | None] = {}
        #: The last traceback per task id, kept across drains.
        self.tracebacks: dict[str, str] = {}

    @contextlib.contextmanager
    def around(self, task: TaskInfo) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            # The worker's own signals (its timeout, a bad payload) are not the handler's
            # errors: the attempt reports the message the worker stored instead.
            if type(exc).__module__ != Executor.__module__:
                self._errors[id(task)] = exc
            raise

    def task_finished(self, task: TaskInfo, outcome: str, duration: float) -> None:
        error = self._errors.pop(id(task), None)
        text = None
        if error is not None and not isinstance(error, EXPECTED):
            text = "".join(traceback.format_exception(error)).rstrip()
            self.tracebacks[task.id] = text
        result = self.results.pop(task.id, None) if outcome == "completed" else None
        self.attempts.append(Attempt(task, outcome, error, text, result))


class _RecordingAcker(Acker):
    """The real acker, noting each completion's result for :attr:`Attempt.result`, and
    keeping tasks that would be deleted on completion (``keep``) for the test to look at."""

    def __init__(
        self, broker: FullBroker, recorder: _Recorder, keep: bool, kept: list[tuple[str, str]]
    ) -> None:
        super().__init__(broker)
        self._recorder = recorder
        #: The app's keys (durq.encryption), to record results as the handler returned them.
        self.encryption: Encryption | None = None
        self._keep = keep
        #: Tasks kept only for the test, deleted when the worker stops.
        self.kept = kept

    def send(self, params: CompleteParams) -> asyncio.Future[bool]:
        # The result as the handler returned it, not as stored (possibly encrypted).
        self._recorder.results[params.lease.id] = crypt.plain(params.result, self.encryption)
        if self._keep and params.retention <= 0:
            params = dataclasses.replace(params, retention=KEEP_FOR)
            self.kept.append((params.lease.queue, params.lease.id))
        return super().send(params)


class TestWorker:
    """A worker a test drives; build it with :func:`worker` (``async with``).

    * ``queues``: as :class:`durq.Worker` (default: every queue of a registered task, and
      the app's default queue).
    * ``concurrency``: attempts run at once within one claim (default 1: a fixed order).
    * ``clock``: the clock to move. Default: the app's own when it is a
      :class:`~durq.clock.FakeClock`; else a new one starting at ``start`` (default: the
      current time), given to the app (and so to its brokers) until the worker exits.
    * ``scheduler``: also enqueue the app's periodic tasks when their tick is due (on the
      fake clock) at each drain. Off by default: a test that does not look at schedules
      sees none of their tasks.
    * ``keep_completed``: a task deleted on completion (``retention=0``) is
      kept as completed, with its result, until the worker exits, so the test can look at
      it; meanwhile its task id stays taken. ``False``: deleted at once, as in production.
    """

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(
        self,
        app: TestView,
        *,
        queues: str | Mapping[str, int] | Sequence[str] | None = None,
        concurrency: int = 1,
        clock: FakeClock | None = None,
        start: float | None = None,
        lease_seconds: float = 30.0,
        max_lost: int = 3,
        scheduler: bool = False,
        keep_completed: bool = True,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError("concurrency must be >= 1")
        if queues is None:
            queues = sorted({t.defaults.queue for t in app.tasks.values()} | {app.default_queue})
        self.app = app
        self.queues = parse_queues(queues)
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.max_lost = max_lost
        self.id = f"test:{uuid.uuid4().hex[:8]}"
        if clock is None and isinstance(app.clock, FakeClock):
            clock = app.clock
        #: The clock of the app and its brokers while the worker runs: move it to make
        #: scheduled tasks, retries and periodic ticks due.
        # A whole second: stored times pass through datetimes (microseconds), and a due
        # time must compare equal to the clock it was read from.
        self.clock: FakeClock = clock or FakeClock(
            float(int(time.time())) if start is None else start
        )
        self._scheduler_wanted = scheduler
        self._keep = keep_completed
        self._kept: list[tuple[str, str]] = []
        self._restore: Any = None
        self._recorder = _Recorder()
        self._broker: FullBroker | None = None
        self._executor: Executor | None = None
        self._services: list[Promoter | Rescuer | Janitor | PeriodicScheduler] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> TestWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Give the app the clock, connect, and get ready to run tasks (no background task)."""
        await _close_own(self._bind_clock())
        await self._open()

    async def stop(self) -> None:
        """Hand back anything still running, close the broker, give the app its clock back."""
        home = self._loop
        if home is None or home is asyncio.get_running_loop():
            await self._close()
        elif home.is_running():  # started on another thread's loop: closed there
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._close(), home))
        else:  # its loop is gone, and its connections with it
            self._drop()
        await _close_own(self._unbind_clock())

    def _bind_clock(self) -> dict[asyncio.AbstractEventLoop, FullBroker]:
        if self.app.clock is self.clock:
            return {}
        if not isinstance(self.app.broker_target, str):
            raise ConfigurationError(
                "the app was given a broker object: build it with the test's clock "
                "(clock=FakeClock()) and give the app the same clock"
            )
        self._restore = self.app.clock
        # Brokers read the clock they were built with: the app's must be rebuilt.
        return self.app.rebind(clock=self.clock)

    def _unbind_clock(self) -> dict[asyncio.AbstractEventLoop, FullBroker]:
        if self._restore is None:
            return {}
        restore, self._restore = self._restore, None
        return self.app.rebind(clock=restore)

    async def _open(self) -> None:
        self._loop = asyncio.get_running_loop()
        broker = self._broker = self.app.new_broker()
        await broker.connect()
        now = self.clock.now()
        await broker.register_worker(
            WorkerInfo(self.id, "test", 0, dict(self.queues), self.concurrency, now, now)
        )
        hooks = [*self.app.worker_hooks, self._recorder]
        executor = Executor(
            self.app, broker, concurrency=self.concurrency, worker_id=self.id, hooks=hooks
        )
        executor.acker = _RecordingAcker(broker, self._recorder, self._keep, self._kept)
        executor.acker.encryption = self.app.encryption
        self._executor = executor
        self._services = [
            Promoter(broker, 0),
            Rescuer(broker, 0, self.max_lost),
            Janitor(broker, 0, self.app.archived_retention),
        ]
        if self._scheduler_wanted and len(self.app.schedules):
            self._services.append(PeriodicScheduler(self.app, broker))

    async def _close(self) -> None:
        executor, broker = self._executor, self._broker
        self._executor = self._broker = None
        if executor is not None:
            executor.cancel_all(SHUTDOWN)
            await executor.drain(None)
            await executor.close()
            for hook in executor.hooks:
                await hook.drain()
        if broker is not None:
            kept, self._kept[:] = list(self._kept), []
            for queue, task_id in kept:
                with contextlib.suppress(Exception):  # gone, or run again meanwhile
                    await lifecycle.delete_task(broker.admin, queue, task_id)
            with contextlib.suppress(Exception):
                await broker.unregister_worker(self.id)
            if broker is not self.app.broker_target:
                await broker.close()

    async def _call(self, make: Callable[[], Coroutine[Any, Any, R]]) -> R:
        """Run ``make()`` where the worker lives, from whatever loop or thread calls it.

        The worker's broker connections belong to the loop it started on. Called from another
        loop while that one runs (a test client's thread, a sync face), the call runs there;
        when that loop is gone (a finished test's, a closed portal), the worker starts again
        on the caller's loop. Not started yet (the pytest fixture, which has no loop of its
        own): it starts on the caller's loop."""
        home = self._loop
        if home is not None and home is not asyncio.get_running_loop():
            if home.is_running():
                return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(), home))
            self._drop()
        if self._broker is None:
            await self.start()
        return await make()

    def _running(self) -> tuple[FullBroker, Executor]:
        assert self._broker is not None and self._executor is not None, "not started"
        return self._broker, self._executor

    def _drop(self) -> None:
        """Forget the broker and executor of a loop that is gone, without closing them (their
        connections went with the loop). Tracebacks and kept tasks stay."""
        if self._executor is not None:
            self._executor.cancel_all(SHUTDOWN)
            self._executor.close_threads()
        self._executor = self._broker = None
        self._loop = None

    def close_nowait(self) -> None:
        """Stop without an event loop (a sync fixture's teardown, after the test's loop is
        gone): drop the broker unclosed and give the app its clock back. Enough for an
        in-memory broker; with another, prefer ``async with``."""
        self._drop()
        self._unbind_clock()

    # -- driving -----------------------------------------------------------------------------

    async def drain(self, *, limit: int = 1000, raise_errors: bool = True) -> Drained:
        """Run every task that is due, and the tasks they create, until nothing is due.

        Returns the attempts that ran. Raises :class:`TaskFailedError` (after draining) when
        a handler raised anything but ``NotReady``/``SkipRetry`` (``raise_errors=False``
        to look at failures yourself), and :class:`DrainLimitError` when ``limit`` attempts
        ran and tasks are still due."""
        return await self._call(lambda: self._drain(limit, raise_errors))

    async def _drain(self, limit: int, raise_errors: bool) -> Drained:
        broker, executor = self._running()
        self._recorder.attempts.clear()
        order = queue_order(self.queues, True, random.Random(0))
        while True:
            for service in self._services:
                await service.tick()
            ran = len(self._recorder.attempts)
            want = min(executor.free_slots, limit - ran)
            leases = await broker.claim(
                ClaimParams(order, max(want, 1), self.id, self.lease_seconds)
            )
            if not leases:
                break
            if want <= 0:
                await self._hand_back(broker, leases)
                raise DrainLimitError(limit, await self._due())
            for lease in leases:
                executor.submit(lease)
            await executor.drain(None)
        attempts = Drained([await self._with_message(a) for a in self._recorder.attempts])
        self._recorder.attempts.clear()
        if raise_errors and attempts.errors:
            raise TaskFailedError(attempts.errors)
        return attempts

    async def _hand_back(self, broker: FullBroker, leases: list[Lease]) -> None:
        for lease in leases:
            await broker.requeue(lifecycle.handed_back(lease), keep=lifecycle.keeps_key(lease.task))

    async def _with_message(self, attempt: Attempt) -> Attempt:
        """A failed attempt gets the error the worker stored, so the report says why even
        when the handler raised nothing (no handler, bad payload, timeout)."""
        if not attempt.unexpected:
            return attempt
        if attempt.error is not None:
            exc = attempt.error
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return dataclasses.replace(attempt, message=text)
        broker, _ = self._running()
        try:
            stored = await broker.admin.get_task(attempt.task.queue, attempt.task.id)
        except TaskNotFoundError:
            return attempt
        return dataclasses.replace(attempt, message=stored.last_error or "")

    async def due(self) -> list[TaskInfo]:
        """Tasks of the served queues that a claim would take now (paused queues aside)."""
        return await self._call(self._due)

    async def _due(self) -> list[TaskInfo]:
        now = self.clock.now()
        waiting = (TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY)
        return [
            t
            for t in await self._tasks(None, None, waiting)
            if t.queue in self.queues
            and (t.next_process_at is None or t.next_process_at.timestamp() <= now + 1e-3)
        ]

    # -- looking -----------------------------------------------------------------------------

    async def tasks(
        self,
        *,
        type: str | None = None,
        queue: str | None = None,
        state: TaskState | str | Sequence[TaskState | str] | None = None,
    ) -> list[TaskInfo]:
        """Tasks in the broker, by queue, then state, then the inspector's order.

        ``state``: one state or several; completed tasks show while retained."""
        return await self._call(lambda: self._tasks(type, queue, state))

    async def _tasks(
        self,
        type: str | None,
        queue: str | None,
        state: TaskState | str | Sequence[TaskState | str] | None,
    ) -> list[TaskInfo]:
        broker, _ = self._running()
        if queue is not None:
            queues = [queue]
        else:
            queues = [q.name for q in await broker.admin.list_queues()]
        if state is None:
            states = list(TaskState)
        elif isinstance(state, TaskState | str):
            states = [parse_state(state)]
        else:
            states = [parse_state(s) for s in state]
        found: list[TaskInfo] = []
        for name in queues:
            for st in states:
                offset = 0
                while True:
                    page = await broker.admin.list_tasks(name, st, limit=_PAGE, offset=offset)
                    found.extend(t for t in page if type is None or t.type == type)
                    if len(page) < _PAGE:
                        break
                    offset += _PAGE
        return found

    async def get(self, task: TaskInfo | str, queue: str | None = None) -> TaskInfo:
        """A task as stored now: pass a :class:`TaskInfo` or an id (and its queue)."""
        if isinstance(task, TaskInfo):
            where, task_id = task.queue, task.id
        else:
            where, task_id = queue or self.app.default_queue, task

        async def get() -> TaskInfo:
            return await self._running()[0].admin.get_task(where, task_id)

        return await self._call(get)

    def traceback(self, task: TaskInfo | str) -> str | None:
        """The traceback of the last attempt of ``task`` that raised, from any drain."""
        task_id = task.id if isinstance(task, TaskInfo) else task
        return self._recorder.tracebacks.get(task_id)

    def advance(self, by: float | str | timedelta) -> None:
        """Shorthand for ``clock.advance(by)``."""
        self.clock.advance(by)


def worker(app: TestView, **options: Any) -> TestWorker:
    """A :class:`TestWorker` for ``app``: ``async with durq.testing.worker(app) as w:``."""
    return TestWorker(app, **options)


async def _close_own(dropped: dict[asyncio.AbstractEventLoop, FullBroker]) -> None:
    """Close the dropped broker of the running loop; those of other loops die with them."""
    broker = dropped.get(asyncio.get_running_loop())
    if broker is not None:
        await broker.close()


def _describe(task: TaskInfo) -> str:
    when = "" if task.next_process_at is None else f" due {task.next_process_at:%H:%M:%S}"
    error = f" last error {task.last_error!r}" if task.last_error else ""
    return f"{task.type} {task.id} (queue {task.queue}, {task.state.value}{when}{error})"


class SyncTestWorker:
    """The blocking twin of :class:`TestWorker`, for WSGI/Django tests and test clients that
    run the app on a thread of their own (Starlette's ``TestClient``): the worker lives on a
    private event loop thread, so any thread may call it, at any time between ``with`` and
    its end, whatever the app's sync face or a lifespan opens and closes meanwhile. Build it
    with :func:`worker_sync` (``with``)."""

    __test__ = False

    def __init__(self, app: TestView, **options: Any) -> None:
        self.app = app
        self.worker = TestWorker(app, **options)
        self._runner: SyncRunner | None = None

    @property
    def clock(self) -> FakeClock:
        """As :attr:`TestWorker.clock`."""
        return self.worker.clock

    def __enter__(self) -> SyncTestWorker:
        self.worker._bind_clock()  # from this thread: it closes the sync face's broker
        self._runner = SyncRunner()
        try:
            self._runner.run(self.worker._open)
        except BaseException:
            self._runner.close()
            self._runner = None
            self.worker._unbind_clock()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._run(self.worker._close)
        finally:
            if self._runner is not None:
                self._runner.close()
                self._runner = None
            self.worker._unbind_clock()

    def _run(self, make: Callable[[], Awaitable[R]]) -> R:
        if self._runner is None:
            raise RuntimeError("the sync test worker runs inside its with block only")
        return self._runner.run(make)

    def drain(self, *, limit: int = 1000, raise_errors: bool = True) -> Drained:
        """As :meth:`TestWorker.drain`."""
        return self._run(lambda: self.worker.drain(limit=limit, raise_errors=raise_errors))

    def tasks(self, **filters: Any) -> list[TaskInfo]:
        """As :meth:`TestWorker.tasks`."""
        return self._run(lambda: self.worker.tasks(**filters))

    def get(self, task: TaskInfo | str, queue: str | None = None) -> TaskInfo:
        """As :meth:`TestWorker.get`."""
        return self._run(lambda: self.worker.get(task, queue))

    def traceback(self, task: TaskInfo | str) -> str | None:
        """As :meth:`TestWorker.traceback`."""
        return self.worker.traceback(task)

    def advance(self, by: float | str | timedelta) -> None:
        """Shorthand for ``clock.advance(by)``."""
        self.clock.advance(by)


def worker_sync(app: TestView, **options: Any) -> SyncTestWorker:
    """A :class:`SyncTestWorker` for ``app``: ``with durq.testing.worker_sync(app) as w:``."""
    return SyncTestWorker(app, **options)


def drain_sync(app: TestView, **options: Any) -> Drained:
    """Run what is due now on ``app``'s broker and return it: one blocking call for a WSGI
    test that does not move time. Options as :meth:`TestWorker.drain` (``limit``,
    ``raise_errors``) and :class:`TestWorker`."""
    drain_options = {k: options.pop(k) for k in ("limit", "raise_errors") if k in options}
    with worker_sync(app, **options) as w:
        return w.drain(**drain_options)


@contextlib.contextmanager
def in_memory(app: A, *, clock: FakeClock | None = None, start: float | None = None) -> Iterator[A]:
    """Point ``app`` at a fresh in-memory broker of its own and a fake clock for the block,
    then give it back its broker and clock: your app, isolated, in a unit test.

    ``clock``/``start``: as :class:`TestWorker` (a worker on the app then uses this clock)."""
    target, before = app.broker_target, app.clock
    clock = clock or FakeClock(float(int(time.time())) if start is None else start)
    # Unclosed brokers are dropped: memory brokers hold nothing to release.
    app.rebind(f"memory://test-{uuid.uuid4().hex}", clock=clock)
    try:
        yield app
    finally:
        app.rebind(target, clock=before)
