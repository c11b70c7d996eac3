"""The inspector's seam (:class:`~durq.brokers.contract.Admin`) on Redis."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from datetime import timedelta
from typing import Any

from durq.brokers import limiter
from durq.brokers.params import LimitOverride, TaskMove, TaskRewrite
from durq.brokers.redis.keys import QueueKeys
from durq.brokers.redis.rows import pairs, stored_counter, task_info, task_outcome
from durq.brokers.redis.storage import RedisStorage, ScriptCall
from durq.brokers.views import (
    WORKER_VISIBLE_FOR,
    FairDepth,
    GroupInfo,
    GroupMemberInfo,
    LimitStats,
    MinuteCounts,
    QueueStats,
    ScheduleRecord,
    TaskOutcome,
    TaskSearch,
    TaskSearchResult,
    UniqueHold,
    UniqueHolds,
    WorkerInfo,
    WorkflowNodeInfo,
    WorkflowPage,
    WorkflowQuery,
    WorkflowRecord,
    fair_depth,
    first_counted_minute,
    next_cursor,
    workflow_cursor,
)
from durq.clock import utc_day
from durq.errors import (
    GroupNotFoundError,
    QueueNotFoundError,
    TaskNotFoundError,
    WorkflowNotFoundError,
)
from durq.options import MAX_PRIORITY, MIN_PRIORITY
from durq.states import TaskState
from durq.task import TaskInfo

#: Tasks moved per script call by run_all / delete_all (each call is atomic and short).
BATCH = 500
#: A search reads at most this many tasks of the state, oldest first, in chunks of
#: SEARCH_CHUNK, and says when it stopped before the end (Redis cannot filter server-side
#: without a script that scans, which would block the server).
SEARCH_SCAN = 10_000
SEARCH_CHUNK = 250
#: ``fair_partitions`` reads a queue's pending, held and active tasks in script calls of
#: this many entries each, so that none holds the server long.
PARTITION_SLICE = 500
#: ``list_unique`` reads at most this many unique locks of a queue (in HSCAN steps), and
#: says when it stopped before the end.
UNIQUE_SCAN = 10_000
#: Worker records expire after this long without a heartbeat (server time; garbage only).
WORKER_TTL = 3600


#: Priority bands of the pending zset (one per priority, see scripts/_lib.lua).
PRIORITY_BANDS = MAX_PRIORITY - MIN_PRIORITY + 1


#: What a workflow's listing reads of each node's task hash.
_NODE_FIELDS = ("state", "retried", "last_error", "expires_at")


class RedisAdmin:
    """The Admin seam on a :class:`RedisStorage`: list, count, move tasks and queues; workers."""

    def __init__(self, storage: RedisStorage) -> None:
        self._storage = storage

    # -- helpers --------------------------------------------------------------------------

    async def _known(self, queue: str) -> QueueKeys:
        k = self._storage.keys.queue(queue)
        if not await self._storage.command("SISMEMBER", self._storage.keys.queues, queue):
            raise QueueNotFoundError(f"no queue named {queue!r}")
        return k

    def _task_keys(self, k: QueueKeys, task_id: str) -> list[str]:
        # The fixed KEYS layout of the admin_* single-task scripts.
        return [
            k.task(task_id),
            k.pending,
            k.scheduled,
            k.retry,
            k.active,
            k.completed,
            k.archived,
            k.unique,
            k.held,
        ]

    async def _stats(self, queue: str, now: float) -> QueueStats:
        k = self._storage.keys.queue(queue)
        r = await self._storage.commands(
            [
                ("EXISTS", k.paused),
                ("ZCARD", k.pending),
                ("ZCARD", k.scheduled),
                ("ZCARD", k.active),
                ("ZCARD", k.retry),
                ("ZCARD", k.archived),
                ("ZCOUNT", k.completed, f"({now!r}", "+inf"),
                ("HMGET", k.stats, "processed", "failed"),
                ("HMGET", k.stats_day(utc_day(now)), "processed", "failed"),
                ("ZCARD", k.held),
                ("ZCARD", k.waiting),
            ]
        )
        oldest = await self._storage.eval("oldest_pending", [k.pending], [PRIORITY_BANDS])
        unique_keys = await self._storage.eval("unique_count", [k.unique], [repr(now)])
        total, today = r[7], r[8]
        return QueueStats(
            name=queue,
            paused=bool(r[0]),
            sizes={
                TaskState.PENDING: r[1] + r[9],  # held tasks are pending too (W13)
                TaskState.SCHEDULED: r[2],
                TaskState.ACTIVE: r[3],
                TaskState.RETRY: r[4],
                TaskState.ARCHIVED: r[5],
                TaskState.COMPLETED: r[6],
                TaskState.WAITING: r[10],
            },
            oldest_pending_age=max(0.0, now - float(oldest)) if oldest else 0.0,
            processed_today=int(today[0] or 0),
            failed_today=int(today[1] or 0),
            processed_total=int(total[0] or 0),
            failed_total=int(total[1] or 0),
            unique_keys=int(unique_keys),
        )

    # -- Admin ----------------------------------------------------------------------------

    async def list_queues(self) -> list[QueueStats]:
        """Every known queue (enqueued into, served by a worker, or paused)."""
        async with self._storage.op("list_queues"):
            await self._storage.ensure()
            now = self._storage.clock.now()
            return [await self._stats(q, now) for q in await self._storage.all_queues()]

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue; QueueNotFoundError if unknown."""
        async with self._storage.op("queue_stats"):
            await self._storage.ensure()
            await self._known(queue)
            return await self._stats(queue, self._storage.clock.now())

    async def list_tasks(
        self, queue: str, state: TaskState, *, limit: int = 50, offset: int = 0
    ) -> list[TaskInfo]:
        """Tasks of one queue in one state in zset order: oldest first (time, then enqueue);
        pending ones in claim order (priority first)."""
        state = TaskState(state)
        async with self._storage.op("list_tasks"):
            await self._storage.ensure()
            k = await self._known(queue)
            if limit <= 0:
                return []
            members = await self._page(k, state, offset, limit)
            if not members:
                return []
            rows = await self._storage.commands(
                [("HGETALL", k.task(m[16:].decode())) for m in members]
            )
            return [task_info(queue, row) for row in rows if row]

    async def _page(self, k: QueueKeys, state: TaskState, start: int, count: int) -> list[bytes]:
        """Members ``start`` to ``start + count`` of one state in its order; pending ones
        held on a limit key come after the claimable ones."""
        zset = k.by_state(state.value)
        members = list(await self._members(zset, state is TaskState.COMPLETED, start, count))
        if state is TaskState.PENDING and len(members) < count:
            members += await self._held_members(k, start, count - len(members))
        return members

    async def _held_members(self, k: QueueKeys, offset: int, count: int) -> list[bytes]:
        """Pending tasks held on a limit key come after the claimable ones (W13)."""
        start = max(0, offset - int(await self._storage.command("ZCARD", k.pending)))
        held: Any = await self._storage.command("ZRANGE", k.held, start, start + count - 1)
        return [bytes(h).rsplit(b"\0", 1)[1] for h in held]  # the member ends the entry

    async def _members(self, zset: str, completed: bool, start: int, count: int) -> Any:
        if completed:
            # Past their retention they count as gone, even before the janitor runs.
            now = self._storage.clock.now()
            return await self._storage.command(
                "ZRANGEBYSCORE", zset, f"({now!r}", "+inf", "LIMIT", start, count
            )
        return await self._storage.command("ZRANGE", zset, start, start + count - 1)

    async def search_tasks(self, search: TaskSearch) -> TaskSearchResult:
        """Tasks of one queue and state passing the filter: the state's first
        ``SEARCH_SCAN`` tasks are read in order and tested here; ``complete`` says whether
        that reached the end."""
        state = TaskState(search.state)
        hits: list[TaskInfo] = []
        total = scanned = 0
        complete = False
        async with self._storage.op("search_tasks"):
            await self._storage.ensure()
            k = await self._known(search.queue)
            while scanned < SEARCH_SCAN:
                count = min(SEARCH_CHUNK, SEARCH_SCAN - scanned)
                members = await self._page(k, state, scanned, count)
                if members:
                    rows = await self._storage.commands(
                        [("HGETALL", k.task(m[16:].decode())) for m in members]
                    )
                    for row in rows:
                        info = task_info(search.queue, row) if row else None
                        if info is None or not search.filter.matches(info):
                            continue
                        if search.offset <= total < search.offset + search.limit:
                            hits.append(info)
                        total += 1
                scanned += len(members)
                if len(members) < count:
                    complete = True
                    break
            if not complete:
                complete = not await self._page(k, state, scanned, 1)
        return TaskSearchResult(hits, total, complete=complete, scanned=scanned)

    async def minute_counts(self, queue: str | None, since: float) -> list[MinuteCounts]:
        """Per-minute counters from the minute of ``since`` on: the day hashes that cover
        the span, of one queue or of every queue, read in one pipeline."""
        sums: dict[int, list[int]] = {}
        async with self._storage.op("minute_counts"):
            await self._storage.ensure()
            now = self._storage.clock.now()
            start = first_counted_minute(since, now)
            days = [utc_day(start)]
            while days[-1] < utc_day(now):
                days.append(days[-1] + timedelta(days=1))
            queues = [queue] if queue is not None else await self._storage.all_queues()
            keys = [self._storage.keys.queue(q).minutes(day) for q in queues for day in days]
            replies = await self._storage.commands([("HGETALL", key) for key in keys])
        for reply in replies:
            for field, value in pairs(reply).items():
                kind, _, minute = field.partition(":")
                if int(minute) >= start:
                    counters = sums.setdefault(int(minute), [0, 0])
                    counters[kind == "f"] += int(value)
        return [MinuteCounts(m, p, f) for m, (p, f) in sorted(sums.items())]

    async def get_task(self, queue: str, task_id: str) -> TaskInfo:
        """One task; TaskNotFoundError if absent or completed past its retention."""
        k = self._storage.keys.queue(queue)
        async with self._storage.op("get_task"):
            await self._storage.ensure()
            row: Any = await self._storage.command("HGETALL", k.task(task_id))
        info = self._retained(queue, row)
        if info is None:
            raise TaskNotFoundError(f"no task {task_id!r} in queue {queue!r}")
        return info

    async def get_tasks(self, queue: str, task_ids: Sequence[str]) -> list[TaskInfo | None]:
        """Several tasks of one queue in one round trip (one hash slot); ``None`` for one
        absent."""
        if not task_ids:
            return []
        k = self._storage.keys.queue(queue)
        async with self._storage.op("get_tasks"):
            await self._storage.ensure()
            rows = await self._storage.commands([("HGETALL", k.task(t)) for t in task_ids])
        return [self._retained(queue, row) for row in rows]

    async def get_outcomes(self, queue: str, task_ids: Sequence[str]) -> list[TaskOutcome | None]:
        """:meth:`get_tasks` narrowed to what a node reads of its dependencies: the same
        pipeline (a result or headers may be stored in chunks of unknown number), decoded
        for those fields only."""
        if not task_ids:
            return []
        k = self._storage.keys.queue(queue)
        async with self._storage.op("get_outcomes"):
            await self._storage.ensure()
            rows = await self._storage.commands([("HGETALL", k.task(t)) for t in task_ids])
        now = self._storage.clock.now()
        out: list[TaskOutcome | None] = []
        for row in rows:
            fields = pairs(row) if row else None
            outcome = task_outcome(fields) if fields else None
            if outcome is not None and outcome.state is TaskState.COMPLETED:
                expires = fields.get("expires_at") if fields else None
                if expires and float(expires) <= now:
                    outcome = None
            out.append(outcome)
        return out

    def _retained(self, queue: str, row: Any) -> TaskInfo | None:
        """The task of a stored hash; ``None`` when there is none, or it is a completed
        task past its retention."""
        if not row:
            return None
        fields = pairs(row)  # decoded once: task_info takes the dict as it is
        info = task_info(queue, fields)
        expires = fields.get("expires_at")
        if (
            info.state is TaskState.COMPLETED
            and expires
            and float(expires) <= self._storage.clock.now()
        ):
            return None
        return info

    async def move_task(self, move: TaskMove) -> TaskInfo | None:
        """Run, archive or delete one task if it is still in ``move.expect``: one script,
        which also creates the follow-ups."""
        k = self._storage.keys.queue(move.queue)
        to = {"run": "pending", "archive": "archived", "delete": "deleted"}[move.kind]
        now = self._storage.clock.now()
        call: ScriptCall = (
            "admin_move",
            [*self._task_keys(k, move.id), k.limits, k.limit_waiting],
            [now, move.expect.value, to, move.error or "", k.notify],
        )
        name, keys, args = self._storage.with_follow_ups(call, move.follow_ups, now)
        call = (name, keys, [*args, *self._storage.member_args(move.group)])
        async with self._storage.op("move_task"):
            await self._storage.ensure()
            if move.follow_ups:
                await self._storage.remember_queues([f.queue for f in move.follow_ups])
            reply = await self._storage.eval(*call)
            if reply[0] == b"ok" and move.follow_ups:
                await self._storage.drain_outboxes(
                    self._storage.outbox_queues(move.queue, move.follow_ups)
                )
        return task_info(move.queue, reply[1]) if reply[0] == b"ok" else None

    async def get_group(self, queue: str, group_id: str) -> GroupInfo:
        """One group with its members; GroupNotFoundError if absent (or expired: Redis
        drops a finished group's keys after its retention)."""
        g = self._storage.keys.queue(queue).group(group_id)
        now = self._storage.clock.now()
        async with self._storage.op("get_group"):
            await self._storage.ensure()
            head, entries, states = await self._storage.commands(
                [("HGETALL", g), ("HGETALL", f"{g}:e"), ("HGETALL", f"{g}:s")]
            )
            fields = _pairs(head)
            done = fields.get("finished_at")
            # Past its retention it counts as gone, before Redis expires the keys.
            over = done is not None and float(done) + float(fields["retention"]) <= now
            if not fields or over:
                raise GroupNotFoundError(f"no group {group_id!r} in queue {queue!r}")
            total = int(fields["total"])
            final = {int(k): v for k, v in _pairs(states).items()}
            members = [
                json.loads(v) for _, v in sorted(((int(k), v) for k, v in _pairs(entries).items()))
            ]
            # The live state of members that have not finished: one HGET each.
            live_keys = [
                self._storage.keys.queue(m["queue"]).task(m["id"])
                for i, m in enumerate(members)
                if i not in final
            ]
            live = await self._storage.commands([("HGET", key, "state") for key in live_keys])
        live_states = iter(live)
        out = []
        for i, m in enumerate(members):
            if i in final:
                state: str | None = final[i]
            else:
                raw = next(live_states)
                state = None if raw is None else bytes(raw).decode()
            out.append(GroupMemberInfo(m["id"], m["queue"], m["type"], state, i in final))
        then_id, then_queue = fields.get("a3"), fields.get("tq")
        finished_at = fields.get("finished_at")
        return GroupInfo(
            id=group_id,
            queue=queue,
            total=total,
            finished=int(fields["finished"]),
            created_at=float(fields["created_at"]),
            finished_at=None if finished_at is None else float(finished_at),
            then_id=then_id,
            then_queue=then_queue,
            members=tuple(out),
        )

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord:
        """A workflow's record (looked for in every known queue: it lives in its first
        node's) with its nodes' tasks; WorkflowNotFoundError if absent."""
        async with self._storage.op("get_workflow"):
            await self._storage.ensure()
            queues = await self._storage.all_queues()
            keys = [self._storage.keys.queue(q).workflow(workflow_id) for q in queues]
            heads = [pairs(h) for h in await self._storage.commands([("HGETALL", k) for k in keys])]
            found = [h for h in heads if h]
            if not found:
                raise WorkflowNotFoundError(f"no workflow {workflow_id!r}")
            newest = max(found, key=lambda h: float(h["created_at"]))
            return (await self._workflow_records([newest]))[0]

    async def list_workflows(self, query: WorkflowQuery) -> WorkflowPage:
        """Workflow records newest first: a page from each queue's index (members sort as
        cursors do), merged, and the records of the newest ``limit``."""
        top = "+"
        if query.created_before is not None:
            top = "(" + workflow_cursor(max(0.0, query.created_before), "")[:-1]
        if query.cursor is not None:
            top = "(" + query.cursor if top == "+" else min(top, "(" + query.cursor)
        bottom = "-"
        if query.created_after is not None:
            bottom = "[" + workflow_cursor(max(0.0, query.created_after), "")[:-1]
        async with self._storage.op("list_workflows"):
            await self._storage.ensure()
            queues = await self._storage.all_queues()
            pages = await self._storage.commands(
                [
                    (
                        "ZREVRANGEBYLEX",
                        self._storage.keys.queue(q).workflows,
                        top,
                        bottom,
                        "LIMIT",
                        0,
                        query.limit,
                    )
                    for q in queues
                ]
            )
            newest = sorted(
                (
                    (bytes(m).decode(), q)
                    for q, page in zip(queues, pages, strict=True)
                    for m in page
                ),
                reverse=True,
            )[: query.limit]
            keys = [self._storage.keys.queue(q).workflow(m.partition(":")[2]) for m, q in newest]
            heads = [pairs(h) for h in await self._storage.commands([("HGETALL", k) for k in keys])]
            records = await self._workflow_records([h for h in heads if h])
        return WorkflowPage(tuple(records), next_cursor(records, query.limit))

    async def _workflow_records(self, heads: list[dict[str, bytes]]) -> list[WorkflowRecord]:
        """Records from their hashes, with their nodes' tasks read in one round trip (a
        completed task past its retention counts as gone, as ``get_task`` says)."""
        now = self._storage.clock.now()
        specs = [json.loads(h["nodes"]) for h in heads]
        reads: list[tuple[Any, ...]] = [
            ("HMGET", self._storage.keys.queue(n[1]).task(n[2]), *_NODE_FIELDS)
            for nodes in specs
            for n in nodes
        ]
        replies = iter(await self._storage.commands(reads) if reads else [])
        records = []
        for h, nodes in zip(heads, specs, strict=True):
            infos = []
            for name, queue, task_id, type_, policy, after in nodes:
                state, retried, error, expires = next(replies)
                gone = state is None or (
                    state == b"completed" and expires is not None and float(expires) <= now
                )
                infos.append(
                    WorkflowNodeInfo(
                        name,
                        queue,
                        task_id,
                        type_,
                        policy,
                        tuple(after),
                        None if gone else TaskState(bytes(state).decode()),
                        0 if gone else int(retried or 0),
                        None if gone or error is None else bytes(error).decode(),
                    )
                )
            records.append(
                WorkflowRecord(
                    bytes(h["id"]).decode(),
                    bytes(h["name"]).decode(),
                    float(h["created_at"]),
                    float(h["retention"]),
                    tuple(infos),
                )
            )
        return records

    async def request_cancel(self, queue: str, task_id: str) -> TaskInfo | None:
        """Flag an active task for its worker (W12)."""
        k = self._storage.keys.queue(queue)
        async with self._storage.op("request_cancel"):
            await self._storage.ensure()
            reply = await self._storage.eval("admin_cancel", [k.task(task_id)], ["1"])
        return task_info(queue, reply[1]) if reply[0] == b"ok" else None

    async def rewrite_task(self, rewrite: TaskRewrite) -> bool:
        """New payload and result bytes, fenced (see :class:`TaskRewrite`)."""
        k = self._storage.keys.queue(rewrite.queue)
        args = [
            self._storage.now_arg(),
            TaskState(rewrite.expect).value,
            rewrite.payload,
            "0" if rewrite.result is None else "1",
            rewrite.result or b"",
            rewrite.new_payload,
            "0" if rewrite.new_result is None else "1",
            rewrite.new_result or b"",
        ]
        async with self._storage.op("rewrite_task"):
            await self._storage.ensure()
            reply = await self._storage.eval("admin_rewrite", [k.task(rewrite.id)], args)
        return bool(reply == 1)

    async def _in_batches(
        self,
        method: str,
        queue: str,
        script: str,
        keys: Callable[[QueueKeys], list[str]],
        extra: Callable[[QueueKeys], list[Any]],
    ) -> int:
        """Run a bulk script until it touches fewer than BATCH tasks; how many in all.

        Batches keep each script short, so one "run all" never blocks Redis for long."""
        async with self._storage.op(method):
            await self._storage.ensure()
            k = await self._known(queue)
            total = 0
            while True:
                n = int(
                    await self._storage.eval(
                        script,
                        keys(k),
                        [self._storage.clock.now(), k.task_prefix, BATCH, *extra(k)],
                    )
                )
                total += n
                if n < BATCH:
                    return total

    async def move_all(self, queue: str, state: TaskState, to: TaskState | None) -> int:
        """Run (``to`` pending) or delete (``to`` None) every task of ``state``."""
        state = TaskState(state)
        if to is TaskState.PENDING:
            return await self._in_batches(
                "run_all",
                queue,
                "admin_run_all",
                lambda k: [k.by_state(state.value), k.pending],
                lambda k: [k.notify],
            )
        deleted = await self._in_batches(
            "delete_all",
            queue,
            "admin_delete_all",
            lambda k: [k.by_state(state.value), k.unique, k.limits, k.limit_waiting],
            lambda k: ["", k.notify],
        )
        if state is TaskState.PENDING:  # and those held on a limit key (W13)
            deleted += await self._in_batches(
                "delete_all",
                queue,
                "admin_delete_all",
                lambda k: [k.held, k.unique, k.limits, k.limit_waiting],
                lambda k: ["held", k.notify],
            )
        return deleted

    async def pause_queue(self, queue: str) -> None:
        """Stop handing out tasks of ``queue`` (the claim script reads P:{Q}:paused)."""
        async with self._storage.op("pause_queue"):
            await self._storage.ensure()
            k = await self._known(queue)
            await self._storage.atomic(
                [("SET", k.paused, "1"), ("SADD", self._storage.keys.paused, queue)]
            )

    async def unpause_queue(self, queue: str) -> None:
        """Resume handing out tasks of ``queue``."""
        async with self._storage.op("unpause_queue"):
            await self._storage.ensure()
            k = await self._known(queue)
            # Idle workers of this queue may have tasks waiting for them: wake them (as the
            # scripts' wake_workers does: a message, and the token a blocked worker waits on).
            await self._storage.atomic(
                [
                    ("DEL", k.paused),
                    ("PUBLISH", k.notify, "1"),
                    ("LPUSH", k.notify, "1"),
                    ("LTRIM", k.notify, 0, 0),  # one token at most, as the scripts keep it
                    ("SREM", self._storage.keys.paused, queue),
                ]
            )

    async def list_limits(self, queue: str | None = None) -> list[LimitStats]:
        """Flow-control keys by queue and key (W13)."""
        async with self._storage.op("list_limits"):
            await self._storage.ensure()
            queues = await self._storage.all_queues() if queue is None else [queue]
            now = self._storage.clock.now()
            out: list[LimitStats] = []
            for name in queues:
                k = self._storage.keys.queue(name)
                raw: Any = await self._storage.command("HGETALL", k.limits)
                fields = pairs(raw)
                counts = await self._storage.commands(
                    [
                        (
                            "ZLEXCOUNT",
                            k.held,
                            b"[" + key.encode() + b"\0",
                            b"(" + key.encode() + b"\1",
                        )
                        for key in sorted(fields)
                    ]
                )
                for key, held in zip(sorted(fields), counts, strict=True):
                    out.append(stored_counter(fields[key]).stats(name, key, int(held), now))
            return out

    async def set_limit(self, change: LimitOverride) -> None:
        """W23: override one key's limit (admin_limit, in the queue's hash slot)."""
        async with self._storage.op("set_limit"):
            await self._storage.ensure()
            k = await self._known(change.queue)
            refilled_at = limiter.unclaimed(self._storage.clock.now()).refilled_at
            parts = (change.concurrency, change.rate, change.per)
            await self._storage.eval(
                "admin_limit",
                [k.limits, k.notify],
                [
                    change.key,
                    "set",
                    *("" if v is None else repr(v) for v in parts),
                    repr(refilled_at),
                ],
            )

    async def reset_limit(self, queue: str, key: str) -> bool:
        """W23: remove one key's override; whether there was one."""
        async with self._storage.op("reset_limit"):
            await self._storage.ensure()
            k = self._storage.keys.queue(queue)
            reply = await self._storage.eval(
                "admin_limit", [k.limits, k.notify], [key, "reset", "", "", "", ""]
            )
        return bool(reply)

    async def fair_partitions(self, queue: str, top: int = 20) -> FairDepth:
        """The queue's fair limits (W22), counted slice by slice (one short script call
        per :data:`PARTITION_SLICE` tasks): a picture taken over several moments."""
        counts: dict[tuple[str, str], list[int]] = {}
        async with self._storage.op("fair_partitions"):
            await self._storage.ensure()
            k = await self._known(queue)
            for which, zset in (("pending", k.pending), ("held", k.held), ("active", k.active)):
                first = 0
                while True:
                    reply: Any = await self._storage.eval(
                        "fair_partitions", [zset], [which, first, PARTITION_SLICE]
                    )
                    for i in range(1, len(reply), 3):
                        part = (_text(reply[i]), _text(reply[i + 1]))
                        counts.setdefault(part, [0, 0])[which == "active"] += int(reply[i + 2])
                    if int(reply[0]) < PARTITION_SLICE:
                        break
                    first += PARTITION_SLICE
        return fair_depth(queue, counts, top)

    async def list_unique(self, queue: str, limit: int = 50) -> UniqueHolds:
        """Unique keys held now, soonest due first, with their tasks (E4): the locks of
        the queue's unique hash, :data:`UNIQUE_SCAN` at most, sorted here."""
        async with self._storage.op("list_unique"):
            await self._storage.ensure()
            k = await self._known(queue)
            now = self._storage.clock.now()
            held: dict[str, str] = {}
            cursor, scanned = b"0", 0
            while scanned < UNIQUE_SCAN:
                cursor, flat = await self._storage.command("HSCAN", k.unique, cursor, "COUNT", 500)
                for key, owner in pairs(flat).items():
                    task_id, _, until = _text(owner).partition("|")
                    scanned += 1
                    if float(until) > now:
                        held[key] = task_id
                if cursor in (b"0", 0, "0"):
                    break
            complete = cursor in (b"0", 0, "0")
            total = (
                len(held)
                if complete
                else await self._storage.eval("unique_count", [k.unique], [repr(now)])
            )
            keys = list(held)
            due = await self._storage.commands([("HGET", k.task(held[key]), "npa") for key in keys])
            order = sorted(
                (float(d or 0), held[key], key) for key, d in zip(keys, due, strict=True)
            )[:limit]
            tasks = await self._storage.commands([("HGETALL", k.task(t)) for _, t, _ in order])
        holds = tuple(
            UniqueHold(key, info)
            for (_, _, key), row in zip(order, tasks, strict=True)
            if (info := self._retained(queue, row)) is not None
        )
        return UniqueHolds(holds, int(total), complete, None if complete else scanned)

    async def list_workers(self) -> list[WorkerInfo]:
        """Workers whose last heartbeat (broker clock) is younger than ``WORKER_VISIBLE_FOR``."""
        async with self._storage.op("list_workers"):
            await self._storage.ensure()
            now = self._storage.clock.now()
            flat: Any = await self._storage.command(
                "ZRANGEBYSCORE", self._storage.keys.workers, f"({now - WORKER_VISIBLE_FOR!r}", "+inf",
                "WITHSCORES",
            )  # fmt: skip
            if not flat:
                return []
            rows = list(zip(flat[::2], flat[1::2], strict=True))
            records = await self._storage.get_many(
                [self._storage.keys.worker(m.decode()) for m, _ in rows]
            )
        out: list[WorkerInfo] = []
        for (_, beat), raw in zip(rows, records, strict=True):
            if raw is None:
                continue
            data = json.loads(raw)
            data["last_heartbeat"] = float(beat)
            out.append(WorkerInfo(**data))
        return out

    # ------------------------------------------------------------------ schedules

    async def list_schedules(self) -> list[ScheduleRecord]:
        """Every stored schedule, by name (one hash, P:schedules)."""
        async with self._storage.op("list_schedules"):
            await self._storage.ensure()
            reply: Any = await self._storage.command("HGETALL", self._storage.keys.schedules)
        records = [_schedule(raw) for raw in (reply or [])[1::2]]
        return sorted(records, key=lambda r: r.name)

    async def get_schedule(self, name: str) -> ScheduleRecord | None:
        """One stored schedule, or ``None``."""
        async with self._storage.op("get_schedule"):
            await self._storage.ensure()
            raw: Any = await self._storage.command("HGET", self._storage.keys.schedules, name)
        return None if raw is None else _schedule(raw)

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord | None:
        """Create (version 0) or update, fenced by ``record.version`` in a script."""
        stored = replace(record, version=record.version + 1, updated_at=self._storage.clock.now())
        async with self._storage.op("put_schedule"):
            await self._storage.ensure()
            done = await self._storage.eval(
                "schedule_put",
                [self._storage.keys.schedules],
                [record.name, record.version, json.dumps(asdict(stored))],
            )
        return stored if int(done) else None

    async def delete_schedule(self, name: str) -> bool:
        """Delete one stored schedule; whether there was one."""
        async with self._storage.op("delete_schedule"):
            await self._storage.ensure()
            return bool(await self._storage.command("HDEL", self._storage.keys.schedules, name))


def _schedule(raw: bytes | str) -> ScheduleRecord:
    return ScheduleRecord(**json.loads(raw))


def _pairs(reply: Any) -> dict[str, str]:
    """An HGETALL reply as ``{field: value}``, values as text."""
    return {k: bytes(v).decode() for k, v in pairs(reply or []).items()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
