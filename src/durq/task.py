"""What a task looks like from outside: :class:`TaskInfo` and the handler's :class:`TaskContext`."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, NoReturn, Protocol

from durq import codec, durations
from durq.errors import SignalTimeoutError, Sleeping, Snooze, StepError
from durq.progress import TaskLogLine, TaskProgress, check_fraction, check_level, clip
from durq.states import FINISHED, TaskState
from durq.steps import (
    TaskStep,
    check_name,
    check_signal_name,
    encode_result,
    json_value,
    sleep_record,
    sleep_text,
    wait_record,
    wait_text,
)

#: Characters of payload and result a list shows per task.
PREVIEW_CHARS = 200
#: What displays (CLI, dashboard, admin API) show for an encrypted payload or result.
ENCRYPTED = "encrypted"


#: A unique key held longer than this is one held until its task finishes
#: (:data:`durq.uniqueness.UNTIL_FINISHED`, a century).
_HELD_TO_THE_END = 50 * 365 * 86400.0


#: The longest period a limit's rate may have: a year (seconds).
MAX_RATE_PER = 86400 * 366


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """One flow-control limit as stored with a task: its resolved key (counted per queue),
    at most ``concurrency`` attempts running at once, at most ``rate`` starts per ``per``
    seconds (a token bucket holding up to ``rate`` tokens). Built by :class:`durq.Limit`.

    ``fair``: the key's template (``"tenant:{tenant}"``) when the limit is fair: the keys
    filled from it are partitions that take turns in the claim (W22).

    ``cost``: the units one attempt takes from the key, of its concurrency and of its tokens
    (W24). ``sequence``: the key's tasks run one at a time, and a task keeps the key from
    its first start until it finishes (W25)."""

    key: str
    concurrency: int | None = None
    rate: int | None = None
    per: float | None = None
    fair: str | None = None
    cost: int = 1
    sequence: bool = False

    def to_json(self) -> list[Any]:
        """The stored form: ``[key, concurrency, rate, per]``, the template next when the
        limit is fair (a string after a comma: brokers spot a fair task by ``,"``), then the
        cost when it is not 1 or the limit is a sequence, then ``1`` for a sequence (the
        brokers read it as the 7th item; ``null`` fills the places before)."""
        item: list[Any] = [self.key, self.concurrency, self.rate, self.per]
        if self.sequence:
            item += [self.fair, self.cost, 1]
        elif self.cost != 1:
            item += [self.fair, self.cost]
        elif self.fair is not None:
            item.append(self.fair)
        return item

    @classmethod
    def from_json(cls, item: Any) -> LimitSpec:
        """Back from :meth:`to_json` (rows stored before W24 have cost 1, before W25 no
        sequence)."""
        key, concurrency, rate, per, *rest = item
        fair = rest[0] if rest else None
        return cls(
            str(key),
            concurrency,
            rate,
            None if per is None else float(per),
            None if fair is None else str(fair),
            int(rest[1]) if len(rest) > 1 and rest[1] is not None else 1,
            len(rest) > 2 and bool(rest[2]),
        )

    def describe(self) -> str:
        """``"3 at once, 20/1s"``: the limit in words."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} at once")
        if self.rate is not None:
            parts.append(f"{self.rate}/{self.per:g}s")
        if self.fair is not None:
            parts.append(f"fair by {self.fair}")
        if self.cost != 1:
            parts.append(f"cost {self.cost}")
        if self.sequence:
            parts.append("in sequence")
        return ", ".join(parts)


def fair_spec(limits: tuple[LimitSpec, ...]) -> LimitSpec | None:
    """The task's fair limit (stored first; a task has one at most), if any."""
    return limits[0] if limits and limits[0].fair is not None else None


def limits_to_json(limits: tuple[LimitSpec, ...]) -> str | None:
    """The stored column of a task's limits; ``None`` when it has none."""
    if not limits:
        return None
    return json.dumps([s.to_json() for s in limits], separators=(",", ":"))


