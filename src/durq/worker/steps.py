"""One attempt's durable steps (``ctx.step``): the task's recorded steps, as the claim that
leased the attempt returned them, and each new step written under the attempt's lease before
the handler goes on. A write the fence refuses (the lease was lost) fails the step: the
handler must not go on as if it were recorded.

The steps that a worker's attempts record at the same time go to the broker together
(:func:`step_writer`): one statement, transaction or pipeline for all, each write still
fenced by its own lease and each handler waiting for its own answer."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from durq import encryption as crypt
from durq import steps as s
from durq.brokers.base import Broker, LeaseRef, StepsParams
from durq.clock import Clock
from durq.coalescer import Coalescer
from durq.errors import StepError

#: Stores one attempt's steps; False when its lease no longer holds.
WriteSteps = Callable[[StepsParams], Awaitable[bool]]


def step_writer(broker: Broker) -> Coalescer[StepsParams, bool]:
    """A worker's step writes, coalesced: those recorded in one pass of the event loop go
    together as one ``record_steps_many``, and those recorded while it is in flight go
    together next."""
    # gather: a worker's handlers wake together (a claim, a batch's answers) and record
    # together; the first one sent alone held the others back one round trip, and SQLite,
    # which writes inline without suspending, then wrote each step in a transaction of its
    # own (docs/benchmarks.md, durable steps). A lease's writes never share a batch (one
    # attempt writes one step at a time anyway).
    # The broker's methods are looked up at the first write, not when the worker starts: a
    # worker of tasks that never step asks nothing of them (a test's stub broker has none).
    return Coalescer(
        lambda params: broker.record_steps(params),
        lambda items: broker.record_steps_many(items),
        apart=lambda params: params.lease,
        gather=True,
    )


class AttemptSteps:
    """The :class:`~durq.task.StepSink` of one attempt. Its coroutines run on the worker's
    loop; a sync handler's thread reaches them through :meth:`call`.

    ``recorded``: the task's steps as its claim returned them (``lease.task.steps``). No
    one else writes them while the lease holds (every write is fenced by its token), so
    they are what a read at the first step would find; ``None`` reads them then.
    ``write``: how a new step is stored (a worker's :func:`step_writer`), by default the
    broker's ``record_steps``."""

    def __init__(
        self,
        broker: Broker,
        lease: LeaseRef,
        attempt: int,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        max_bytes: int,
        encryption: crypt.Encryption | None = None,
        *,
        recorded: Sequence[s.TaskStep] | None = None,
        write: WriteSteps | None = None,
    ) -> None:
        self._broker = broker
        self._write = broker.record_steps if write is None else write
        self._lease = lease
        self._attempt = attempt
        self._clock = clock
        self._loop = loop
        self._max_bytes = max_bytes
        self._encryption = encryption
        #: The steps recorded before this attempt (what a step looks up).
        self._entries = None if recorded is None else s.entries(recorded)
        #: The stored form, from this attempt's first record on (each record appends).
        self._stored: str | None = None
        #: Names this attempt has used: each at most once.
        self._used: set[str] = set()
        self._lock = asyncio.Lock()

    def now(self) -> float:
        return self._clock.now()

    async def lookup(self, name: str) -> tuple[bool, Any]:
        """``(True, result)`` for a step recorded by an earlier attempt, else ``(False, None)``;
        StepError when this attempt used ``name`` already."""
        s.check_name(name)
        async with self._lock:
            if name in self._used:
                raise StepError(f"step {name!r} is called twice in one attempt")
            if self._entries is None:
                self._entries = s.decode(await self._broker.read_steps(self._lease))
            self._used.add(name)
            entry = self._entries.get(name)
        if entry is None:
            return False, None
        # A copy: the handler may change what it gets without changing what is stored.
        return True, copy.deepcopy(entry.get("result"))

    async def record(self, name: str, text: str, started: float) -> None:
        """Store the step's result (JSON ``text``) on the task, fenced by the lease."""
        async with self._lock:
            before = self._stored
            if before is None:
                before = s.encode(self._entries or {})
            ended = self._clock.now()
            if self._entries and name in self._entries:
                # A sleep or a wait recorded by an earlier attempt, updated in its place.
                entries = s.decode(before)
                entries[name] = {
                    "result": s.json_value(text),
                    "started": started,
                    "ended": ended,
                    "attempt": self._attempt,
                }
                stored = s.encode(entries)
            else:
                # A name new to the task (one use per attempt): appended, the others left as
                # they are stored (encoding them all again was a fifth of a no-op step's CPU).
                stored = s.append(before, name, text, started, ended, self._attempt)
            if len(stored.encode("utf-8")) > self._max_bytes:
                raise StepError(
                    f"step {name!r}: the task's steps would take {len(stored)} bytes, over the "
                    f"limit of {self._max_bytes}"
                )
            if not await self._write(StepsParams(self._lease, stored)):
                raise StepError(f"step {name!r} not recorded: the attempt lost its lease")
            self._stored = stored

    async def signals(self) -> dict[str, Any]:
        """The signals delivered to the task so far (name -> payload)."""
        raw = await self._broker.read_signals(self._lease)
        if not raw:
            return {}
        # Sealed payloads (an app with encryption) are opened here, as payloads are.
        return dict(crypt.decode(raw.encode(), self._encryption))

    def call(self, coro: Any) -> Any:
        """Run one of these coroutines on the worker's loop from a handler's thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()
