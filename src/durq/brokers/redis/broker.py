"""The Redis broker: the hot path (:class:`~durq.brokers.contract.Broker`) on redis-py's asyncio
client. Every state change is one Lua script of ``scripts/`` (atomic on the server); this
module only builds keys and arguments and decodes replies. See docs/brokers/redis.md."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, replace
from datetime import date
from typing import Any, Self

from redis import exceptions as rex

from durq.brokers import dependencies, limiter
from durq.brokers.batcher import enqueue_coalescer
from durq.brokers.contract import (
    CAP_COMPLETE_AND_CLAIM,
    CAP_COMPLETE_AND_CLAIM_ANY_QUEUE,
    CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS,
    CAP_CROSS_PROCESS_NOTIFY,
    CAP_CROSS_QUEUE_FOLLOW_UPS,
    CAP_CROSS_QUEUE_GROUPS,
    CAP_DEPENDENCIES,
    CAP_MULTI_PROCESS,
    CAP_WAIT_AND_CLAIM,
    EndWatch,
)
from durq.brokers.params import (
    CLAIM_FORWARD,
    ArchivedRetention,
    ArchiveParams,
    Claimed,
    ClaimParams,
    CompleteParams,
    EnqueueOutcome,
    EnqueueParams,
    GroupParams,
    Lease,
    LeaseMove,
    LeaseRef,
    LeaseReport,
    ProgressParams,
    RetryParams,
    SignalParams,
    StepsParams,
    TwinReplace,
    UniqueRelease,
    WorkflowParams,
    check_distinct,
    waiting_follow_up,
)
from durq.brokers.redis.admin import WORKER_TTL, RedisAdmin
from durq.brokers.redis.cluster import key_slot
from durq.brokers.redis.keys import DEFAULT_PREFIX
from durq.brokers.redis.rows import pairs, task_info
from durq.brokers.redis.storage import (
    CONNECT_TIMEOUT,
    DAY_TTL,
    MINUTE_TTL,
    SOCKET_TIMEOUT,
    RedisStorage,
    Scalar,
    ScriptCall,
)
from durq.brokers.redis.wakeup import Blocker, EndWatches, Wakeups
from durq.brokers.redis.wire import error, is_error
from durq.brokers.views import FORGET_WORKERS_AFTER, WorkerInfo
from durq.clock import SYSTEM_CLOCK, Clock, utc_day
from durq.errors import (
    BrokerError,
    DuplicateTaskError,
    TaskIDConflictError,
    TaskNotFoundError,
    ValidationError,
)
from durq.progress import MAX_LOG_LINES
from durq.states import TaskState
from durq.task import TaskInfo

log = logging.getLogger("durq.brokers.redis")

#: Due scheduled/retry tasks forwarded per queue per promote call (and at least per claim).
PROMOTE_BOUND = 1000
#: Tasks one claim script may set aside, held on a full limit key, before it answers (a long
#: run of held tasks at the head of a queue is set aside over several calls, W13).
HOLD_BOUND = 1000
#: Tasks per enqueue_many script call: bounds how long one call holds the server.
ENQUEUE_CHUNK = 500


class RedisBroker:
    """durq on Redis >= 6.2: ``RedisBroker.from_url("redis://host:6379/0?prefix=durq")``, or
    on a Redis Cluster: ``redis+cluster://host:port[,host:port...]/?prefix=durq``.

    The hot path here, the inspector in :class:`RedisAdmin`, wake-ups in :class:`Wakeups`,
    all on one :class:`RedisStorage`."""

    name = "redis"
    #: Cross-queue follow-ups: one script touches two queues' hash slots on a single node;
    #: on a Redis Cluster they go through the outbox. Cross-queue groups: a single node only
    #: (the broker object drops it on a cluster). See docs/brokers/redis.md.
    capabilities = frozenset(
        {
            CAP_MULTI_PROCESS,
            CAP_CROSS_PROCESS_NOTIFY,
            CAP_COMPLETE_AND_CLAIM,
            CAP_COMPLETE_AND_CLAIM_ANY_QUEUE,
            CAP_COMPLETE_AND_CLAIM_FOLLOW_UPS,
            CAP_CROSS_QUEUE_FOLLOW_UPS,
            CAP_CROSS_QUEUE_GROUPS,
            CAP_WAIT_AND_CLAIM,
            CAP_DEPENDENCIES,
        }
    )

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock = SYSTEM_CLOCK,
        connect_timeout: float = CONNECT_TIMEOUT,
        socket_timeout: float = SOCKET_TIMEOUT,
    ) -> None:
        self._storage = RedisStorage(
            url,
            prefix=prefix,
            clock=clock,
            connect_timeout=connect_timeout,
            socket_timeout=socket_timeout,
        )
        self.admin = RedisAdmin(self._storage)
        self._wakeups = Wakeups(self._storage)
        self._blocker = Blocker(self._storage)
        if self._storage.cluster:
            # One script stays in one hash slot; completions of another queue than the
            # claimed one may be on another node, not surely stored before the claim.
            self.capabilities = self.capabilities - {
                CAP_CROSS_QUEUE_GROUPS,
                CAP_COMPLETE_AND_CLAIM_ANY_QUEUE,
            }
        self._ends = EndWatches(self._storage)
        # Two batches in flight: Redis runs one while this process answers the callers of
        # the other and gathers the next, instead of each side waiting for the other (make
        # bench's 50 callers on a quiet machine, about 1.2-1.3x; docs/benchmarks.md). Redis
        # still runs the batches in the order sent: one connection, each batch written
        # after as many round trips as the one before (connect, a new queue's SADD). A
        # cluster's batch is split per node and waits on routing before it is written, so
        # one batch at a time there.
        depth = 1 if self._storage.cluster else 2
        self._batcher = enqueue_coalescer(self._enqueue_one, self.enqueue_many, in_flight=depth)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock = SYSTEM_CLOCK) -> Self:
        """Build from ``redis://host:port/db?prefix=durq`` (also ``rediss://``, ``unix://``,
        ``redis+cluster://`` and ``rediss+cluster://``).

        ``prefix`` is durq's; every other query parameter goes to the connection."""
        clean, prefix = RedisStorage.split_url(url)
        return cls(clean, prefix=prefix, clock=clock)

    @property
    def clock(self) -> Clock:
        """The clock this broker stamps times with (the server's, once measured)."""
        return self._storage.clock

    @property
    def prefix(self) -> str:
        """The key prefix of this broker."""
        return self._storage.keys.prefix

    async def connect(self) -> None:
        """Check the server once: reachable, a Redis, new enough, our layout version."""
        await self._storage.connect()

    async def migrate(self) -> list[str]:
        """Redis needs no schema; this records the layout version under the prefix."""
        return await self._storage.migrate()

    async def pending_migrations(self) -> list[str]:
        """The layout version record, when the prefix has none yet."""
        return await self._storage.pending_migrations()

    async def ping(self) -> None:
        """One cheap round trip."""
        await self._storage.ping()

    async def durability_warnings(self) -> list[str]:
        """Server settings that can lose acknowledged tasks (see docs/guarantees.md)."""
        return await self._storage.durability_warnings()

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Wait for a wake-up published by a script that made a task pending in ``queues``
        (see :mod:`durq.brokers.redis.wakeup`); ``timeout`` bounds the wait."""
        return await self._wakeups.wait(queues, timeout)

    @asynccontextmanager
    async def watch_end(self, queue: str, task_id: str) -> AsyncIterator[EndWatch]:
        """Subscribe to the end of one task: the scripts that complete, archive or delete it
        publish on its end channel (see :class:`durq.brokers.redis.wakeup.EndWatches`)."""
        async with self._ends.watching(queue, task_id) as watch:
            yield watch

    async def close(self) -> None:
        """Stop the wake-up listener and close every connection (idempotent)."""
        await self._wakeups.close()
        await self._ends.close()
        await self._storage.close()

    # -- enqueue --------------------------------------------------------------------------

    @staticmethod
    def _enqueue_outcome(p: EnqueueParams, state: TaskState, reply: Any) -> EnqueueOutcome:
        if isinstance(reply, bytes):  # created, stamped with this clock reading
            return EnqueueOutcome(p, info=RedisStorage.created(p, state, reply))
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

    async def _enqueue_after(self, params: EnqueueParams) -> EnqueueOutcome:
        """enqueue_after.lua: the task, waiting for those of ``params.after`` that have not
        finished, listed by them in the same script."""
        (_, keys, args), state = self._storage.enqueue_call(params, self._storage.clock.now())
        k = self._storage.keys.queue(params.queue)
        keys = [*keys, k.waiting, *(self._storage.keys.queue(q).task(i) for q, i in params.after)]
        async with self._storage.op("enqueue"):
            await self._storage.ensure()
            await self._storage.remember_queues([params.queue])
            reply = await self._storage.eval("enqueue_after", keys, args)
        if reply[0] != b"ok":
            return self._enqueue_outcome(params, state, reply)
        if int(reply[2]):
            state = TaskState.WAITING
        return self._enqueue_outcome(params, state, reply[1])

    async def enqueue_group(self, params: GroupParams) -> list[TaskInfo]:
        """The group's record, every member and the waiting follow-up in one script, or
        nothing."""
        now = self._storage.clock.now()
        qk = self._storage.keys.queue(params.queue)
        if self._storage.cluster:
            self._one_slot(params)
        g = qk.group(params.id)
        keys: list[str] = [g, f"{g}:e"]
        then: list[Scalar] = [""] * 23  # enqueue.lua's 6 KEYS and 17 ARGV
        if params.then is not None:
            (_, then_keys, then_args), _ = self._storage.enqueue_call(params.then, now)
            then = [*then_keys, *then_args]
        then_queue = "" if params.then is None else params.then.queue
        args: list[Scalar] = [
            self._storage.now_arg(),
            len(params.members),
            params.retention,
            *then,
            params.tail,
            then_queue,
        ]
        states: list[TaskState] = []
        for p, entry in zip(params.members, params.unfinished, strict=True):
            (_, more_keys, more_args), state = self._storage.enqueue_call(p, now)
            keys += more_keys
            args += [*more_args, entry]
            states.append(state)
        if params.then is not None:
            keys.append(self._storage.keys.queue(params.then.queue).waiting)
        async with self._storage.op("enqueue_group"):
            await self._storage.ensure()
            queues = [p.queue for p in params.members]
            if params.then is not None:
                queues.append(params.then.queue)
            await self._storage.remember_queues(queues)
            reply = await self._storage.eval("enqueue_group", keys, args)
        if reply[0] != b"ok":
            i = int(reply[1])
            # Index len(members): the follow-up's id is taken.
            refused = params.members[i] if i < len(params.members) else waiting_follow_up(params)
            assert refused is not None
            state = states[i] if i < len(states) else TaskState.WAITING
            error = self._enqueue_outcome(refused, state, [reply[0], reply[2]]).error
            assert error is not None
            raise error
        return [
            self._storage.created(p, s, reply[1])
            for p, s in zip(params.members, states, strict=True)
        ]

    async def enqueue_graph(
        self, items: Sequence[EnqueueParams], workflow: WorkflowParams | None = None
    ) -> list[TaskInfo]:
        """Every task of a graph, waiting for its earlier items, and the workflow's record
        (in its first node's queue) in one script, or nothing. On a Redis Cluster all of
        them must be in queues of one hash slot."""
        if not items:
            return []
        edges = dependencies.graph_edges(items)
        now = self._storage.clock.now()
        check_distinct(items, now)
        if self._storage.cluster:
            slots = {key_slot(self._storage.keys.queue(p.queue).base) for p in items}
            if len(slots) > 1:
                raise ValidationError(
                    "on a Redis Cluster a workflow's tasks must be in queues of one hash slot "
                    f"(one queue): {sorted({p.queue for p in items})}"
                )
        keys: list[str] = []
        args: list[Scalar] = [self._storage.now_arg(), len(items)]
        states: list[TaskState] = []
        for p, e in zip(items, edges, strict=True):
            (_, more_keys, more_args), state = self._storage.enqueue_call(replace(p, after=()), now)
            keys += [*more_keys, self._storage.keys.queue(p.queue).waiting]
            args += [*more_args, ",".join(map(str, e))]
            states.append(TaskState.WAITING if e else state)
        if workflow is not None:
            home = self._storage.keys.queue(workflow.queue)
            keys += [home.workflow(workflow.id), home.workflows, home.workflows_due]
            args += [workflow.id, workflow.name, repr(workflow.retention), workflow.nodes_json()]
        async with self._storage.op("enqueue_graph"):
            await self._storage.ensure()
            await self._storage.remember_queues(list(dict.fromkeys(p.queue for p in items)))
            reply = await self._storage.eval("enqueue_graph", keys, args)
        if reply[0] != b"ok":
            i = int(reply[1])
            error = self._enqueue_outcome(items[i], states[i], [reply[0], reply[2]]).error
            assert error is not None
            raise error
        return [self._storage.created(p, s, reply[1]) for p, s in zip(items, states, strict=True)]

    def _one_slot(self, params: GroupParams) -> None:
        """On a Redis Cluster one script must stay in one hash slot: the group's queue."""
        queues = {p.queue for p in params.members}
        if params.then is not None:
            queues.add(params.then.queue)
        slots = {key_slot(self._storage.keys.queue(q).base) for q in queues | {params.queue}}
        if len(slots) > 1:
            raise ValidationError(
                "on a Redis Cluster a group's members and its follow-up must be in queues of "
                f"one hash slot (those of {params.queue!r}): {sorted(queues)}"
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

        Calls made while another is in flight go together as one ``enqueue_many`` (see
        :mod:`durq.brokers.batcher`)."""
        if connection is not None:
            self._no_connection(connection)
        return await self._batcher.send(params)

    async def _enqueue_one(self, params: EnqueueParams) -> TaskInfo:
        """The hot path of one-by-one enqueue: no context manager, the reply is the clock
        the script read on success and the TaskInfo comes from the params."""
        if params.after:
            outcome = await self._enqueue_after(params)
            if outcome.error is not None:
                raise outcome.error
            assert outcome.info is not None
            return outcome.info
        plain = self._storage.plain_call(params)
        try:
            if not self._storage.ready:
                await self.connect()
            if params.queue not in self._storage.known_queues:
                await self._storage.remember_queues([params.queue])
            if plain is not None:
                reply = await self._storage.eval(*plain)
                if reply is not None:
                    return self._storage.created(params, TaskState.PENDING, reply)
                # Its id is taken: enqueue.lua decides (a conflict, or a stale holder).
            call, state = self._storage.enqueue_call(params, self._storage.clock.now())
            reply = await self._storage.eval(*call)
        except Exception as exc:
            mapped = self._storage.mapped(exc, "enqueue")
            if mapped is exc:
                raise
            raise mapped from exc
        if not isinstance(reply, bytes):
            error = self._enqueue_outcome(params, state, reply).error
            assert error is not None
            raise error
        return self._storage.created(params, state, reply)

    async def enqueue_many(
        self, items: Sequence[EnqueueParams], *, connection: Any = None
    ) -> list[EnqueueOutcome]:
        """One round trip: per queue, one enqueue_many script per chunk of up to
        ``ENQUEUE_CHUNK`` items, all chunks in one pipeline; one outcome per item (E9)."""
        self._no_connection(connection)
        if not items:
            return []
        if any(p.after for p in items):  # one script each, with its dependencies' keys
            return [await self._enqueue_after(p) for p in items]
        now = self._storage.clock.now()
        by_queue: dict[str, list[int]] = defaultdict(list)
        for i, p in enumerate(items):
            by_queue[p.queue].append(i)
        states: list[TaskState] = [TaskState.PENDING] * len(items)
        calls: list[ScriptCall] = []
        chunks: list[list[int]] = []
        for queue, indexes in by_queue.items():
            k = self._storage.keys.queue(queue)
            for first in range(0, len(indexes), ENQUEUE_CHUNK):
                chunk = indexes[first : first + ENQUEUE_CHUNK]
                keys = [k.pending, k.scheduled, k.completed, k.unique, k.seq]
                args: list[Scalar] = [self._storage.now_arg(), k.notify]
                for i in chunk:
                    p = items[i]
                    keys.append(k.task(p.id))
                    fields, states[i] = self._storage.enqueue_fields(p, k, now)
                    args += fields
                calls.append(("enqueue_many", keys, args))
                chunks.append(chunk)
        async with self._storage.op("enqueue_many"):
            await self._storage.ensure()
            await self._storage.remember_queues(list(by_queue))
            replies = await self._storage.eval_many(calls)
        outcomes: list[EnqueueOutcome | None] = [None] * len(items)
        for chunk, reply in zip(chunks, replies, strict=True):
            for i, item_reply in zip(chunk, reply, strict=True):
                outcomes[i] = self._enqueue_outcome(items[i], states[i], item_reply)
        return [o for o in outcomes if o is not None]

    # -- claim and leases -----------------------------------------------------------------

    async def claim(self, params: ClaimParams) -> list[Lease]:
        """Fill up to ``limit`` leases from the queues in order: one script per queue."""
        leases = Claimed()
        # Level-triggered wake-ups: what was published before this claim started is covered
        # by it; only notifications from now on make the next wait_for_work return at once.
        await self._wakeups.before_claim(params.queues)
        async with self._storage.op("claim"):
            await self._storage.ensure()
            await self._claim_into(leases, self._claim_groups(params.queues), params)
        return leases

    async def wait_and_claim(self, claim: ClaimParams, timeout: float) -> Claimed | None:
        """Wait for work and claim it in one step, on a single node (``None`` on a cluster):
        BLPOP on the queues' token lists with the claim script of all of them behind it
        (see :class:`~durq.brokers.redis.wakeup.Blocker`). A token whose claim found
        nothing (another worker was first) means waiting on; a claim that leaves tasks behind
        passes the token to the next blocked worker. Cancelled, it unblocks at once and
        hands back what the claim behind the wait leased."""
        groups = self._claim_groups(claim.queues)
        if len(groups) != 1 or claim.limit <= 0 or not self._blocker.available:
            return None  # the claim behind the wait must be one script
        (queues,) = groups
        tokens = [self._storage.keys.queue(queue).notify for queue in queues]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        async with self._storage.op("wait_and_claim"):
            await self._storage.ensure()
            while True:
                seconds = min(max(deadline - loop.time(), 0.01), self._blocker.longest)
                name, keys, args = self._claim_call(queues, claim.limit, claim)
                command = self._storage.evalsha(name, keys, args)
                call = asyncio.ensure_future(self._blocker.block_then(tokens, seconds, command))
                try:
                    answer = await asyncio.shield(call)
                except asyncio.CancelledError:
                    await self._hand_back(queues, call)
                    raise
                if answer is None:
                    return None  # refused by the server: wait on the subscription instead
                woken, reply = answer
                if is_error(reply):
                    exc = error(reply)
                    if not isinstance(exc, rex.NoScriptError):
                        raise exc
                    reply = await self._storage.eval(
                        name, keys, args
                    )  # loads it; the token is spent
                leases = Claimed()
                self._take(queues, reply, leases)
                if leases or leases.wake_at is not None or not woken or loop.time() >= deadline:
                    return leases

    async def _hand_back(
        self, queues: Sequence[str], call: asyncio.Future[tuple[bool, Any] | None]
    ) -> None:
        """After a cancelled wait: end the block, then put back to pending, uncounted, what
        the claim behind it leased. A failure here leaves those leases to expire."""
        try:
            await self._blocker.unblock()
            answer = await asyncio.wait_for(call, self._blocker.longest + 1.0)
            if answer is None or is_error(answer[1]):
                return
            reply = answer[1]
            leases = Claimed()
            self._take(queues, reply, leases)
            if leases:
                await self._storage.eval_many(
                    [
                        self._requeue_call(lease.ref, limiter.keeps(lease.task.limits))
                        for lease in leases
                    ]
                )
        except Exception as exc:
            log.warning("tasks claimed as the worker stopped were not handed back: %s", exc)

    async def complete_and_claim(
        self, items: Sequence[CompleteParams], claim: ClaimParams
    ) -> tuple[list[bool], list[Lease]]:
        """The complete scripts and the claim script in one pipeline: Redis runs them in the
        order sent, so the completions are stored before the claim. On a cluster the claim
        of the first queue only rides (completions of that queue only: one node), the other
        queues' claims follow."""
        queues = list(dict.fromkeys(claim.queues))
        now = self._storage.clock.now()
        leases = Claimed()
        await self._wakeups.before_claim(queues)
        async with self._storage.op("complete_and_claim"):
            await self._storage.ensure()
            await self._remember_follow_ups(items)
            day = utc_day(now)
            calls = [self._complete_call(p, now, day) for p in items]
            first, *rest = self._claim_groups(queues)
            *replies, answer = await self._storage.eval_many(
                [*calls, self._claim_call(first, claim.limit, claim)]
            )
            self._take(first, answer, leases)
            await self._claim_into(leases, rest, claim)
        done = [bool(r) for r in replies]
        await self._drain_follow_ups(items, done)
        return done, leases

    async def _claim_into(
        self, leases: Claimed, groups: Sequence[Sequence[str]], params: ClaimParams
    ) -> None:
        """Claim from the queues of ``groups`` (:meth:`_claim_groups`), in order, into
        ``leases``, up to ``params.limit`` in all: one script call a group."""
        for group in groups:
            remaining = params.limit - len(leases)
            if remaining <= 0:
                break
            self._take(
                group, await self._storage.eval(*self._claim_call(group, remaining, params)), leases
            )

    def _claim_groups(self, queues: Sequence[str]) -> list[list[str]]:
        """The distinct ``queues``, in order, split into the queues of one claim script
        each: all of them on a single node, one a script on a cluster (its slot)."""
        unique = list(dict.fromkeys(queues))
        if self._storage.cluster:
            return [[queue] for queue in unique]
        return [unique] if unique else []

    def _claim_call(self, queues: Sequence[str], limit: int, params: ClaimParams) -> ScriptCall:
        keys: list[str] = []
        args: list[Scalar] = [
            self._storage.now_arg(),
            limit,
            float(params.lease_seconds),
            params.worker_id,
            secrets.token_hex(8),
            max(limit, CLAIM_FORWARD),
            HOLD_BOUND,
        ]
        for queue in queues:
            k = self._storage.keys.queue(queue)
            keys += [
                k.pending,
                k.scheduled,
                k.retry,
                k.active,
                k.paused,
                k.limits,
                k.held,
                k.limit_waiting,
            ]
            args += [k.task_prefix, k.notify]
        return "claim", keys, args

    @staticmethod
    def _take(queues: Sequence[str], reply: Any, leases: Claimed) -> None:
        """Add the leases of one claim script's ``reply`` (one list per queue) to ``leases``."""
        per_queue, wake_at = reply
        for queue, rows in zip(queues, per_queue, strict=True):
            for token, flat in rows:
                leases.append(Lease(task_info(queue, flat), token.decode()))
        if wake_at and (leases.wake_at is None or float(wake_at) < leases.wake_at):
            leases.wake_at = float(wake_at)

    async def extend_leases(self, leases: Sequence[LeaseRef], lease_seconds: float) -> LeaseReport:
        """One extend script per queue, all in one pipeline."""
        if not leases:
            return LeaseReport()
        by_queue: dict[str, list[LeaseRef]] = defaultdict(list)
        for ref in leases:
            by_queue[ref.queue].append(ref)
        calls: list[ScriptCall] = []
        for queue, refs in by_queue.items():
            k = self._storage.keys.queue(queue)
            args: list[Scalar] = [self._storage.now_arg(), k.task_prefix, float(lease_seconds)]
            for ref in refs:
                k.task(ref.id)  # validates the id
                args += [ref.id, ref.token]
            calls.append(("extend", [k.active], args))
        async with self._storage.op("extend_leases"):
            await self._storage.ensure()
            replies = await self._storage.eval_many(calls)
        lost: set[str] = set()
        cancel: set[str] = set()
        for lost_ids, cancel_ids in replies:
            lost.update(i.decode() for i in lost_ids)
            cancel.update(i.decode() for i in cancel_ids)
        return LeaseReport(lost=frozenset(lost), cancel=frozenset(cancel))

    def _complete_call(self, p: CompleteParams, now: float, day: date | None = None) -> ScriptCall:
        k = self._storage.keys.queue(p.lease.queue)
        call: ScriptCall = (
            "complete",
            [
                k.task(p.lease.id),
                k.active,
                k.completed,
                k.unique,
                k.stats,
                k.stats_day(day or utc_day(now)),
                k.minutes(day or utc_day(now)),
                k.limits,
                k.limit_waiting,
            ],
            [
                p.lease.token,
                self._storage.now_arg(),
                float(p.retention),
                "",
                "1" if p.result is not None else "0",
                p.result or b"",
                DAY_TTL,
                MINUTE_TTL,
                k.notify,
            ],
        )
        name, keys, args = self._storage.with_follow_ups(call, p.follow_ups, now)
        # A group member's outcome goes last (see complete.lua).
        return name, keys, [*args, *self._storage.member_args(p.group)]

    async def complete(self, params: CompleteParams) -> bool:
        """Completed (kept for its retention) or deleted; False if the lease is lost.
        Its follow-ups are created by the same script."""
        call = self._complete_call(params, self._storage.clock.now())
        async with self._storage.op("complete"):
            await self._storage.ensure()
            if params.follow_ups:
                await self._storage.remember_queues([p.queue for p in params.follow_ups])
            done = bool(await self._storage.eval(*call))
        if done and params.follow_ups:
            await self._drain(self._storage.outbox_queues(params.lease.queue, params.follow_ups))
        return done

    async def _drain(self, queues: Sequence[str]) -> None:
        """Create the follow-ups a script left in these queues' outboxes (a cluster, another
        slot). The outcome they follow is stored already, so a failure here is only logged:
        the next promote_due of any worker creates them."""
        if not queues:
            return
        try:
            async with self._storage.op("drain_outboxes"):
                await self._storage.drain_outboxes(queues)
        except BrokerError as exc:
            log.warning("follow-ups of %s stay in the outbox until the next promotion: %s",
                        ", ".join(queues), exc)  # fmt: skip

    async def complete_many(self, items: Sequence[CompleteParams]) -> list[bool]:
        """Several complete scripts in one pipeline."""
        if not items:
            return []
        now = self._storage.clock.now()
        async with self._storage.op("complete_many"):
            await self._storage.ensure()
            await self._remember_follow_ups(items)
            day = utc_day(now)  # once per batch, not per task
            replies = await self._storage.eval_many(
                [self._complete_call(p, now, day) for p in items]
            )
        done = [bool(r) for r in replies]
        await self._drain_follow_ups(items, done)
        return done

    async def _remember_follow_ups(self, items: Sequence[CompleteParams]) -> None:
        follow_queues = [f.queue for p in items for f in p.follow_ups]
        if follow_queues:
            await self._storage.remember_queues(follow_queues)

    async def _drain_follow_ups(self, items: Sequence[CompleteParams], done: list[bool]) -> None:
        await self._drain(
            [
                q
                for p, ok in zip(items, done, strict=True)
                if ok and p.follow_ups
                for q in self._storage.outbox_queues(p.lease.queue, p.follow_ups)
            ]
        )

    def _lease_move_call(self, p: LeaseMove, now: float, day: date) -> ScriptCall:
        """The retry.lua or archive.lua call of one fenced move (with its follow-ups)."""
        k = self._storage.keys.queue(p.lease.queue)
        expired_by: Scalar = "" if p.expired_by is None else float(p.expired_by)
        lost = "1" if p.lost else "0"
        if isinstance(p, RetryParams):
            return (
                "retry",
                [
                    k.task(p.lease.id),
                    k.active,
                    k.scheduled if p.snooze else k.retry,
                    k.stats,
                    k.stats_day(day),
                    k.minutes(day),
                    k.limits,
                    k.limit_waiting,
                    k.pending,
                    k.waiting,
                    k.awaiting,
                ],
                [
                    p.lease.token,
                    p.error,
                    max(0.0, float(p.delay)),
                    DAY_TTL,
                    lost,
                    expired_by,
                    k.notify if p.delay <= 0 else "",
                    p.traceback or "",
                    self._storage.now_arg(),
                    MINUTE_TTL,
                    k.notify,
                    "1" if p.snooze else "0",
                    p.awaits or "",
                    "1" if p.keep else "0",
                ],
            )
        call: ScriptCall = (
            "archive",
            [
                k.task(p.lease.id),
                k.active,
                k.archived,
                k.unique,
                k.stats,
                k.stats_day(day),
                k.minutes(day),
                k.limits,
                k.limit_waiting,
            ],
            [
                p.lease.token,
                self._storage.now_arg(),
                p.error,
                "1" if p.count_attempt else "0",
                DAY_TTL,
                lost,
                expired_by,
                MINUTE_TTL,
                k.notify,
            ],
        )
        name, keys, args = self._storage.with_follow_ups(call, p.follow_ups, now)
        # The traceback and a group member's outcome go last, after the follow-ups'
        # arguments (see archive.lua).
        return name, keys, [*args, p.traceback or "", *self._storage.member_args(p.group)]

    async def move_leases(self, moves: Sequence[LeaseMove]) -> list[bool]:
        """One retry/archive script per move (each atomic with its follow-ups), all in one
        pipeline."""
        if not moves:
            return []
        now = self._storage.clock.now()
        day = utc_day(now)
        calls = [self._lease_move_call(p, now, day) for p in moves]
        async with self._storage.op("move_leases"):
            await self._storage.ensure()
            await self._remember_follow_up_queues(moves)
            replies = await self._storage.eval_many(calls)
        done = [bool(r) for r in replies]
        await self._drain(
            [
                q
                for p, ok in zip(moves, done, strict=True)
                if ok and isinstance(p, ArchiveParams) and p.follow_ups
                for q in self._storage.outbox_queues(p.lease.queue, p.follow_ups)
            ]
        )
        return done

    async def _remember_follow_up_queues(self, moves: Sequence[LeaseMove]) -> None:
        queues = [f.queue for p in moves if isinstance(p, ArchiveParams) for f in p.follow_ups]
        if queues:
            await self._storage.remember_queues(queues)

    async def retry(self, params: RetryParams) -> bool:
        """retry for ``delay`` seconds, retried + 1; False if the lease is lost."""
        return await self._move_one("retry", params)

    async def archive(self, params: ArchiveParams) -> bool:
        """archived with ``error``; False if the lease is lost."""
        return await self._move_one("archive", params)

    async def _move_one(self, op: str, params: LeaseMove) -> bool:
        now = self._storage.clock.now()
        call = self._lease_move_call(params, now, utc_day(now))
        async with self._storage.op(op):
            await self._storage.ensure()
            await self._remember_follow_up_queues([params])
            done = bool(await self._storage.eval(*call))
        if done and isinstance(params, ArchiveParams) and params.follow_ups:
            await self._drain(self._storage.outbox_queues(params.lease.queue, params.follow_ups))
        return done

    async def report_progress(self, params: ProgressParams) -> bool:
        """Store an attempt's progress and log lines, fenced by its token (one script on
        the task's hash, which appends and trims the log)."""
        k = self._storage.keys.queue(params.lease.queue)
        async with self._storage.op("report_progress"):
            await self._storage.ensure()
            held = await self._storage.eval(
                "progress",
                [k.task(params.lease.id)],
                [
                    params.lease.token,
                    "0" if params.progress is None else "1",
                    params.progress or "",
                    MAX_LOG_LINES,
                    "\n".join(params.lines),
                ],
            )
        return bool(held)

    async def read_steps(self, lease: LeaseRef) -> str | None:
        """The stored steps of a leased task (``None``: none, or the lease is gone)."""
        k = self._storage.keys.queue(lease.queue)
        async with self._storage.op("read_steps"):
            await self._storage.ensure()
            raw = await self._storage.eval("steps_read", [k.task(lease.id)], [lease.token])
        return raw.decode("utf-8") if isinstance(raw, bytes) else raw or None

    async def read_signals(self, lease: LeaseRef) -> str | None:
        """The signals of a leased task as one JSON object's text, each payload as it was
        sent (``None``: none, or the lease is gone)."""
        k = self._storage.keys.queue(lease.queue)
        async with self._storage.op("read_signals"):
            await self._storage.ensure()
            raw = await self._storage.eval("signals_read", [k.task(lease.id)], [lease.token])
        return raw.decode("utf-8") if isinstance(raw, bytes) else raw or None

    async def signal(self, params: SignalParams) -> str:
        """Store a signal on its task and wake the task if it waits for it: one script on
        the queue's slot (see scripts/signal.lua)."""
        k = self._storage.keys.queue(params.queue)
        async with self._storage.op("signal"):
            await self._storage.ensure()
            reply = await self._storage.eval(
                "signal",
                [k.task(params.id), k.waiting, k.pending, k.awaiting],
                [params.name, params.payload, self._storage.now_arg(), k.notify],
            )
        outcome = bytes(reply).decode()
        if outcome == "missing":
            raise TaskNotFoundError(f"no task {params.id!r} in queue {params.queue!r}")
        return outcome

    async def free_unique(self, params: UniqueRelease) -> bool:
        """Free a twin's unique key while it is in one of ``params.states``: one script on
        the queue's slot (scripts/free_unique.lua)."""
        k = self._storage.keys.queue(params.queue)
        states = [TaskState(s).value for s in params.states]
        async with self._storage.op("free_unique"):
            await self._storage.ensure()
            reply = await self._storage.eval(
                "free_unique", [k.task(params.id), k.unique], [params.key, *states]
            )
        return bool(reply == 1)

    async def replace_twin(self, params: TwinReplace) -> TaskInfo | None:
        """Change a waiting twin in place (see :class:`TwinReplace`): one script on the
        queue's slot (scripts/replace_twin.lua)."""
        k = self._storage.keys.queue(params.queue)
        args: list[Scalar] = [
            self._storage.now_arg(),
            params.key,
            params.payload,
            "" if params.delay is None else max(0.0, float(params.delay)),
            "" if params.within is None else float(params.within),
            "" if params.priority is None else int(params.priority),
        ]
        async with self._storage.op("replace_twin"):
            await self._storage.ensure()
            row = await self._storage.eval(
                "replace_twin", [k.task(params.id), k.scheduled, k.unique], args
            )
        return task_info(params.queue, row) if row else None

    async def read_snoozes(self, lease: LeaseRef) -> int | None:
        """How often a leased task was snoozed (``None``: the lease is gone)."""
        k = self._storage.keys.queue(lease.queue)
        async with self._storage.op("read_snoozes"):
            await self._storage.ensure()
            raw = await self._storage.eval("snoozes_read", [k.task(lease.id)], [lease.token])
        return None if raw is None or raw is False else int(raw)

    async def record_steps(self, params: StepsParams) -> bool:
        """Store an attempt's durable steps, fenced by its token (one script on the hash)."""
        async with self._storage.op("record_steps"):
            await self._storage.ensure()
            held = await self._storage.eval(*self._steps_call(params))
        return bool(held)

    async def record_steps_many(self, items: Sequence[StepsParams]) -> list[bool]:
        """Several steps_record scripts in one pipeline (in order; each fenced on its own)."""
        if not items:
            return []
        async with self._storage.op("record_steps_many"):
            await self._storage.ensure()
            replies = await self._storage.eval_many([self._steps_call(p) for p in items])
        return [bool(r) for r in replies]

    def _steps_call(self, params: StepsParams) -> ScriptCall:
        """The steps_record.lua call of one attempt's steps."""
        lease = params.lease
        task = self._storage.keys.queue(lease.queue).task(lease.id)
        return ("steps_record", [task], [lease.token, params.steps])

    async def requeue(self, lease: LeaseRef, keep: bool = False) -> bool:
        """Hand an active task back as pending without counting an attempt (W7); ``keep``:
        it keeps its sequences' keys (W25)."""
        async with self._storage.op("requeue"):
            await self._storage.ensure()
            return bool(await self._storage.eval(*self._requeue_call(lease, keep)))

    def _requeue_call(self, lease: LeaseRef, keep: bool = False) -> ScriptCall:
        k = self._storage.keys.queue(lease.queue)
        return (
            "requeue",
            [k.task(lease.id), k.active, k.pending, k.limits, k.limit_waiting],
            [lease.token, k.notify, self._storage.now_arg(), "1" if keep else "0"],
        )

    # -- maintenance ----------------------------------------------------------------------

    async def promote_due(self) -> int:
        """Forward due scheduled/retry tasks and waits for a signal whose time ran out, of
        every known queue (one pipeline)."""
        async with self._storage.op("promote_due"):
            await self._storage.ensure()
            queues = await self._storage.all_queues()
            if not queues:
                return 0
            now = self._storage.now_arg()
            calls: list[ScriptCall] = []
            for q in queues:
                k = self._storage.keys.queue(q)
                calls.append(
                    (
                        "promote",
                        [k.pending, k.scheduled, k.retry, k.waiting, k.awaiting],
                        [now, k.task_prefix, PROMOTE_BOUND, k.notify],
                    )
                )
            promoted = sum(int(n) for n in await self._storage.eval_many(calls))
            if self._storage.cluster:
                # Follow-ups whose creation was cut short (a crash between the two steps).
                await self._storage.drain_outboxes(queues)
            return promoted

    async def expired_leases(self, limit: int) -> list[Lease]:
        """Expired leases of every known queue (one pipeline), oldest expiry first."""
        async with self._storage.op("expired_leases"):
            await self._storage.ensure()
            queues = await self._storage.all_queues()
            if not queues:
                return []
            now = self._storage.now_arg()
            calls: list[ScriptCall] = []
            for q in queues:
                k = self._storage.keys.queue(q)
                calls.append(("expired", [k.active], [now, k.task_prefix, limit]))
            replies = await self._storage.eval_many(calls)
        leases = [
            Lease(task_info(q, row), pairs(row)["token"].decode())
            for q, rows in zip(queues, replies, strict=True)
            for row in rows
        ]
        leases.sort(key=lambda lease: lease.task.lease_expires_at or 0)
        return leases[:limit]

    async def delete_archived(self, retention: ArchivedRetention, limit: int) -> int:
        """Delete up to ``limit`` archived tasks past their queue's archived retention."""
        if retention.keeps_all:
            return 0
        deleted = 0
        async with self._storage.op("delete_archived"):
            await self._storage.ensure()
            now = self._storage.now_arg()
            for q in await self._storage.all_queues():
                keep = retention.of(q)
                if deleted >= limit:
                    break
                if keep is None:
                    continue
                k = self._storage.keys.queue(q)
                deleted += int(
                    await self._storage.eval(
                        "janitor_archived",
                        [k.archived],
                        [now, repr(float(keep)), k.task_prefix, limit - deleted],
                    )
                )
        return deleted

    async def delete_expired(self, limit: int) -> int:
        """Janitor: delete up to ``limit`` completed tasks past their retention."""
        deleted = 0
        async with self._storage.op("delete_expired"):
            await self._storage.ensure()
            now = self._storage.now_arg()
            for q in await self._storage.all_queues():
                if deleted >= limit:
                    break
                k = self._storage.keys.queue(q)
                deleted += int(
                    await self._storage.eval(
                        "janitor", [k.completed], [now, k.task_prefix, limit - deleted]
                    )
                )
            await self._drop_workflows(now, limit)
        return deleted

    async def _drop_workflows(self, now: Scalar, limit: int) -> None:
        """Up to ``limit`` workflow records past their retention: each dropped if none of
        its nodes' tasks is left, else looked at again a minute later (one script each)."""
        left = limit
        for q in await self._storage.all_queues():
            if left <= 0:
                break
            k = self._storage.keys.queue(q)
            due = self._storage.clock.now() if now == "" else now
            ids: Any = await self._storage.command(
                "ZRANGEBYSCORE", k.workflows_due, "-inf", repr(due), "LIMIT", 0, left
            )
            for raw in ids:
                wf_id = bytes(raw).decode()
                record = k.workflow(wf_id)
                nodes = await self._storage.command("HGET", record, "nodes")
                tasks = [
                    self._storage.keys.queue(n[1]).task(n[2])
                    for n in (json.loads(nodes) if nodes else [])
                ]
                keys = [record, k.workflows, k.workflows_due, *tasks]
                await self._storage.eval("janitor_workflow", keys, [now, wf_id])
                left -= 1

    # -- wake-ups -------------------------------------------------------------------------

    # -- workers --------------------------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        """Insert or refresh a worker's record (its heartbeat); makes its queues known."""
        async with self._storage.op("register_worker"):
            await self._storage.ensure()
            await self._storage.sync_clock()  # rides the heartbeat, once a minute
            now = self._storage.clock.now()
            data = asdict(info)
            data["last_heartbeat"] = now
            for q in info.queues:
                self._storage.keys.queue(q)  # validate before storing
            commands: list[tuple[Scalar, ...]] = [
                ("SET", self._storage.keys.worker(info.id), json.dumps(data), "EX", WORKER_TTL),
                ("ZADD", self._storage.keys.workers, now, info.id),
                # Forget silent workers (their records have expired anyway).
                (
                    "ZREMRANGEBYSCORE",
                    self._storage.keys.workers,
                    "-inf",
                    now - FORGET_WORKERS_AFTER,
                ),
            ]
            if info.queues:
                commands.append(("SADD", self._storage.keys.queues, *info.queues))
            await self._storage.commands(commands)
            self._storage.known_queues.update(info.queues)

    async def unregister_worker(self, worker_id: str) -> None:
        """Remove a worker's record at shutdown."""
        async with self._storage.op("unregister_worker"):
            await self._storage.ensure()
            await self._storage.commands(
                [
                    ("ZREM", self._storage.keys.workers, worker_id),
                    ("DEL", self._storage.keys.worker(worker_id)),
                ]
            )
