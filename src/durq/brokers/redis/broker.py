"""The Redis broker: the hot path (:class:`~durq.brokers.base.Broker`) on redis-py's asyncio
client. Every state change is one Lua script of ``scripts/`` (atomic on the server); this
module only builds keys and arguments and decodes replies. See docs/brokers/redis.md."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rex

from durq.brokers.base import (
    CAP_ATOMIC_FOLLOW_UPS,
    CAP_CROSS_PROCESS_NOTIFY,
    CAP_CROSS_QUEUE_FOLLOW_UPS,
    CAP_MULTI_PROCESS,
    ArchiveParams,
    ClaimParams,
    CompleteParams,
    EnqueueOutcome,
    EnqueueParams,
    Lease,
    LeaseMove,
    LeaseRef,
    LeaseReport,
    RetryParams,
)
from durq.brokers.redis.admin import RedisAdmin
from durq.brokers.redis.core import DAY_TTL, Scalar
from durq.brokers.redis.keys import utc_day
from durq.brokers.redis.records import pairs, task_info
from durq.brokers.redis.wire import Subscriber
from durq.errors import (
    BrokerError,
    DuplicateTaskError,
    TaskIDConflictError,
)
from durq.task import TaskInfo

log = logging.getLogger("durq.brokers.redis")

#: Due scheduled/retry tasks forwarded per queue per promote call (and at least per claim).
PROMOTE_BOUND = 1000
#: Tasks per enqueue_many script call: bounds how long one call holds the server.
ENQUEUE_CHUNK = 500
#: Wake-up listener: reconnect backoff bounds (seconds).
_LISTEN_BACKOFF = (0.05, 2.0)
#: How long the first claim waits for the wake-up subscription (seconds).
_SUBSCRIBE_WAIT = 2.0
#: Seconds between PINGs on an idle wake-up subscription (notices a silent peer).
_PING_EVERY = 15.0
#: Marker in the notified set: wake every waiter (after a (re)subscription).
_ALL = "*"

_Call = tuple[str, Sequence[str], Sequence[Scalar]]


class RedisBroker(RedisAdmin):
    """durq on Redis >= 6.2: ``RedisBroker.from_url("redis://host:6379/0?prefix=durq")``."""

    #: Cross-queue follow-ups: one script touches two queues' hash slots, which a single
    #: node (this client) allows and a Redis Cluster would refuse. See docs/brokers/redis.md.
    capabilities = frozenset(
        {
            CAP_MULTI_PROCESS,
            CAP_CROSS_PROCESS_NOTIFY,
            CAP_ATOMIC_FOLLOW_UPS,
            CAP_CROSS_QUEUE_FOLLOW_UPS,
        }
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._notified: set[str] = set()
        self._wake = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        #: Queues whose wake-up channel this broker object subscribes to (claimed or waited
        #: on); their channel names as the server sends them back, mapped to the queue.
        self._watched: set[str] = set()
        self._channel_queue: dict[bytes, str] = {}
        self._sub: Subscriber | None = None

    # -- enqueue --------------------------------------------------------------------------

    @staticmethod
    def _enqueue_outcome(p: EnqueueParams, info: TaskInfo, reply: Any) -> EnqueueOutcome:
        if reply == 1:
            return EnqueueOutcome(p, info=info)
        tag = reply[0]
        if tag == b"conflict":
            existing = task_info(p.queue, reply[1])
            return EnqueueOutcome(
                p,
                error=TaskIDConflictError(
                    f"task {p.id!r} already exists in queue {p.queue!r} ({existing.state.value})",
                    existing=existing,
                ),
            )
        existing_id = reply[1].decode()
        return EnqueueOutcome(
            p,
            error=DuplicateTaskError(
                f"an identical {p.type!r} task ({existing_id!r}) is already queued in {p.queue!r}",
                existing_id=existing_id,
            ),
        )

    @staticmethod
    def _no_connection(connection: Any) -> None:
        if connection is not None:
            raise BrokerError(
                "the Redis broker cannot enqueue inside a caller's transaction "
                "(no transactional_enqueue capability)",
                operation="redis.enqueue",
            )

    async def enqueue(self, params: EnqueueParams, *, connection: Any = None) -> TaskInfo:
        """Create one task: one script checks the id (E3) and uniqueness (E4) and writes it.

        The hot path of one-by-one enqueue: no context manager, the reply is 1 on success
        and the TaskInfo comes from the params."""
        if connection is not None:
            self._no_connection(connection)
        now = self._clock.now()
        call, info = self._enqueue_call(params, now)
        try:
            if not self._ready:
                await self.connect()
            if params.queue not in self._known_queues:
                await self._remember_queues([params.queue])
            reply = await self._eval(*call)
        except Exception as exc:
            mapped = self._mapped(exc, "enqueue")
            if mapped is exc:
                raise
            raise mapped from exc
        if reply != 1:
            error = self._enqueue_outcome(params, info, reply).error
            assert error is not None
            raise error
        return info

    async def enqueue_many(
        self, items: Sequence[EnqueueParams], *, connection: Any = None
    ) -> list[EnqueueOutcome]:
        """One round trip: per queue, one enqueue_many script per chunk of up to
        ``ENQUEUE_CHUNK`` items, all chunks in one pipeline; one outcome per item (E9)."""
        self._no_connection(connection)
        if not items:
            return []
        now = self._clock.now()
        by_queue: dict[str, list[int]] = defaultdict(list)
        for i, p in enumerate(items):
            by_queue[p.queue].append(i)
        infos: list[TaskInfo | None] = [None] * len(items)
        calls: list[_Call] = []
        chunks: list[list[int]] = []
        for queue, indexes in by_queue.items():
            k = self._keys.queue(queue)
            for first in range(0, len(indexes), ENQUEUE_CHUNK):
                chunk = indexes[first : first + ENQUEUE_CHUNK]
                keys = [k.pending, k.scheduled, k.completed, k.unique, k.seq]
                args: list[Scalar] = [now, k.notify]
                for i in chunk:
                    p = items[i]
                    keys.append(k.task(p.id))
                    fields, infos[i] = self._enqueue_fields(p, k, now)
                    args += fields
                calls.append(("enqueue_many", keys, args))
                chunks.append(chunk)
        async with self._op("enqueue_many"):
            await self._ensure()
            await self._remember_queues(list(by_queue))
            replies = await self._eval_many(calls)
        outcomes: list[EnqueueOutcome | None] = [None] * len(items)
        for chunk, reply in zip(chunks, replies, strict=True):
            for i, item_reply in zip(chunk, reply, strict=True):
                info = infos[i]
                assert info is not None
                outcomes[i] = self._enqueue_outcome(items[i], info, item_reply)
        return [o for o in outcomes if o is not None]

    # -- claim and leases -----------------------------------------------------------------

    async def claim(self, params: ClaimParams) -> list[Lease]:
        """Fill up to ``limit`` leases from the queues in order: one script per queue."""
        leases: list[Lease] = []
        await self._watch(params.queues, before_claim=True)
        # Level-triggered wake-ups: what was published before this claim started is covered
        # by it; only notifications from now on make the next wait_for_work return at once.
        self._notified.difference_update(params.queues)
        self._notified.discard(_ALL)
        async with self._op("claim"):
            await self._ensure()
            for queue in dict.fromkeys(params.queues):
                remaining = params.limit - len(leases)
                if remaining <= 0:
                    break
                k = self._keys.queue(queue)
                now = self._clock.now()
                rows = await self._eval(
                    "claim",
                    [k.pending, k.scheduled, k.retry, k.active, k.paused],
                    [
                        now,
                        remaining,
                        now + params.lease_seconds,
                        params.worker_id,
                        secrets.token_hex(8),
                        k.task_prefix,
                        max(remaining, 100),
                    ],
                )
                for token, flat in rows:
                    leases.append(Lease(task_info(queue, flat), token.decode()))
        return leases

    async def extend_leases(self, leases: Sequence[LeaseRef], lease_seconds: float) -> LeaseReport:
        """One extend script per queue, all in one pipeline."""
        if not leases:
            return LeaseReport()
        by_queue: dict[str, list[LeaseRef]] = defaultdict(list)
        for ref in leases:
            by_queue[ref.queue].append(ref)
        expires = self._clock.now() + lease_seconds
        calls: list[_Call] = []
        for queue, refs in by_queue.items():
            k = self._keys.queue(queue)
            args: list[Scalar] = [expires, k.task_prefix]
            for ref in refs:
                k.task(ref.id)  # validates the id
                args += [ref.id, ref.token]
            calls.append(("extend", [k.active], args))
        async with self._op("extend_leases"):
            await self._ensure()
            replies = await self._eval_many(calls)
        lost: set[str] = set()
        cancel: set[str] = set()
        for lost_ids, cancel_ids in replies:
            lost.update(i.decode() for i in lost_ids)
            cancel.update(i.decode() for i in cancel_ids)
        return LeaseReport(lost=frozenset(lost), cancel=frozenset(cancel))

    def _complete_call(self, p: CompleteParams, now: float, day: str | None = None) -> _Call:
        k = self._keys.queue(p.lease.queue)
        call: _Call = (
            "complete",
            [
                k.task(p.lease.id),
                k.active,
                k.completed,
                k.unique,
                k.stats,
                k.stats_day(day or utc_day(now)),
            ],
            [
                p.lease.token,
                now,
                float(p.retention),
                now + p.retention,
                "1" if p.result is not None else "0",
                p.result or b"",
                DAY_TTL,
            ],
        )
        return self._with_follow_ups(call, p.follow_ups, now)

    async def complete(self, params: CompleteParams) -> bool:
        """Completed (kept for its retention) or deleted; False if the lease is lost.
        Its follow-ups are created by the same script."""
        call = self._complete_call(params, self._clock.now())
        async with self._op("complete"):
            await self._ensure()
            if params.follow_ups:
                await self._remember_queues([p.queue for p in params.follow_ups])
            return bool(await self._eval(*call))

    async def complete_many(self, items: Sequence[CompleteParams]) -> list[bool]:
        """Several complete scripts in one pipeline."""
        if not items:
            return []
        now = self._clock.now()
        async with self._op("complete_many"):
            await self._ensure()
            follow_queues = [f.queue for p in items for f in p.follow_ups]
            if follow_queues:
                await self._remember_queues(follow_queues)
            day = utc_day(now)  # once per batch, not per task
            replies = await self._eval_many([self._complete_call(p, now, day) for p in items])
        return [bool(r) for r in replies]

    def _lease_move_call(self, p: LeaseMove, now: float, day: str) -> _Call:
        """The retry.lua or archive.lua call of one fenced move (with its follow-ups)."""
        k = self._keys.queue(p.lease.queue)
        expired_by: Scalar = "" if p.expired_by is None else float(p.expired_by)
        lost = "1" if p.lost else "0"
        if isinstance(p, RetryParams):
            return (
                "retry",
                [k.task(p.lease.id), k.active, k.retry, k.stats, k.stats_day(day)],
                [
                    p.lease.token,
                    p.error,
                    float(p.next_process_at),
                    DAY_TTL,
                    lost,
                    expired_by,
                    k.notify if p.next_process_at <= now else "",
                ],
            )
        call: _Call = (
            "archive",
            [k.task(p.lease.id), k.active, k.archived, k.unique, k.stats, k.stats_day(day)],
            [
                p.lease.token,
                now,
                p.error,
                "1" if p.count_attempt else "0",
                DAY_TTL,
                lost,
                expired_by,
            ],
        )
        return self._with_follow_ups(call, p.follow_ups, now)

    async def move_leases(self, moves: Sequence[LeaseMove]) -> list[bool]:
        """One retry/archive script per move (each atomic with its follow-ups), all in one
        pipeline."""
        if not moves:
            return []
        now = self._clock.now()
        day = utc_day(now)
        calls = [self._lease_move_call(p, now, day) for p in moves]
        async with self._op("move_leases"):
            await self._ensure()
            await self._remember_follow_up_queues(moves)
            replies = await self._eval_many(calls)
        return [bool(r) for r in replies]

    async def _remember_follow_up_queues(self, moves: Sequence[LeaseMove]) -> None:
        queues = [f.queue for p in moves if isinstance(p, ArchiveParams) for f in p.follow_ups]
        if queues:
            await self._remember_queues(queues)

    async def retry(self, params: RetryParams) -> bool:
        """retry until ``next_process_at``, retried + 1; False if the lease is lost."""
        return await self._move_one("retry", params)

    async def archive(self, params: ArchiveParams) -> bool:
        """archived with ``error``; False if the lease is lost."""
        return await self._move_one("archive", params)

    async def _move_one(self, op: str, params: LeaseMove) -> bool:
        now = self._clock.now()
        call = self._lease_move_call(params, now, utc_day(now))
        async with self._op(op):
            await self._ensure()
            await self._remember_follow_up_queues([params])
            return bool(await self._eval(*call))

    async def requeue(self, lease: LeaseRef) -> bool:
        """Hand an active task back as pending without counting an attempt (W7)."""
        k = self._keys.queue(lease.queue)
        async with self._op("requeue"):
            await self._ensure()
            return bool(
                await self._eval(
                    "requeue", [k.task(lease.id), k.active, k.pending], [lease.token, k.notify]
                )
            )

    # -- maintenance ----------------------------------------------------------------------

    async def promote_due(self) -> int:
        """Forward due scheduled/retry tasks of every known queue (one pipeline)."""
        async with self._op("promote_due"):
            await self._ensure()
            queues = await self._all_queues()
            if not queues:
                return 0
            now = self._clock.now()
            calls: list[_Call] = []
            for q in queues:
                k = self._keys.queue(q)
                calls.append(
                    (
                        "promote",
                        [k.pending, k.scheduled, k.retry],
                        [now, k.task_prefix, PROMOTE_BOUND, k.notify],
                    )
                )
            return sum(int(n) for n in await self._eval_many(calls))

    async def expired_leases(self, limit: int) -> list[Lease]:
        """Expired leases of every known queue (one pipeline), oldest expiry first."""
        async with self._op("expired_leases"):
            await self._ensure()
            queues = await self._all_queues()
            if not queues:
                return []
            now = self._clock.now()
            calls: list[_Call] = []
            for q in queues:
                k = self._keys.queue(q)
                calls.append(("expired", [k.active], [now, k.task_prefix, limit]))
            replies = await self._eval_many(calls)
        leases = [
            Lease(task_info(q, row), pairs(row)["token"].decode())
            for q, rows in zip(queues, replies, strict=True)
            for row in rows
        ]
        leases.sort(key=lambda lease: lease.task.lease_expires_at or 0)
        return leases[:limit]

    async def delete_expired(self, limit: int) -> int:
        """Janitor: delete up to ``limit`` completed tasks past their retention."""
        deleted = 0
        async with self._op("delete_expired"):
            await self._ensure()
            now = self._clock.now()
            for q in await self._all_queues():
                if deleted >= limit:
                    break
                k = self._keys.queue(q)
                deleted += int(
                    await self._eval(
                        "janitor", [k.completed], [now, k.task_prefix, limit - deleted]
                    )
                )
        return deleted

    # -- wake-ups -------------------------------------------------------------------------

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Wait for a wake-up published by a script that made a task pending in ``queues``.

        The broker object subscribes to the wake-up channel of every queue it claims from or
        waits on (one connection for all); messages feed a set of notified queues, so one
        that arrives between two waits is kept and none is lost after the subscription. Right
        after (re)subscribing every waiter is woken once, since messages published while
        unsubscribed are gone. ``timeout`` bounds the wait."""
        wanted = set(queues)
        if await self._watch(queues, before_claim=False):
            return True  # newly subscribed queues: what was published before is unknown
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            hits = wanted & self._notified
            if hits or _ALL in self._notified:
                self._notified -= hits
                self._notified.discard(_ALL)
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._wake.wait()

    def _notify_local(self, queue: str) -> None:
        self._notified.add(queue)
        self._wake.set()

    def _on_channel_message(self, channel: bytes) -> None:
        queue = self._channel_queue.get(channel)
        if queue is not None:
            self._notified.add(queue)
            self._wake.set()

    async def _watch(self, queues: Sequence[str], *, before_claim: bool) -> bool:
        """Make sure wake-ups of ``queues`` are subscribed to. Before a claim this waits
        (briefly) until they are, so every enqueue after the claim started is seen. Returns
        whether queues were added that a waiter may have missed messages of."""
        if self._wire is None:
            await self._start_listener(before_claim=before_claim)
            return False
        new = [q for q in dict.fromkeys(queues) if q not in self._watched]
        for q in new:
            channel = self._keys.queue(q).notify  # validates the name
            self._channel_queue[channel.encode()] = q
            self._watched.add(q)
        if self._listener is None or self._listener.done():
            self._subscribed = asyncio.Event()
            self._listener = asyncio.create_task(self._listen(), name="durq-redis-wakeups")
        if not self._subscribed.is_set():
            # The first subscription (it covers every watched queue, new ones included).
            if before_claim:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._subscribed.wait(), _SUBSCRIBE_WAIT)
                    return False
            self._notify_local(_ALL)
            return bool(new)
        sub = self._sub
        if not new or sub is None:
            # None: reconnecting; it subscribes to every watched queue, then wakes all.
            return bool(new)
        try:
            await asyncio.wait_for(
                sub.subscribe([self._keys.queue(q).notify for q in new]), _SUBSCRIBE_WAIT
            )
        except (rex.RedisError, OSError, TimeoutError):
            self._notify_local(_ALL)  # not sure it is subscribed: the next wait returns
        return True

    async def _listen(self) -> None:
        """Keep one subscription to every watched queue's channel; reconnect with backoff
        after errors or a restart, then wake every waiter once."""
        assert self._wire is not None
        delay = _LISTEN_BACKOFF[0]
        missed = False
        while True:
            sub: Subscriber | None = None
            try:
                sub = await self._wire.subscriber(self._on_channel_message)
                done: set[str] = set()
                while todo := [q for q in self._watched if q not in done]:
                    await sub.subscribe([self._keys.queue(q).notify for q in todo])
                    done.update(todo)
                self._sub = sub
                delay = _LISTEN_BACKOFF[0]
                if missed:
                    # Messages published while we were not subscribed are gone: wake all.
                    self._notify_local(_ALL)
                    missed = False
                self._subscribed.set()
                await sub.watch(_PING_EVERY)
                raise rex.ConnectionError("wake-up subscription lost")
            except (rex.RedisError, OSError, TimeoutError):
                # The server went away; waiters fall back to their timeout meanwhile, and a
                # claim waiting for the first subscription goes on (and fails on its own).
                missed = True
                self._subscribed.set()
            finally:
                self._sub = None
                if sub is not None:
                    sub.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _LISTEN_BACKOFF[1])

    async def _start_listener(self, *, before_claim: bool) -> None:
        """TLS connections (no pipelined connection): start redis-py's pattern subscription
        once. Before a claim, wait (briefly) until it is subscribed, so every enqueue after
        the claim started is seen; otherwise messages may have been missed and the first
        wait returns at once."""
        if self._listener is not None and not self._listener.done():
            return
        self._subscribed = asyncio.Event()
        self._listener = asyncio.create_task(self._listen_redis_py(), name="durq-redis-wakeups")
        if before_claim:
            try:
                await asyncio.wait_for(self._subscribed.wait(), _SUBSCRIBE_WAIT)
                return
            except TimeoutError:
                pass
        self._notify_local(_ALL)

    async def _listen_redis_py(self) -> None:
        """Keep one PSUBSCRIBE open; reconnect with backoff after errors or a restart."""
        delay = _LISTEN_BACKOFF[0]
        missed = False
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.psubscribe(self._keys.notify_pattern)
                delay = _LISTEN_BACKOFF[0]
                if missed:
                    # Messages published while we were not subscribed are gone: wake all.
                    self._notify_local(_ALL)
                    missed = False
                self._subscribed.set()
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is None:
                        continue
                    channel = msg.get("channel")
                    if isinstance(channel, bytes):
                        queue = self._keys.queue_of_channel(channel.decode())
                        if queue is not None:
                            self._notify_local(queue)
            except (rex.RedisError, OSError):
                missed = True
                self._subscribed.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, _LISTEN_BACKOFF[1])
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        """Stop the wake-up listener and close every connection (idempotent)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listener
        await super().close()