def limits_from_json(text: str | bytes | None) -> tuple[LimitSpec, ...]:
    """A task's limits from their stored column."""
    if not text:
        return ()
    return tuple(LimitSpec.from_json(item) for item in json.loads(text))


@dataclass(frozen=True)
class TaskInfo:
    """A snapshot of one task, as the broker stored it at the time of the call.

    ``payload`` and ``result`` are decoded from their stored JSON on first access, so a task
    with an undecodable payload can still be listed and inspected (``raw_payload``)."""

    id: str
    queue: str
    type: str
    raw_payload: bytes
    state: TaskState
    max_retry: int
    retried: int = 0
    last_error: str | None = None
    timeout: float | None = None
    deadline: datetime | None = None
    next_process_at: datetime | None = None
    enqueued_at: datetime | None = None
    completed_at: datetime | None = None
    raw_result: bytes | None = None
    retention: float = 0.0
    #: How often a worker died while holding this task (poison-pill guard).
    lost: int = 0
    #: Trace context and other metadata carried from the enqueuer to the handler.
    headers: dict[str, str] = field(default_factory=dict)
    #: When the current or last attempt started, and which worker holds the lease.
    started_at: datetime | None = None
    lease_expires_at: datetime | None = None
    worker_id: str | None = None
    #: Set when the inspector asked an active task to be cancelled.
    cancel_requested: bool = False
    #: The last failed attempt's traceback with its exception chain (bounded), when the
    #: broker returns it: one task's get, not lists.
    traceback: str | None = None
    #: Higher is claimed first within the queue (see :data:`durq.options.MAX_PRIORITY`).
    priority: int = 0
    #: Flow-control limits the task counts against (:class:`durq.Limit`), resolved at enqueue.
    limits: tuple[LimitSpec, ...] = ()
    #: The limit key a pending task waits on (its limit was full when a worker looked).
    held_by: str | None = None
    #: The latest progress its handler reported (:meth:`TaskContext.progress`); a running
    #: attempt that has not reported yet shows none.
    progress: TaskProgress | None = None
    #: Its handler's last log lines over all attempts (:meth:`TaskContext.log`), oldest
    #: first, when the broker returns them: one task's get, not lists.
    logs: tuple[TaskLogLine, ...] = ()
    #: Its handler's recorded durable steps (:meth:`TaskContext.step`), in the order first
    #: recorded, when the broker returns them: one task's get, not lists.
    steps: tuple[TaskStep, ...] = ()
    #: How often its handler snoozed it (:class:`durq.Snooze`): not counted as attempts.
    snoozes: int = 0
    #: Until when it holds its unique key (``unique=``, :class:`durq.Unique`): twins are
    #: refused until then, or until it finishes; ``None``: it holds none. A key held until
    #: the task finishes shows as a moment about a century ahead.
    unique_until: datetime | None = None

    def describe_unique(self, now: float | None = None) -> str | None:
        """What its unique key holds, in words (``None``: it holds none now)."""
        if self.unique_until is None or self.state in FINISHED:
            return None
        left = self.unique_until.timestamp() - (time.time() if now is None else now)
        if left <= 0:
            return None
        if left > _HELD_TO_THE_END:
            return "held until it finishes (twins are refused)"
        when = self.unique_until.isoformat(timespec="seconds")
        return f"held until {when} or until it finishes (twins are refused)"

    @property
    def max_attempts(self) -> int:
        """Attempts a task may make: the first one and ``max_retry`` retries."""
        return self.max_retry + 1

    @property
    def attempts(self) -> int:
        """Finished attempts: the failed ones (``retried``) and, once completed, the one that
        succeeded."""
        return self.retried + (1 if self.state is TaskState.COMPLETED else 0)

    @property
    def attempts_label(self) -> str:
        """Finished attempts out of those allowed, e.g. ``3/3`` for an archived task with
        ``max_retry=2``, ``1/3`` for one that succeeded at once (failed attempts can exceed
        ``max_retry`` when a worker was lost)."""
        return f"{self.attempts}/{self.max_attempts}"

    @property
    def encrypted(self) -> bool:
        """Whether the payload is stored encrypted (:mod:`durq.encryption`): ``payload`` is
        then the sealed object, and displays show :data:`ENCRYPTED`."""
        return codec.is_sealed(self.raw_payload)

    @cached_property
    def payload(self) -> dict[str, Any]:
        """The payload as a dict (``ValueError`` if the stored bytes are not a JSON object)."""
        return codec.decode_payload(self.raw_payload)

    @cached_property
    def result(self) -> Any:
        """The handler's return value, while the completed task is retained."""
        return codec.decode(self.raw_result)

    def replace(self, **changes: Any) -> TaskInfo:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def summary(self, preview: int = PREVIEW_CHARS) -> dict[str, Any]:
        """JSON-ready form for lists: :meth:`to_dict` with the payload and result cut to a
        preview of their JSON text (and their sizes), without headers. A page of tasks stays
        small whatever the tasks hold; :meth:`to_dict` has the whole."""
        data = self._fields(None, None)
        for name in ("payload", "result", "headers"):
            del data[name]
        for name, raw in (("payload", self.raw_payload), ("result", self.raw_result)):
            data[f"{name}_bytes"] = 0 if raw is None else len(raw)
            if codec.is_sealed(raw):  # ciphertext means nothing to a reader
                data[f"{name}_preview"] = ENCRYPTED
                continue
            text = None if raw is None else bytes(raw[: preview * 4]).decode("utf-8", "replace")
            data[f"{name}_preview"] = None if text is None else text[:preview]
        data["header_count"] = len(self.headers)
        return data

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form with everything the task holds, used by ``--json`` and the admin
        API's task endpoint (lists use :meth:`summary`)."""
        payload: Any = ENCRYPTED
        if not codec.is_sealed(self.raw_payload):
            try:
                payload = self.payload
            except ValueError:
                payload = {"__undecodable__": self.raw_payload[:200].decode("utf-8", "replace")}
        result: Any = ENCRYPTED
        if not codec.is_sealed(self.raw_result):
            try:
                result = self.result
            except ValueError:
                result = None
        return {
            **self._fields(payload, result),
            "traceback": self.traceback,
            "logs": [line.to_dict() for line in self.logs],
            "steps": [step.to_dict() for step in self.steps],
        }

    def _fields(self, payload: Any, result: Any) -> dict[str, Any]:
        def iso(dt: datetime | None) -> str | None:
            return dt.isoformat() if dt else None

        return {
            "id": self.id,
            "queue": self.queue,
            "type": self.type,
            "payload": payload,
            "state": self.state.value,
            "priority": self.priority,
            "max_retry": self.max_retry,
            "retried": self.retried,
            "last_error": self.last_error,
            "timeout": self.timeout,
            "deadline": iso(self.deadline),
            "next_process_at": iso(self.next_process_at),
            "enqueued_at": iso(self.enqueued_at),
            "completed_at": iso(self.completed_at),
            "started_at": iso(self.started_at),
            "result": result,
            "retention": self.retention,
            "lost": self.lost,
            "worker_id": self.worker_id,
            "cancel_requested": self.cancel_requested,
            "headers": dict(self.headers),
            "limits": [
                {"key": s.key, "concurrency": s.concurrency, "rate": s.rate, "per": s.per}
                for s in self.limits
            ],
            "held_by": self.held_by,
            "progress": None if self.progress is None else self.progress.to_dict(),
            "snoozes": self.snoozes,
            "unique_until": iso(self.unique_until),
        }


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TaskInfo) if f.default is not MISSING}
_FIELDS = frozenset(f.name for f in dataclasses.fields(TaskInfo))


