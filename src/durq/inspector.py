"""The inspector: the admin facade that the CLI and the dashboard use.

It validates names and states at the edge; reads go through the broker's Admin seam, moves
through :mod:`durq.lifecycle`, which decides them and hands the broker fenced writes."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from durq import groups, lifecycle, limits, workflows
from durq.brokers.views import (
    PARTITIONS_TOP_MAX,
    UNIQUE_PAGE_MAX,
    WORKFLOW_PAGE_MAX,
    FairDepth,
    GroupInfo,
    LimitStats,
    MinuteCounts,
    QueueStats,
    TaskFilter,
    TaskSearch,
    TaskSearchResult,
    WorkerInfo,
    WorkflowQuery,
    workflow_cursor,
)
from durq.errors import ValidationError
from durq.names import check_queue, check_task_id, check_type, check_workflow_id
from durq.states import TaskState
from durq.task import TaskInfo
from durq.uniqueness import UniqueEntry
from durq.workflow_progress import WORKFLOW_STATES, WorkflowProgress, progress

if TYPE_CHECKING:
    from durq.brokers.contract import Admin, FullBroker
    from durq.encryption import Encryption


#: A listing of workflows by state reads at most this many records per call.
WORKFLOW_SCAN = 5000


@dataclass(frozen=True, slots=True)
class WorkflowList:
    """A page of :meth:`Inspector.list_workflows`: workflows newest first, and the cursor
    to go on from (``None``: nothing older is left)."""

    workflows: tuple[WorkflowProgress, ...]
    cursor: str | None


@dataclass(frozen=True, slots=True)
class UniqueList:
    """:meth:`Inspector.list_unique`: unique keys held, soonest due first, and how many are
    held in all; ``complete`` false when the broker read only some of them (Redis, past
    a bound) and the page is the soonest of those."""

    entries: tuple[UniqueEntry, ...]
    total: int
    complete: bool = True

    def to_dict(self) -> dict[str, object]:
        return {
            "entries": [e.to_dict() for e in self.entries],
            "total": self.total,
            "complete": self.complete,
        }


@dataclass(frozen=True, slots=True)
class WorkflowCounts:
    """Workflows by state among the records read; ``complete``: every record kept was read."""

    by_state: dict[str, int]
    complete: bool


def parse_state(state: TaskState | str) -> TaskState:
    """A :class:`TaskState` from its name; ValidationError for anything else."""
    if isinstance(state, TaskState):
        return state
    try:
        return TaskState(str(state).lower())
    except ValueError:
        known = ", ".join(s.value for s in TaskState)
        raise ValidationError(f"unknown state {state!r} (one of: {known})") from None


#: Why a search by payload field is refused when payloads are encrypted.
ENCRYPTED_SEARCH = (
    "payloads are encrypted: a search cannot look into them (search by type or error instead)"
)
#: Longest search text (error text, payload value) accepted.
SEARCH_TEXT_MAX = 200
#: Payload conditions in one search.
SEARCH_FIELDS_MAX = 8


def task_filter(
    *,
    type: str | None = None,
    error: str | None = None,
    payload: Iterable[tuple[str, str]] = (),
) -> TaskFilter:
    """A checked :class:`TaskFilter`: ``type`` a task type, ``error`` text the last error
    contains, ``payload`` ``(field, value)`` pairs with dotted field paths
    (``("customer.id", "7")``); what they match is :mod:`durq.brokers.search`.
    ValidationError names what is wrong (a control character in a value, say)."""
    if type is not None:
        check_type(type)
    if error is not None and not 1 <= len(error) <= SEARCH_TEXT_MAX:
        raise ValidationError(f"error text must have 1..{SEARCH_TEXT_MAX} characters")
    pairs = tuple(payload)
    if len(pairs) > SEARCH_FIELDS_MAX:
        raise ValidationError(f"at most {SEARCH_FIELDS_MAX} payload fields in one search")
    for _, value in pairs:
        if len(value) > SEARCH_TEXT_MAX:
            raise ValidationError(f"payload value must have at most {SEARCH_TEXT_MAX} characters")
    return TaskFilter(type=type, error=error, payload=pairs)


def _check_page(limit: int, offset: int) -> None:
    if limit < 1 or limit > 1000 or offset < 0:
        raise ValidationError("limit must be 1..1000 and offset >= 0")


class InspectorHost(Protocol):
    """What an :class:`Inspector` uses of its app: its broker and its keys."""

    @property
    def encryption(self) -> Encryption | None: ...
    async def broker(self) -> FullBroker: ...


class Inspector:
    """Look at and steer queues, tasks and workers."""

    def __init__(self, app: InspectorHost) -> None:
        self._app = app

    async def _admin(self) -> Admin:
        return (await self._app.broker()).admin

    async def list_queues(self) -> list[QueueStats]:
        """Every known queue with sizes per state and counters."""
        return await (await self._admin()).list_queues()

    async def queue_stats(self, queue: str) -> QueueStats:
        """One queue; QueueNotFoundError if unknown."""
        return await (await self._admin()).queue_stats(check_queue(queue))

    async def list_tasks(
        self, queue: str, state: TaskState | str, *, limit: int = 50, offset: int = 0
    ) -> list[TaskInfo]:
        """Tasks of ``queue`` in ``state``, a page at a time."""
        _check_page(limit, offset)
        admin = await self._admin()
        return await admin.list_tasks(
            check_queue(queue), parse_state(state), limit=limit, offset=offset
        )

    async def search_tasks(
        self,
        queue: str,
        state: TaskState | str,
        where: TaskFilter,
        *,
        limit: int = 50,
        offset: int = 0,
    ) -> TaskSearchResult:
        """Tasks of ``queue`` in ``state`` that pass ``where`` (see :func:`task_filter`), a
        page at a time, with how many match in all. ValidationError for payload conditions
        when the app encrypts payloads: storage holds only their ciphertext."""
        _check_page(limit, offset)
        if where.payload and self._app.encryption is not None:
            raise ValidationError(ENCRYPTED_SEARCH)
        admin = await self._admin()
        search = TaskSearch(check_queue(queue), parse_state(state), where, limit, offset)
        return await admin.search_tasks(search)

    async def get_task_info(self, queue: str, task_id: str) -> TaskInfo:
        """One task by id; TaskNotFoundError if absent."""
        return await (await self._admin()).get_task(check_queue(queue), check_task_id(task_id))

    async def get_group(self, queue: str, group_id: str) -> GroupInfo:
        """A group's progress (total, finished, members by state) by its queue and id;
        GroupNotFoundError if absent or past its retention."""
        return await (await self._admin()).get_group(check_queue(queue), groups.check_id(group_id))

    async def get_workflow(self, workflow_id: str) -> WorkflowProgress:
        """A workflow's progress (its state, each node's state and attempts, the edges) from
        its stored record and its nodes' tasks; WorkflowNotFoundError if there is none."""
        admin = await self._admin()
        return progress(await admin.get_workflow(check_workflow_id(workflow_id)))

    async def cancel_workflow(self, workflow_id: str) -> int:
        """Cancel every node of a workflow that has not finished, as its stored record names
        them (see ``App.cancel_workflow``); how many; WorkflowNotFoundError if none."""
        admin = await self._admin()
        record = await admin.get_workflow(check_workflow_id(workflow_id))
        return await workflows.cancel(admin, [(n.queue, n.task_id) for n in record.nodes])

    async def list_workflows(
        self,
        *,
        state: str | None = None,
        newer_than: float | None = None,
        older_than: float | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> WorkflowList:
        """Workflows newest first, ``limit`` at most: in ``state`` (``running``,
        ``succeeded``, ``failed``, ``cancelled``; ``None``: any), created at most
        ``newer_than`` and more than ``older_than`` seconds ago. A listing by state reads
        records until it has ``limit`` or has read :data:`WORKFLOW_SCAN` of them; its
        ``cursor`` (also when the page is short) goes on from there."""
        if state is not None and state not in WORKFLOW_STATES:
            raise ValidationError(
                f"unknown workflow state {state!r} (one of: {', '.join(WORKFLOW_STATES)})"
            )
        if not 1 <= limit <= WORKFLOW_PAGE_MAX:
            raise ValidationError(f"limit must be 1..{WORKFLOW_PAGE_MAX}")
        for age in (newer_than, older_than):
            if age is not None and not (math.isfinite(age) and age >= 0):
                raise ValidationError("ages are seconds >= 0")
        broker = await self._app.broker()
        now = broker.clock.now()
        query = WorkflowQuery(
            created_after=None if newer_than is None else now - newer_than,
            created_before=None if older_than is None else now - older_than,
            limit=limit if state is None else WORKFLOW_PAGE_MAX,
            cursor=cursor,
        )
        found: list[WorkflowProgress] = []
        scanned = 0
        while True:
            page = await broker.admin.list_workflows(query)
            for record in page.records:
                item = progress(record)
                if state is None or item.state == state:
                    found.append(item)
                    if len(found) == limit:
                        more = record is not page.records[-1] or page.cursor is not None
                        after = workflow_cursor(record.created_at, record.id) if more else None
                        return WorkflowList(tuple(found), after)
            scanned += len(page.records)
            if page.cursor is None or scanned >= WORKFLOW_SCAN:
                return WorkflowList(tuple(found), page.cursor)
            query = replace(query, cursor=page.cursor)

    async def count_workflows(self, scan: int = WORKFLOW_SCAN) -> WorkflowCounts:
        """How many workflows are in each state among the newest ``scan`` records kept
        (each read with its nodes' tasks: pages of :data:`WORKFLOW_PAGE_MAX`)."""
        counts: dict[str, int] = dict.fromkeys(WORKFLOW_STATES, 0)
        query = WorkflowQuery(limit=WORKFLOW_PAGE_MAX)
        admin = await self._admin()
        read = 0
        while read < scan:
            page = await admin.list_workflows(replace(query, limit=min(query.limit, scan - read)))
            for record in page.records:
                counts[progress(record).state] += 1
            read += len(page.records)
            if page.cursor is None:
                return WorkflowCounts(counts, complete=True)
            query = replace(query, cursor=page.cursor)
        return WorkflowCounts(counts, complete=False)

    async def run_task(self, queue: str, task_id: str) -> TaskInfo:
        """Make a scheduled, retry or archived task pending now."""
        return await lifecycle.run_task(
            await self._admin(), check_queue(queue), check_task_id(task_id)
        )

    async def archive_task(self, queue: str, task_id: str) -> TaskInfo:
        """Archive a waiting task."""
        return await lifecycle.archive_task(
            await self._admin(), check_queue(queue), check_task_id(task_id)
        )

    async def delete_task(self, queue: str, task_id: str) -> None:
        """Delete a task that is not active."""
        await lifecycle.delete_task(await self._admin(), check_queue(queue), check_task_id(task_id))

    async def cancel_task(self, queue: str, task_id: str) -> TaskInfo:
        """Cancel a task: an active one's handler is cancelled by its worker."""
        return await lifecycle.cancel_task(
            await self._admin(), check_queue(queue), check_task_id(task_id)
        )

    async def run_all(self, queue: str, state: TaskState | str) -> int:
        """Run every scheduled, retry or archived task of a queue now."""
        return await lifecycle.run_all(await self._admin(), check_queue(queue), parse_state(state))

    async def delete_all(self, queue: str, state: TaskState | str) -> int:
        """Delete every task of a queue in a state other than active."""
        return await lifecycle.delete_all(
            await self._admin(), check_queue(queue), parse_state(state)
        )

    async def steer_selection(
        self, queue: str, task_ids: Iterable[str], action: str
    ) -> list[lifecycle.SelectionOutcome]:
        """``run``, ``archive``, ``delete`` or ``cancel`` each task of a selection (at most
        :data:`~durq.lifecycle.SELECTION_MAX`); one outcome per distinct id, in order. A task
        whose state refuses the action, or that is gone, is reported, not raised."""
        if action not in lifecycle.SELECTION_ACTIONS:
            known = ", ".join(lifecycle.SELECTION_ACTIONS)
            raise ValidationError(f"unknown action {action!r} (one of: {known})")
        ids = [check_task_id(task_id) for task_id in task_ids]
        if not 1 <= len(ids) <= lifecycle.SELECTION_MAX:
            raise ValidationError(f"select 1..{lifecycle.SELECTION_MAX} tasks")
        return await lifecycle.steer_each(await self._admin(), check_queue(queue), ids, action)

    async def pause_queue(self, queue: str) -> None:
        """Pause a queue: workers take nothing from it; enqueue still works."""
        await (await self._admin()).pause_queue(check_queue(queue))

    async def unpause_queue(self, queue: str) -> None:
        """Resume a paused queue."""
        await (await self._admin()).unpause_queue(check_queue(queue))

    async def set_limit(
        self,
        queue: str,
        key: str,
        *,
        concurrency: int | None = None,
        rate: str | tuple[int, float] | None = None,
    ) -> LimitStats:
        """Override one flow-control key's limit at run time, without a deploy: the
        concurrency (0 starts none of the key: a pause of one partner or tenant) and/or the
        rate (``"10/s"``, as :class:`durq.Limit` takes it) win over the limit every task of
        the key carries until :meth:`reset_limit`; a part not given keeps the tasks'. Each
        call replaces the key's override as a whole. Every worker applies it at its next
        claim (idle ones are woken); running tasks are not touched. The key need not have
        been counted yet. Returns the key as :meth:`list_limits` shows it. ValidationError
        for a bad value, QueueNotFoundError for an unknown queue."""
        change = limits.override(check_queue(queue), key, concurrency, rate)
        await (await self._admin()).set_limit(change)
        return await self._limit_of(change.queue, change.key)

    async def reset_limit(self, queue: str, key: str) -> bool:
        """Remove a key's override: the limit its tasks carry applies again from the next
        claim (held tasks come back as it allows). Whether there was an override."""
        name, key = check_queue(queue), limits.check_key(key)
        return await (await self._admin()).reset_limit(name, key)

    async def _limit_of(self, queue: str, key: str) -> LimitStats:
        found = [s for s in await (await self._admin()).list_limits(queue) if s.key == key]
        # Counters are kept once made; a store emptied meanwhile shows the key unset.
        return found[0] if found else LimitStats(queue, key, 0, None, None, None, None, 0)

    async def minute_counts(self, queue: str | None, since: float) -> list[MinuteCounts]:
        """Tasks processed and failed per minute since ``since`` (epoch seconds), of one
        queue or of all (``None``); kept by the broker for two days."""
        name = None if queue is None else check_queue(queue)
        return await (await self._admin()).minute_counts(name, since)

    async def list_workers(self) -> list[WorkerInfo]:
        """Live worker processes."""
        return await (await self._admin()).list_workers()

    async def list_limits(self, queue: str | None = None) -> list[LimitStats]:
        """Flow-control keys (of one queue, or all): running attempts, the limit, tokens
        left and tasks held back (see :class:`durq.Limit`)."""
        name = None if queue is None else check_queue(queue)
        return await (await self._admin()).list_limits(name)

    async def fair_partitions(self, queue: str, top: int = 20) -> FairDepth:
        """The fair limits (``Limit(..., fair=True)``) of ``queue``: each key template with
        its partitions, and the ``top`` partitions (resolved keys, ``tenant:7``) with the
        most tasks waiting (pending, held back ones too) and running, biggest first; the
        rest summed in ``others``. One bounded read however many partitions there are."""
        if not 1 <= top <= PARTITIONS_TOP_MAX:
            raise ValidationError(f"top must be 1..{PARTITIONS_TOP_MAX}")
        return await (await self._admin()).fair_partitions(check_queue(queue), top)

    async def list_unique(self, queue: str, *, limit: int = 50) -> UniqueList:
        """Unique keys (``unique=``, :class:`durq.Unique`, :func:`durq.Debounce`) that the
        tasks of ``queue`` hold now, soonest due first: the key, its task, its state, when
        it is due, until when it holds the key, and for a debounced task its ``wait``,
        ``max_wait`` and when it runs at the latest."""
        if not 1 <= limit <= UNIQUE_PAGE_MAX:
            raise ValidationError(f"limit must be 1..{UNIQUE_PAGE_MAX}")
        page = await (await self._admin()).list_unique(check_queue(queue), limit)
        entries = tuple(UniqueEntry.of(h.key, h.task) for h in page.holds)
        return UniqueList(entries, page.total, page.complete)
