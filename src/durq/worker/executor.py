"""Runs claimed tasks in slot tasks, sync handlers in threads (W2).

A slot task runs attempts one after another while leases wait for one: a busy worker starts
no asyncio task per attempt. It ends when none waits, or after an attempt that was cancelled
or changed its context variables, so that neither reaches the next attempt (each starts as
it would in a task of its own).

Every attempt ends in exactly one broker call named by its lease (fencing, W1): complete,
retry, archive, or requeue on shutdown. A lease lost to another worker ends in none."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from durq import codec, durations, groups, lifecycle, workflows
from durq import encryption as crypt
from durq.backoff import exponential
from durq.brokers.base import (
    ArchiveParams,
    CompleteParams,
    FullBroker,
    Lease,
    LeaseRef,
)
from durq.errors import (
    BrokerUnavailableError,
    EncryptionError,
    NotReady,
    PayloadError,
    SkipRetry,
    Sleeping,
    Snooze,
)
from durq.options import DEFAULT_MAX_SNOOZES
from durq.payloads import build
from durq.steps import sleeps_in
from durq.task import TaskContext, TaskInfo
from durq.worker import frames
from durq.worker.acker import Acker
from durq.worker.hooks import WorkerHooks
from durq.worker.reports import AttemptReports, LazyReports
from durq.worker.steps import AttemptSteps, step_writer

if TYPE_CHECKING:
    from durq.appview import WorkerView
    from durq.taskdef import TaskDef

log = logging.getLogger("durq.worker")

# Why a running attempt was cancelled from outside; each reason ends the attempt differently.
SHUTDOWN, CANCELLED, LOST = "shutdown", "cancelled", "lost"
# Delays between attempts to report an outcome while the broker is unreachable.
_ACK_DELAYS = (0.05, 0.2, 0.5, 1.0, 2.0, 4.0)
#: Each try of a report and the pause after it (none after the last).
_ACK_TRIES = (*_ACK_DELAYS, None)
#: Longest ``last_error`` stored: an exception may carry a whole response body, and the error
#: also travels in follow-up and webhook payloads, which have a size limit.
MAX_ERROR = 4096


#: Longest traceback stored: the start (the outer exceptions of the chain) and the end (the
#: frames that raised) are kept, the middle is cut.
MAX_TRACEBACK = 16384


def format_traceback(exc: BaseException | None) -> str | None:
    """``exc``'s traceback with its chain (``raise ... from``, and during handling), without
    durq's own frames (the executor, its thread pool, asyncio), bounded by
    :data:`MAX_TRACEBACK` and made storable (:func:`durq.codec.storable_text`); ``None``
    for outcomes that are not crashes."""
    if exc is None or isinstance(exc, NotReady | _NoHandler):
        return None
    text = codec.storable_text(frames.format_exception(exc))
    if len(text) <= MAX_TRACEBACK:
        return text
    head, tail = MAX_TRACEBACK // 4, MAX_TRACEBACK * 3 // 4
    cut = len(text) - head - tail
    return f"{text[:head]}\n… ({cut} characters cut) …\n{text[-tail:]}"


def clip_error(error: str) -> str:
    """``error`` made storable (:func:`durq.codec.storable_text`: it may echo user input
    holding a NUL or a lone surrogate) and cut to :data:`MAX_ERROR` characters, saying so."""
    error = codec.storable_text(error)
    if len(error) <= MAX_ERROR:
        return error
    return error[: MAX_ERROR - 30] + f"… ({len(error)} characters)"


class _NoHandler(Exception):
    pass


@dataclass(slots=True)
class Running:
    lease: Lease
    #: The slot task the attempt runs in; ``None`` while the lease waits for one.
    task: asyncio.Task[None] | None = None
    reason: str | None = None
    #: The handler has returned; its outcome is being reported and must not be interrupted.
    settling: bool = False
    #: Its completion is stored: the slot is free, though the attempt ends a moment later.
    stored: bool = False


class Executor:
    """Owns the worker's slots and the attempts that fill them."""

    def __init__(
        self,
        app: WorkerView,
        broker: FullBroker,
        *,
        concurrency: int,
        worker_id: str,
        hooks: list[WorkerHooks],
    ) -> None:
        self.app = app
        self.broker = broker
        self.concurrency = concurrency
        self.worker_id = worker_id
        self.hooks = hooks
        # Only the hooks that wrap the handler call: most do not, and an ExitStack per
        # attempt for nothing was a measurable part of a small task's cost.
        self._wrapping = [h for h in hooks if _overrides(h, "around")]
        self._starting = [h for h in hooks if _overrides(h, "task_started")]
        self._finishing = [h for h in hooks if _overrides(h, "task_finished")]
        self._watching = [h for h in hooks if _overrides(h, "busy_changed")]
        #: Keyed by lease, not task: a task may be claimed again before its last attempt's
        #: done-callback ran (a retry due at once), and the two must not share an entry.
        self.running: dict[LeaseRef, Running] = {}
        #: Attempts in ``running`` whose handler returned (waiting for their ack).
        self._settling = 0
        #: Attempts in ``running`` whose completion the broker stored.
        self._stored = 0
        self.slot_freed = asyncio.Event()
        #: Leases submitted and not yet taken by a slot task, in claim order.
        self._waiting: deque[Running] = deque()
        #: The slot tasks alive.
        self._slots: set[asyncio.Task[None]] = set()
        self.acker = Acker(broker, on_waiting=self.slot_freed.set, on_stored=self._completed)
        #: The progress reports of attempts whose handler takes a TaskContext.
        self._reports: dict[LeaseRef, LazyReports] = {}
        #: The durable steps that running attempts record, written together.
        self._steps = step_writer(broker)
        self._child_workflows = app.child_workflows
        self._threads = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="durq-task")

    @property
    def free_slots(self) -> int:
        # A slot is a lease this worker holds: a running handler, or one that returned and
        # whose outcome is not yet acknowledged. Counting the latter bounds what a SIGKILL
        # makes run again to ``concurrency`` tasks (docs/guarantees.md).
        return self.concurrency - len(self.running) + self._stored

    def leases(self) -> list[LeaseRef]:
        return [r.lease.ref for r in self.running.values()]

    def submit(self, lease: Lease) -> None:
        running = self.running[lease.ref] = Running(lease)
        self._waiting.append(running)
        self._add_slots()
        if self._watching:
            self._busy_changed()

    def _add_slots(self, context: contextvars.Context | None = None) -> None:
        """Start slot tasks until every attempt not yet stored has one, counting those of
        stored attempts, which take the next waiting lease a loop turn later: so a waiting
        lease never waits for a handler that runs on. ``context``: the new tasks' (default:
        a copy of the caller's, as a task of its own per attempt had)."""
        while self._waiting and len(self._slots) < len(self.running) - self._stored:
            slot = asyncio.create_task(self._slot(), name="durq-slot", context=context)
            self._slots.add(slot)

    async def _slot(self) -> None:
        """Run waiting attempts one after another, each as its own task would."""
        me = asyncio.current_task()
        assert me is not None
        base = contextvars.copy_context()
        try:
            while self._waiting:
                running = self._waiting.popleft()
                running.task = me
                try:
                    await self._attempt(running)
                finally:
                    self._release(running.lease.ref)
                if me.cancelling() or _changed(base):
                    # A cancel aimed at that attempt (even one not delivered yet), or context
                    # variables its handler set, must not reach the next attempt.
                    break
        finally:
            self._slots.discard(me)
        self._add_slots(base)  # in the context this one started with, not the one it ends in

    def _completed(self, acks: Sequence[CompleteParams]) -> None:
        """The broker stored these completions: their slots are free at once, without
        waiting a loop turn or two for their attempts to end."""
        for params in acks:
            running = self.running.get(params.lease)
            if running is not None and not running.stored:
                running.stored = True
                self._stored += 1
        self.slot_freed.set()

    def _release(self, key: LeaseRef) -> None:
        running = self.running.pop(key, None)
        self.slot_freed.set()
        if running is not None and running.stored:
            self._stored -= 1
        if running is not None and running.settling:
            self._settling -= 1
        else:
            self._busy_changed()

    def _busy_changed(self) -> None:
        for hook in self._watching:
            hook.busy_changed(len(self.running) - self._settling, self.concurrency)

    def cancel(self, task_id: str, reason: str, *, tokens: Collection[str] | None = None) -> bool:
        """Cancel running attempts of ``task_id`` for ``reason`` (lost, cancelled, shutdown).

        ``tokens``: only attempts holding one of these leases (a heartbeat's answer is about
        the leases it sent, not about a later claim of the same task by this worker).
        An attempt whose handler already returned is being settled and is left alone: a
        heartbeat racing with its ack reports it "lost" although it is simply done."""
        hit = False
        for ref, running in list(self.running.items()):
            if tokens is not None and running.lease.token not in tokens:
                continue
            if ref.id == task_id and running.reason is None and not running.settling:
                self._interrupt(running, reason)
                hit = True
        return hit

    def cancel_all(self, reason: str) -> None:
        for running in list(self.running.values()):
            if running.reason is None and not running.settling:
                self._interrupt(running, reason)

    @staticmethod
    def _interrupt(running: Running, reason: str) -> None:
        running.reason = reason
        # A lease still waiting for its slot is settled by its reason when a slot takes it.
        if running.task is not None:
            running.task.cancel()

    async def drain(self, timeout: float | None) -> bool:
        """Wait for running attempts; ``True`` if all finished within ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        # A slot task that ends early (a cancelled attempt) hands what waits to a new one.
        while self._slots:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            _, pending = await asyncio.wait(set(self._slots), timeout=left)
            if pending:
                return False
        return not self.running

    async def close(self) -> None:
        self.close_threads()

    def close_threads(self) -> None:
        """Let the threads of sync handlers go (they finish what runs; nothing new starts)."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    # -- one attempt ------------------------------------------------------------------------

    async def _attempt(self, running: Running) -> None:
        lease = running.lease
        task = lease.task
        started = time.perf_counter()
        for hook in self._starting:
            hook.task_started(task)
        outcome = "lost"
        try:
            if running.reason is not None:  # cancelled while it waited for its slot
                outcome = await self._settle_cancelled(lease, running.reason)
            else:
                outcome = await self._run_and_settle(running)
        except asyncio.CancelledError:
            await self._end_reports(lease.ref)
            outcome = await self._settle_cancelled(lease, running.reason)
        except Exception:  # a bug in settling must not kill the worker; the lease will expire
            log.exception(
                "could not settle task %s: it stays active until its lease expires",
                task.id,
                extra=_extra(task),
            )
        finally:
            duration = time.perf_counter() - started
            for hook in self._finishing:
                hook.task_finished(task, outcome, duration)

    async def _run_and_settle(self, running: Running) -> str:
        lease = running.lease
        task = lease.task
        task_def = self.app.tasks.get(task.type)
        try:
            if task_def is None:
                self._mark_settling(running)
                raise _NoHandler(f'no handler for type "{task.type}"')
            dependencies: dict[str, Any] = {}
            if workflows.HEADER in task.headers:
                # A workflow node: its dependencies' results, or not run (on_failure).
                gate = await workflows.gate(self.broker.admin, task, self.app.encryption)
                if gate.stop is not None:
                    self._mark_settling(running)
                    return await self._archive(lease, gate.stop, alert=False)
                dependencies = gate.dependencies
            try:
                result = await self._call(task_def, task, lease.ref, dependencies)
            finally:
                self._mark_settling(running)
                if self._reports:  # only attempts whose handler takes a context
                    await self._end_reports(lease.ref)
            encoded = codec.encode_result(result, max_bytes=self.app.max_result)
            if encoded is not None and self.app.encryption is not None:
                encoded = self.app.encryption.seal(encoded)
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if current is None or current.cancelling():
                raise  # this attempt was cancelled (lost, cancelled, shutdown)
            # Raised by the handler itself (it awaited something cancelled elsewhere): an
            # ordinary failure, not an attempt left active until its lease expires.
            return await self._failed(lease, task_def, "CancelledError", exc)
        except SkipRetry as exc:
            return await self._archive(lease, exc.reason, alert=exc.alert, exc=exc)
        except Snooze as exc:
            return await self._snoozed(lease, task_def, exc)
        except Sleeping as exc:
            return await self._slept(lease, exc)
        except _TimedOut:
            return await self._failed(lease, task_def, self._timeout_message(task), None)
        except _Undecodable as exc:
            return await self._archive(lease, str(exc), alert=True)
        except NotReady as exc:
            return await self._failed(lease, task_def, exc.reason, exc)
        except _NoHandler as exc:
            return await self._failed(lease, None, str(exc), exc)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return await self._failed(lease, task_def, message, exc)
        params = lifecycle.completed(
            lease, encoded, now=self.app.clock.now(), max_payload=self.app.max_payload
        )
        try:
            # The first try awaits the ack's own future here rather than in _report's
            # coroutine (one less per task); an outage goes on with _report's later tries.
            try:
                held = await self.acker.send(params)
            except BrokerUnavailableError:
                await asyncio.sleep(_ACK_DELAYS[0])
                held = await self._report(self.acker.send, params, task, _ACK_TRIES[1:])
            else:
                if not held:
                    _dropped(task)
        except Exception:  # refused, not unreachable: _report waits out outages
            return await self._complete_alone(lease, task_def, params)
        if held:
            # DEBUG: a line per task costs more than a small task; a periodic INFO summary
            # (durq.observability.logging.TaskSummary) counts them instead.
            if log.isEnabledFor(logging.DEBUG):
                log.debug("task %s completed", task.id, extra=_extra(task))
            return "completed"
        return "lost"

    async def _complete_alone(
        self, lease: Lease, task_def: TaskDef[Any, Any] | None, params: CompleteParams
    ) -> str:
        """The broker refused the batch this completion rode in: send it alone, so that one
        refused completion does not fail the others. Refused alone too, the attempt fails
        with the broker's error (recorded, by the retry policy) rather than leaving the task
        active until its lease expires."""
        task = lease.task
        try:
            held = await self._report(self.broker.complete, params, task)
        except Exception as exc:
            log.error(
                "task %s: the broker refused to store its result (%s)",
                task.id,
                exc,
                extra=_extra(task),
            )
            return await self._failed(
                lease, task_def, f"result not stored: {type(exc).__name__}: {exc}", None
            )
        return "completed" if held else "lost"

    def _mark_settling(self, running: Running) -> None:
        if running.reason is None and not running.settling:
            running.settling = True
            self._settling += 1
            if self._watching:
                self._busy_changed()

    def _call(
        self,
        task_def: TaskDef[Any, Any],
        task: TaskInfo,
        ref: LeaseRef,
        dependencies: dict[str, Any],
    ) -> Awaitable[Any]:
        """The handler's call to await, its arguments decoded (``_Undecodable`` raised here).
        Most tasks get the handler's own coroutine: no layer of the executor's around it."""
        size = len(task.raw_payload)
        # A group's follow-up and a sealed payload may be larger than max_payload, never
        # smaller: their own limit is worked out only for a payload over it.
        if size > self.app.max_payload and size > (limit := self._payload_limit(task)):
            # Only storage written behind the client's back gets here (enqueue refuses it;
            # a group's follow-up is bounded by its size); decoding it could cost seconds
            # and memory on every attempt.
            raise _Undecodable(f"payload decode error: {size} bytes, over the limit of {limit}")
        try:
            data = crypt.decode_payload(task.raw_payload, self.app.encryption)
        except EncryptionError as exc:
            # Retrying cannot bring a key back: archived with the reason, not retried forever.
            raise _Undecodable(f"payload decryption error: {exc.message}") from exc
        except ValueError as exc:
            raise _Undecodable(f"payload decode error: {exc}") from exc
        shape = task_def.shape
        args: list[Any] = []
        if shape.takes_payload:
            if shape.model is not None:
                try:
                    args.append(build(shape.model, data))
                except PayloadError as exc:
                    raise _Undecodable(f"payload decode error: {exc}") from exc
            else:
                args.append(data)
        if shape.wants_context:
            args.append(self._context(task, ref, dependencies))
        if not self._wrapping:
            if task_def.is_async and not task.timeout and task.deadline is None:
                handler: Awaitable[Any] = task_def.fn(*args)  # most: no hook, no budget
                return handler
            return self._bounded(task_def, task, args)
        return self._wrapped(task_def, task, args)

    async def _wrapped(self, task_def: TaskDef[Any, Any], task: TaskInfo, args: list[Any]) -> Any:
        """The handler's call inside the hooks that wrap it."""
        with contextlib.ExitStack() as stack:
            for hook in self._wrapping:
                stack.enter_context(hook.around(task))
            return await self._bounded(task_def, task, args)

    def _payload_limit(self, task: TaskInfo) -> int:
        limit = groups.payload_limit(task, self.app.max_payload)
        if crypt.sealed(task.raw_payload):
            limit = crypt.max_sealed(limit)  # the limit is the plain payload's
        return limit

    async def _bounded(self, task_def: TaskDef[Any, Any], task: TaskInfo, args: list[Any]) -> Any:
        """The handler's call within its budget (W3)."""
        if not task.timeout and task.deadline is None:
            # Most tasks: skip the timeout machinery on the hot path.
            return await self._invoke(task_def, args)
        budget = self._budget(task)
        assert budget is not None
        scope = asyncio.timeout(budget)
        try:
            async with scope:
                return await self._invoke(task_def, args)
        except TimeoutError:
            # Only our own budget is W3; a TimeoutError of the handler's own I/O is an
            # ordinary failure with its own message.
            if scope.expired():
                raise _TimedOut from None
            raise

    async def _invoke(self, task_def: TaskDef[Any, Any], args: list[Any]) -> Any:
        if task_def.is_async:
            return await task_def.fn(*args)
        # Copy context so trace spans and log context follow into the thread.
        ctx = contextvars.copy_context()
        call: Callable[[], Any] = functools.partial(ctx.run, task_def.fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._threads, call)

    def _context(self, task: TaskInfo, ref: LeaseRef, dependencies: dict[str, Any]) -> TaskContext:
        loop = asyncio.get_running_loop()
        attempt = task.retried + 1
        # Built on the first report only: most handlers that take a context never report.
        reports = LazyReports(
            functools.partial(AttemptReports, self.broker, ref, attempt, self.app.clock, loop)
        )
        self._reports[ref] = reports
        steps = AttemptSteps(
            self.broker,
            ref,
            attempt,
            self.app.clock,
            loop,
            self.app.max_result,
            self.app.encryption,
            recorded=task.steps,  # the claim's: no read at the first step
            write=self._steps.send,
        )
        return TaskContext(
            id=task.id,
            queue=task.queue,
            type=task.type,
            retried=task.retried,
            max_retry=task.max_retry,
            deadline=task.deadline,
            headers=dict(task.headers),
            worker_id=self.worker_id,
            reports=reports,
            steps=steps,
            dependencies=dependencies,
            workflows=self._child_workflows,
        )

    async def _end_reports(self, ref: LeaseRef) -> None:
        """Write what the attempt reported last, before its outcome ends the lease."""
        reports = self._reports.pop(ref, None)
        if reports is None:
            return
        try:
            await reports.close()
        except Exception:  # progress is best effort: never the attempt's outcome
            log.exception("task %s: could not store its last progress", ref.id)

    def _budget(self, task: TaskInfo) -> float | None:
        """Seconds this attempt may run: the smaller of timeout and time to deadline (W3)."""
        limits = []
        if task.timeout:
            limits.append(task.timeout)
        if task.deadline is not None:
            limits.append(max(0.0, task.deadline.timestamp() - self.app.clock.now()))
        return min(limits) if limits else None

    def _timeout_message(self, task: TaskInfo) -> str:
        if not task.timeout or (
            task.deadline is not None and task.deadline.timestamp() <= self.app.clock.now()
        ):
            return "deadline exceeded"
        return f"timeout after {task.timeout:g}s"

    async def _failed(
        self,
        lease: Lease,
        task_def: TaskDef[Any, Any] | None,
        error: str,
        exc: BaseException | None,
    ) -> str:
        error = clip_error(error)
        task = lease.task

        def delay() -> float:
            if task_def is not None:
                return task_def.retry_delay(task.retried, exc or Exception(error))
            return exponential(task.retried)

        now = self.app.clock.now()
        params = lifecycle.failed(
            lease, error, now=now, delay=delay, max_payload=self.app.max_payload
        )
        tb = format_traceback(exc)
        if isinstance(params, ArchiveParams):
            return await self._archived(lease, replace(params, traceback=tb), alert=True, exc=exc)
        params = replace(params, traceback=tb)
        delay_s = params.delay
        if not await self._report(self.broker.retry, params, task):
            return "lost"
        level = logging.INFO if isinstance(exc, NotReady) else logging.WARNING
        # The traceback is logged on a task's first failure only, not on every retry.
        log.log(
            level,
            "task %s will retry in %.1fs: %s",
            task.id,
            delay_s,
            error,
            exc_info=exc if tb is not None and task.retried == 0 else None,
            extra=_extra(task),
        )
        return "retry"

    async def _snoozed(self, lease: Lease, task_def: TaskDef[Any, Any] | None, exc: Snooze) -> str:
        """The handler snoozed: scheduled again without counting an attempt, or archived
        past its type's ``max_snoozes``."""
        task = lease.task
        try:
            delay = durations.seconds(exc.delay) or 0.0
        except ValueError as err:
            return await self._failed(lease, task_def, f"invalid snooze delay: {err}", None)
        snoozes = await self.broker.read_snoozes(lease.ref)
        if snoozes is None:
            return "lost"
        if snoozes:  # the counter counts durable sleeps too; max_snoozes bounds the rest
            snoozes -= sleeps_in(await self.broker.read_steps(lease.ref))
        params = lifecycle.snoozed(
            lease,
            delay,
            snoozes=snoozes,
            max_snoozes=task_def.max_snoozes if task_def is not None else DEFAULT_MAX_SNOOZES,
            now=self.app.clock.now(),
            max_payload=self.app.max_payload,
        )
        if isinstance(params, ArchiveParams):
            return await self._archived(lease, params, alert=True)
        if not await self._report(self.broker.retry, params, task):
            return "lost"
        log.info("task %s snoozed for %.1fs: %s", task.id, delay, exc.reason, extra=_extra(task))
        return "snoozed"

    async def _slept(self, lease: Lease, exc: Sleeping) -> str:
        """The handler fell asleep (``ctx.sleep``; its record is written): scheduled again
        when the sleep ends, without counting an attempt or a snooze."""
        task = lease.task
        delay = max(0.0, exc.until - self.app.clock.now())
        params = lifecycle.slept(lease, delay, awaits=exc.awaits)
        if not await self._report(self.broker.retry, params, task):
            return "lost"
        what = "sleeps" if exc.awaits is None else f"waits for signal {exc.awaits}"
        log.info("task %s %s (%s) for %.1fs", task.id, what, exc.name, delay, extra=_extra(task))
        return "slept"

    async def _archive(
        self, lease: Lease, error: str, *, alert: bool, exc: BaseException | None = None
    ) -> str:
        params = lifecycle.gave_up(
            lease, clip_error(error), now=self.app.clock.now(), max_payload=self.app.max_payload
        )
        params = replace(params, traceback=format_traceback(exc))
        return await self._archived(lease, params, alert=alert, exc=exc)

    async def _archived(
        self,
        lease: Lease,
        params: ArchiveParams,
        *,
        alert: bool,
        exc: BaseException | None = None,
    ) -> str:
        task = lease.task
        error = params.error
        tb = params.traceback
        if not await self._report(self.broker.archive, params, task):
            return "lost"
        if alert:
            # The alert line of W4: one ERROR with everything an on-call engineer needs.
            log.error(
                "task archived: id=%s type=%s queue=%s attempts=%d last_error=%r",
                task.id,
                task.type,
                task.queue,
                task.retried + 1,
                error,
                exc_info=exc if tb is not None else None,
                extra=_extra(task),
            )
        else:
            log.info("task %s archived: %s", task.id, error, extra=_extra(task))
        return "archived"

    async def _settle_cancelled(self, lease: Lease, reason: str | None) -> str:
        task = lease.task
        if reason == SHUTDOWN:
            requeue = functools.partial(self.broker.requeue, keep=lifecycle.keeps_key(task))
            if await self._report(requeue, lifecycle.handed_back(lease), task):
                log.info("task %s handed back at shutdown", task.id, extra=_extra(task))
                return "requeued"
            return "lost"
        if reason == CANCELLED:
            params = lifecycle.gave_up(
                lease,
                lifecycle.CANCELLED,
                now=self.app.clock.now(),
                count_attempt=False,
                max_payload=self.app.max_payload,
            )
            if await self._report(self.broker.archive, params, task):
                log.info("task %s cancelled", task.id, extra=_extra(task))
                return "archived"
            return "lost"
        if reason == LOST:
            log.warning(
                "task %s: lease lost to another worker; result dropped", task.id, extra=_extra(task)
            )
        return "lost"

    async def _report(
        self,
        call: Callable[[Any], Any],
        params: Any,
        task: TaskInfo,
        tries: Sequence[float | None] = _ACK_TRIES,
    ) -> bool:
        """Send an outcome to the broker, retrying through short outages: a try for each of
        ``tries``, each followed by that pause (``None``: the last).

        If it never gets through, the lease expires and the task runs again (at-least-once)."""
        for delay in tries:
            try:
                held: bool = await call(params)
            except BrokerUnavailableError as exc:
                if delay is None:
                    log.error(
                        "task %s: could not report its outcome (%s)",
                        task.id,
                        exc,
                        extra=_extra(task),
                    )
                    return False
                await asyncio.sleep(delay)
                continue
            if not held:
                _dropped(task)
            return held
        return False


class _TimedOut(Exception):
    """The attempt's budget (timeout or deadline) ran out and its handler was cancelled."""


class _Undecodable(Exception):
    """The stored payload is not a valid JSON object for this task: retrying cannot help."""


def _dropped(task: TaskInfo) -> None:
    log.warning("task %s: lease no longer held; outcome dropped", task.id, extra=_extra(task))


def _changed(base: contextvars.Context) -> bool:
    """Whether the running task's context variables differ from ``base``'s."""
    now = contextvars.copy_context()
    if len(now) != len(base):
        return True
    return any(now.get(var, base) is not value for var, value in base.items())


def _overrides(hook: WorkerHooks, name: str) -> bool:
    """Whether ``hook`` does something in ``name`` (the base class's does nothing)."""
    if name in getattr(hook, "__dict__", {}):
        return True
    return getattr(type(hook), name, None) is not getattr(WorkerHooks, name)


def _extra(task: TaskInfo) -> dict[str, Any]:
    return {
        "task_id": task.id,
        "task_type": task.type,
        "queue": task.queue,
        "attempt": task.retried + 1,
    }