def make_info(**values: Any) -> TaskInfo:
    """The same TaskInfo as ``TaskInfo(**values)``, built without the frozen dataclass's
    per-field ``object.__setattr__``: the brokers build one per claimed, enqueued or listed
    task, and the constructor was about 5 % of ``durq worker``'s CPU per task
    (benchmarks/cpu_per_task.py). TypeError for a missing or unknown field."""
    info = object.__new__(TaskInfo)
    fields = info.__dict__
    fields.update(_DEFAULTS)
    fields["headers"] = {}
    fields.update(values)
    if fields.keys() != _FIELDS:
        raise TypeError(f"TaskInfo fields: {sorted(fields.keys() ^ _FIELDS)}")
    return info


class ReportSink(Protocol):
    """Where a :class:`TaskContext` sends its attempt's reports (the worker stamps, coalesces
    and writes them under the attempt's lease). Callable from any thread."""

    def progress(self, fraction: float, message: str | None) -> None: ...
    def log(self, level: str, message: str) -> None: ...


class StepSink(Protocol):
    """Where a :class:`TaskContext` looks up and records its attempt's durable steps (the
    worker reads them once and writes each new one under the attempt's lease)."""

    def now(self) -> float: ...
    async def lookup(self, name: str) -> tuple[bool, Any]: ...
    async def record(self, name: str, text: str, started: float) -> None: ...
    async def signals(self) -> dict[str, Any]: ...
    def call(self, coro: Any) -> Any: ...


class WorkflowRunner(Protocol):
    """Creates the workflows a task starts with :meth:`TaskContext.run_workflow` (the worker
    gives one to each context); returns the workflow's id and the signal that ends the task's
    wait for it."""

    async def create(
        self, workflow: Any, queue: str, task_id: str, step: str
    ) -> tuple[str, str]: ...


@dataclass(frozen=True)
class TaskContext:
    """What a handler may know about the attempt it runs (pass it by annotating a parameter),
    and how it reports its progress and log lines while it runs."""

    id: str
    queue: str
    type: str
    retried: int
    max_retry: int
    deadline: datetime | None
    headers: dict[str, str]
    worker_id: str
    #: Where reports go; ``None`` (a context built outside a worker): they are dropped.
    reports: ReportSink | None = field(default=None, repr=False, compare=False)
    #: Where durable steps are recorded; ``None`` (a context built outside a worker): each
    #: step runs every time.
    steps: StepSink | None = field(default=None, repr=False, compare=False)
    #: A workflow node's dependencies: node name -> result (a :class:`durq.NodeFailed` for
    #: one that failed with ``on_failure="continue"``); empty for other tasks.
    dependencies: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: Where :meth:`run_workflow` creates workflows; ``None`` outside a worker.
    workflows: WorkflowRunner | None = field(default=None, repr=False, compare=False)

    @property
    def attempt(self) -> int:
        """1 for the first attempt, 2 for the first retry, and so on."""
        return self.retried + 1

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far this attempt got: ``fraction`` from 0 to 1 (ValueError otherwise)
        and an optional short message (cut to 1 KiB), e.g. ``ctx.progress(0.4, "rows
        400/1000")``. The task keeps the latest report; the worker writes at most one per
        0.5 s per task and the last one when the attempt ends. From async and sync handlers
        alike; it never blocks on the broker."""
        value = check_fraction(fraction)
        if self.reports is not None:
            self.reports.progress(value, None if message is None else clip(str(message)))

    def log(self, message: str, level: str = "info") -> None:
        """Add a line to the task's log (``level``: debug, info, warning or error; ValueError
        otherwise). The task keeps its last 50 lines over all attempts, each cut to 1 KiB,
        marked with the attempt; written as :meth:`progress` is."""
        name = check_level(level)
        if self.reports is not None:
            self.reports.log(name, clip(str(message)))

    def snooze(self, delay: float | str = 0.0, reason: str = "snoozed") -> NoReturn:
        """Stop this attempt and run the task again in ``delay`` seconds (or a duration such
        as ``"5m"``) without counting an attempt: raises :class:`durq.Snooze`."""
        raise Snooze(delay, reason)

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (a coroutine function, or a plain one) once for this
        task: its result, which must be JSON, is stored on the task before this returns, and
        when the task runs again (a retry, a lost worker, a redeploy) a step already recorded
        returns its stored result without calling ``fn``. Steps are matched by ``name``: each
        name at most once per attempt (StepError otherwise). An exception of ``fn`` is not
        recorded: it fails the attempt like any other. Returns the stored JSON value (a tuple
        comes back a list, the same on the first run as on the next)."""
        sink = self.steps
        if sink is None:
            value = await _maybe_await(fn(*args, **kwargs))
            return json_value(encode_result(check_name(name), value))
        found, stored = await sink.lookup(name)
        if found:
            return _step_result(name, stored)
        started = sink.now()
        text = encode_result(name, await _maybe_await(fn(*args, **kwargs)))
        await sink.record(name, text, started)
        return json_value(text)

    def step_sync(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """:meth:`step` for sync handlers (which run on the worker's threads): ``fn`` is a
        plain function, run on the handler's thread."""
        sink = self.steps
        if sink is None:
            return json_value(
                encode_result(check_name(name), _not_awaitable(name, fn(*args, **kwargs)))
            )
        if _on_loop():
            raise StepError("step_sync is for sync handlers: use await ctx.step(...)")
        found, stored = sink.call(sink.lookup(name))
        if found:
            return _step_result(name, stored)
        started = sink.now()
        text = encode_result(name, _not_awaitable(name, fn(*args, **kwargs)))
        sink.call(sink.record(name, text, started))
        return json_value(text)

    async def sleep(self, name: str, delay: float | str | timedelta) -> None:
        """Durable sleep: the task leaves the worker for ``delay`` seconds (or a duration
        such as ``"1h"``) and runs again afterwards, replaying its recorded steps; this call
        then returns at once. The attempt ends here (:class:`durq.Sleeping` is raised and the
        worker handles it), so the task holds no slot, connection or limit token while it
        sleeps; it waits ``scheduled`` on the broker's clock. Not counted as an attempt or a
        snooze. Named like a step (the same names; each once per attempt). A context built
        outside a worker returns at once."""
        seconds = _seconds(delay)
        await self._sleep(name, lambda now: now + seconds)

    async def sleep_until(self, name: str, when: datetime | float) -> None:
        """:meth:`sleep` until ``when`` (an aware datetime, or epoch seconds); a moment
        already past returns at once."""
        at = _moment(when)
        await self._sleep(name, lambda now: at)

    def sleep_sync(self, name: str, delay: float | str | timedelta) -> None:
        """:meth:`sleep` for sync handlers."""
        seconds = _seconds(delay)
        self._sleep_sync(name, lambda now: now + seconds)

    def sleep_until_sync(self, name: str, when: datetime | float) -> None:
        """:meth:`sleep_until` for sync handlers."""
        at = _moment(when)
        self._sleep_sync(name, lambda now: at)

    async def _sleep(self, name: str, until_of: Callable[[float], float]) -> None:
        sink = self.steps
        if sink is None:
            check_name(name)
            return
        found, stored = await sink.lookup(name)
        now = sink.now()
        text = _sleep_or_wake(name, found, stored, now, until_of)
        if text is not None:
            await sink.record(name, text, now)
            _fall_asleep(name, text)

    def _sleep_sync(self, name: str, until_of: Callable[[float], float]) -> None:
        sink = self.steps
        if sink is None:
            check_name(name)
            return
        if _on_loop():
            raise StepError("sleep_sync is for sync handlers: use await ctx.sleep(...)")
        found, stored = sink.call(sink.lookup(name))
        now = sink.now()
        text = _sleep_or_wake(name, found, stored, now, until_of)
        if text is not None:
            sink.call(sink.record(name, text, now))
            _fall_asleep(name, text)

    async def wait_for(
        self, name: str, *, timeout: float | str | timedelta, step: str | None = None
    ) -> Any:
        """Wait for the signal ``name`` (sent with :meth:`durq.App.signal`) and return its
        payload. A signal delivered before the task waits is kept for it, and returned at
        once. Otherwise the attempt ends here, as in :meth:`sleep`: the task waits
        ``scheduled``, holding nothing, until the signal makes it pending (in the same
        atomic step that stores the signal) or ``timeout`` passes; it then runs again and
        this call returns the payload, or raises :class:`durq.SignalTimeoutError`. The
        outcome is recorded like a step, under ``step`` (default: ``name``), so later runs
        get the same answer; a handler that waits for one signal more than once (a timeout,
        a poll, then a wait again) gives each wait its own ``step``. Signal names: 1-100
        letters, digits, ``_ . : -``. A context built outside a worker raises
        SignalTimeoutError at once."""
        seconds = _seconds(timeout)
        record = _wait_step(name, step)
        sink = self.steps
        if sink is None:
            raise SignalTimeoutError(f"no signal {name!r}: not running in a worker")
        found, stored = await sink.lookup(record)
        ended = _wait_ended(record, found, stored)
        if ended is not None:
            return _wait_outcome(name, record, ended)
        now = sink.now()
        until, count = _wait_state(stored, now + seconds)
        text = _wait_or_wake(name, await sink.signals(), until, count, now)
        await sink.record(record, text, now)
        return _wait_outcome(name, record, wait_record(json_value(text)))

    async def run_workflow(
        self, workflow: Any, *, timeout: float | str | timedelta, step: str | None = None
    ) -> dict[str, Any]:
        """Start ``workflow`` (a :class:`durq.Workflow` built now, e.g. one node per row this
        task found) and wait for it; return its final nodes' results by name, as
        ``app.wait`` on a workflow does, or raise :class:`durq.WorkflowFailedError` naming
        the node whose failure stopped it. A durable step, recorded under ``step``
        (default ``workflow:<its name>``): the workflow is created once, whatever runs of
        this task come; while it runs, this task's attempt ends as in :meth:`wait_for` and
        holds no worker slot; it runs again when the workflow has ended, replaying its
        steps, and this call returns at once. The nodes after this task (when it is a
        workflow node) wait for it, so for the child workflow too. Raises
        :class:`durq.SignalTimeoutError` when ``timeout`` passes first (the child workflow
        goes on). See :mod:`durq.child_workflows`."""
        from durq.workflows import WorkflowFailedError

        name = getattr(workflow, "name", None)
        record = check_name(step if step is not None else f"workflow:{name}")
        sink, runner = self.steps, self.workflows
        if sink is None or runner is None:
            raise StepError("run_workflow runs in a worker: it waits without holding one")
        found, stored = await sink.lookup(record)
        if found:
            if not isinstance(stored, dict) or not isinstance(stored.get("signal"), str):
                raise StepError(f"step {record!r} was recorded as something else: names changed")
            signal = stored["signal"]
        else:
            started = sink.now()
            child, signal = await runner.create(workflow, self.queue, self.id, record)
            text = encode_result(record, {"workflow": child, "signal": signal})
            await sink.record(record, text, started)
        told = await self.wait_for(signal, timeout=timeout, step=f"{record}.end")
        failed = told.get("failed") if isinstance(told, dict) else None
        if failed is not None:
            raise WorkflowFailedError(
                f"workflow {name!r} started by task {self.id!r}: node {failed['node']!r} "
                f"{failed['error']}",
                node=str(failed["node"]),
            )
        return dict(told["results"])

    def wait_for_sync(
        self, name: str, *, timeout: float | str | timedelta, step: str | None = None
    ) -> Any:
        """:meth:`wait_for` for sync handlers."""
        seconds = _seconds(timeout)
        record = _wait_step(name, step)
        sink = self.steps
        if sink is None:
            raise SignalTimeoutError(f"no signal {name!r}: not running in a worker")
        if _on_loop():
            raise StepError("wait_for_sync is for sync handlers: use await ctx.wait_for(...)")
        found, stored = sink.call(sink.lookup(record))
        ended = _wait_ended(record, found, stored)
        if ended is not None:
            return _wait_outcome(name, record, ended)
        now = sink.now()
        until, count = _wait_state(stored, now + seconds)
        text = _wait_or_wake(name, sink.call(sink.signals()), until, count, now)
        sink.call(sink.record(record, text, now))
        return _wait_outcome(name, record, wait_record(json_value(text)))


def _wait_step(name: str, step: str | None) -> str:
    """The step a wait for the signal ``name`` is recorded as: ``step``, or the signal's
    name; StepError for a bad name of either."""
    check_signal_name(name)
    return name if step is None else check_name(step)


def _wait_ended(name: str, found: bool, stored: Any) -> dict[str, Any] | None:
    """The record of a wait that ended in an earlier run (received or timed out), else
    ``None``; StepError when ``name`` was recorded as something else."""
    if not found:
        return None
    record = wait_record(stored)
    if record is None:
        raise StepError(f"wait {name!r} was recorded as a step or a sleep: step names changed")
    return record if "received" in record or record.get("timed_out") else None


def _wait_state(stored: Any, until: float) -> tuple[float, int]:
    """``(until, count)``: a recorded wait's, or a new one ending at ``until``."""
    record = wait_record(stored)
    if record is None:
        return until, 0
    return float(record["until"]), int(record.get("count", 0))


def _wait_or_wake(name: str, signals: dict[str, Any], until: float, count: int, now: float) -> str:
    """The record a wait writes now: received, timed out, or waiting (once more)."""
    if name in signals:
        return wait_text(until, count, received=signals[name])
    if until <= now:
        return wait_text(until, count, timed_out=True)
    return wait_text(until, count + 1)


def _wait_outcome(name: str, step: str, record: dict[str, Any] | None) -> Any:
    """The payload of a received wait; SignalTimeoutError; or leave the worker (the wait
    recorded as ``step``, woken by the signal ``name``)."""
    assert record is not None
    if "received" in record:
        return record["received"]
    if record.get("timed_out"):
        raise SignalTimeoutError(f"no signal {name!r} within the wait")
    raise Sleeping(step, float(record["until"]), awaits=name)


def _step_result(name: str, stored: Any) -> Any:
    """A recorded step's result; StepError if ``name`` was recorded as a sleep or a wait."""
    if sleep_record(stored) is not None or wait_record(stored) is not None:
        raise StepError(f"step {name!r} was recorded as a sleep or a wait: step names changed")
    return stored


def _sleep_or_wake(
    name: str, found: bool, stored: Any, now: float, until_of: Callable[[float], float]
) -> str | None:
    """The record to write before a sleep, or ``None`` when the sleep is over (or was for
    no time at all, which is recorded as over)."""
    if not found:
        until = until_of(now)
        count = 0
    else:
        record = sleep_record(stored)
        if record is None:
            raise StepError(f"sleep {name!r} was recorded as a step: step names changed")
        until, count = record
        if until <= now:
            return None
    return sleep_text(until, count + (until > now))


def _fall_asleep(name: str, text: str) -> None:
    record = sleep_record(json_value(text))
    assert record is not None
    if record[1]:
        raise Sleeping(name, record[0])


def _seconds(delay: float | str | timedelta) -> float:
    seconds = durations.seconds(delay)
    if seconds is None or seconds < 0:
        raise ValueError(f"a sleep lasts 0 seconds or more, not {delay!r}")
    return seconds


def _moment(when: datetime | float) -> float:
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise ValueError("sleep_until needs an aware datetime (one with a timezone)")
        return when.timestamp()
    return float(when)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _not_awaitable(name: str, value: Any) -> Any:
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited: no warning about it
        raise StepError(f"step {name!r}: step_sync takes a plain function, not a coroutine one")
    return value


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
