"""The task lifecycle's decisions, made once and above the broker seam.

Three actors move tasks: the worker (the outcome of an attempt, or a task handed back at
shutdown), the rescuer (leases that
expired because their worker died) and the inspector (run, archive, delete, cancel). Each asks
here which state comes next (checked against :data:`durq.states.TRANSITIONS`, the only table
of moves) and which follow-up tasks the move creates (``then=`` continuations and webhook
deliveries, see :mod:`durq.continuations`). Brokers get plain fenced storage operations:
"move this lease (if its token still holds) to this state with these fields and create these
tasks in the same atomic step", "move this task (if it is still in this state) ...".

Nothing here talks to a broker except the three driver functions at the end
(:func:`rescue_expired` and the inspector's moves), which read, decide and write, retrying
the decision when a fence shows the task moved meanwhile.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from durq import codec, continuations, groups
from durq.brokers import limiter
from durq.brokers.params import (
    ArchiveParams,
    CompleteParams,
    EnqueueParams,
    Lease,
    LeaseMove,
    LeaseRef,
    RetryParams,
    TaskMove,
)
from durq.clock import to_datetime
from durq.errors import InvalidStateError, TaskNotFoundError
from durq.states import TaskState, move
from durq.task import TaskInfo

if TYPE_CHECKING:
    from durq.brokers.contract import Admin, Broker

log = logging.getLogger("durq.lifecycle")

#: last_error of a task whose lease expired (retried), or archived when out of retries.
LEASE_EXPIRED = "lease expired"
#: last_error of a task archived because its worker was lost ``max_lost`` times.
WORKER_LOST = "worker lost"
CANCELLED = "cancelled"
#: last_error of a task archived because it snoozed more than its type's ``max_snoozes``.
SNOOZED_TOO_OFTEN = "snoozed too often"
#: Expired leases the rescuer handles per broker call.
RESCUE_BATCH = 500
#: Tasks one call of :func:`steer_each` may name.
SELECTION_MAX = 500
#: How often an inspector move re-reads a task that moved between its read and its write.
_FENCE_ATTEMPTS = 5


# -- the worker: the outcome of one attempt ------------------------------------------------


def completed(
    lease: Lease, result: bytes | None, *, now: float, max_payload: int = codec.DEFAULT_MAX_PAYLOAD
) -> CompleteParams:
    """The handler returned ``result``: completed (kept for its retention, else deleted)."""
    task = lease.task
    move(task.state, "complete", task_id=task.id)
    follow_ups = _follow_ups(
        task,
        continuations.COMPLETED,
        result=result,
        retried=task.retried,
        now=now,
        max_payload=max_payload,
    )
    member = groups.outcome(task, groups.COMPLETED, result=result, max_payload=max_payload)
    return CompleteParams(
        lease.ref, result, task.retention, follow_ups, group=member, limited=bool(task.limits)
    )


def failed(
    lease: Lease,
    error: str,
    *,
    now: float,
    delay: Callable[[], float],
    max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
) -> LeaseMove:
    """The attempt failed with ``error``: retry after ``delay()`` seconds, or archived when
    the retries are used up or the deadline has passed."""
    task = lease.task
    past_deadline = task.deadline is not None and task.deadline.timestamp() <= now
    if task.retried >= task.max_retry or past_deadline:
        return gave_up(lease, error, now=now, max_payload=max_payload)
    move(task.state, "fail", task_id=task.id)
    # The delay stays relative: the broker adds it to its own clock when it stores the retry.
    return RetryParams(lease.ref, error, max(0.0, delay()), keep=keeps_key(task))


def gave_up(
    lease: Lease,
    error: str,
    *,
    now: float,
    count_attempt: bool = True,
    max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
) -> ArchiveParams:
    """Archive the task with ``error`` (retries used up, SkipRetry, undecodable payload, or
    ``count_attempt=False``: cancelled by the inspector)."""
    task = lease.task
    move(task.state, "give_up", task_id=task.id)
    retried = task.retried + 1 if count_attempt else task.retried
    follow_ups = _follow_ups(
        task,
        continuations.ARCHIVED,
        error=error,
        retried=retried,
        now=now,
        max_payload=max_payload,
    )
    member = groups.outcome(task, groups.ARCHIVED, error=error, max_payload=max_payload)
    return ArchiveParams(
        lease.ref, error, count_attempt=count_attempt, follow_ups=follow_ups, group=member
    )


def snoozed(
    lease: Lease,
    delay: float,
    *,
    snoozes: int,
    max_snoozes: int,
    now: float,
    max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
) -> LeaseMove:
    """The handler snoozed (:class:`durq.Snooze`) after ``snoozes`` earlier snoozes: back to
    scheduled in ``delay`` seconds without counting an attempt, or archived "snoozed too
    often" once it would pass ``max_snoozes``."""
    task = lease.task
    if snoozes >= max_snoozes:
        return gave_up(
            lease, SNOOZED_TOO_OFTEN, now=now, count_attempt=False, max_payload=max_payload
        )
    move(task.state, "snooze", task_id=task.id)
    return RetryParams(lease.ref, "", max(0.0, delay), snooze=True, keep=keeps_key(task))


def slept(lease: Lease, delay: float, *, awaits: str | None = None) -> RetryParams:
    """The handler fell asleep (``ctx.sleep``): back to scheduled in ``delay`` seconds; or
    it waits for the signal ``awaits`` (``ctx.wait_for``): waiting until the signal comes
    or ``delay`` seconds pass (pending at once if the signal is stored already). No attempt
    is counted (the snoozes counter counts these and :func:`durq.steps.sleeps_in` tells them
    apart, so ``max_snoozes`` does not bound them)."""
    move(lease.task.state, "snooze" if awaits is None else "await_signal", task_id=lease.task.id)
    keep = keeps_key(lease.task)
    return RetryParams(lease.ref, "", max(0.0, delay), snooze=True, awaits=awaits, keep=keep)


def handed_back(lease: Lease) -> LeaseRef:
    """A graceful shutdown stops the attempt: the task goes back to pending without counting
    an attempt (the broker's ``requeue``, fenced by the lease it names; with
    ``keep=keeps_key(task)``)."""
    move(lease.task.state, "requeue", task_id=lease.task.id)
    return lease.ref


def keeps_key(task: TaskInfo) -> bool:
    """W25: an end of the task's attempt that is not final (retry, snooze, wait, hand-back,
    rescued lease) keeps the keys of its sequence limits, so that no later task of such a
    key starts before it finishes."""
    return limiter.keeps(task.limits)


# -- the rescuer: expired leases -----------------------------------------------------------


def lease_expired(lease: Lease, *, now: float, max_lost: int) -> LeaseMove:
    """An expired lease (its worker died): an attempt and a loss are counted; retry due
    now, or archived when lost ``max_lost`` times ("worker lost") or out of retries. Fenced by
    the token and by the lease still being expired at ``now``."""
    task = lease.task
    if task.lost + 1 >= max_lost:
        event, error = "worker_lost", WORKER_LOST
    elif task.retried >= task.max_retry:
        event, error = "worker_lost", LEASE_EXPIRED
    else:
        move(task.state, "lease_expired", task_id=task.id)
        return RetryParams(
            lease.ref, LEASE_EXPIRED, 0.0, lost=True, expired_by=now, keep=keeps_key(task)
        )
    move(task.state, event, task_id=task.id)
    after = dataclasses.replace(
        task,
        state=TaskState.ARCHIVED,
        retried=task.retried + 1,
        lost=task.lost + 1,
        last_error=error,
    )
    follow_ups = continuations.for_archived(after)
    member = groups.outcome(task, groups.ARCHIVED, error=error)
    return ArchiveParams(
        lease.ref, error, follow_ups=follow_ups, lost=True, expired_by=now, group=member
    )


def after_move(task: TaskInfo, change: LeaseMove) -> TaskInfo:
    """The task as ``change`` leaves it (what the rescuer reports and logs)."""
    counted = not isinstance(change, ArchiveParams) or change.count_attempt
    after = dataclasses.replace(
        task,
        retried=task.retried + (1 if counted else 0),
        lost=task.lost + (1 if change.lost else 0),
        last_error=change.error,
        lease_expires_at=None,
        cancel_requested=False,
    )
    if isinstance(change, RetryParams):
        return dataclasses.replace(
            after,
            state=TaskState.RETRY,
            # The broker stored its own now + delay; the rescuer's clock is a close guess.
            next_process_at=to_datetime((change.expired_by or 0.0) + change.delay),
        )
    return dataclasses.replace(after, state=TaskState.ARCHIVED)


async def rescue_expired(broker: Broker, max_lost: int) -> list[TaskInfo]:
    """Recover every expired lease (the rescuer's tick); the tasks as they are now.

    Reads a batch, decides each task's next state here, writes the batch with one fenced
    broker call; a lease whose fence failed (its worker came back, another rescuer was
    faster) is left alone."""
    rescued: list[TaskInfo] = []
    while True:
        leases = await broker.expired_leases(RESCUE_BATCH)
        if not leases:
            return rescued
        # One order on every broker (leases that expired together tie on the time), so the
        # follow-ups the batch creates line up the same way in their queues.
        leases = sorted(leases, key=lambda lease: (lease.task.queue, lease.task.id))
        now = broker.clock.now()
        moves = [lease_expired(lease, now=now, max_lost=max_lost) for lease in leases]
        held = await broker.move_leases(moves)
        rescued.extend(
            after_move(lease.task, change)
            for lease, change, ok in zip(leases, moves, held, strict=True)
            if ok
        )
        if len(leases) < RESCUE_BATCH or not any(held):
            return rescued


# -- the inspector -------------------------------------------------------------------------


async def run_task(admin: Admin, queue: str, task_id: str) -> TaskInfo:
    """scheduled/retry/archived -> pending now."""
    return await _steer(admin, queue, task_id, "run", None)


async def archive_task(admin: Admin, queue: str, task_id: str) -> TaskInfo:
    """pending/scheduled/retry -> archived; creates the follow-ups it asks for."""
    return await _steer(admin, queue, task_id, "archive", None)


async def delete_task(admin: Admin, queue: str, task_id: str) -> None:
    """Delete a task in any state but active (cancel it first)."""
    await _steer(admin, queue, task_id, "delete", None)


async def cancel_task(admin: Admin, queue: str, task_id: str) -> TaskInfo:
    """Active: flag it, its worker cancels the handler and archives it.
    pending/scheduled/retry: archived "cancelled" at once. Finished: InvalidStateError."""
    return await _steer(admin, queue, task_id, "cancel", CANCELLED)


async def run_all(admin: Admin, queue: str, state: TaskState) -> int:
    """Run every task of ``state`` (scheduled, retry, archived) now; how many."""
    state = TaskState(state)
    to = move(state, "run")
    return await admin.move_all(queue, state, to)


async def delete_all(admin: Admin, queue: str, state: TaskState) -> int:
    """Delete every task of ``state`` (not active); how many."""
    state = TaskState(state)
    if not _deletable(state):
        raise InvalidStateError("cannot delete active tasks: cancel them first")
    return await admin.move_all(queue, state, None)


@dataclasses.dataclass(frozen=True, slots=True)
class SelectionOutcome:
    """What one task of a selection became: ``task`` after the move (before it, for a
    delete), or ``error`` (not found, or its state does not allow the action)."""

    id: str
    task: TaskInfo | None = None
    error: TaskNotFoundError | InvalidStateError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


#: The single-task moves a selection may ask for.
SELECTION_ACTIONS = ("run", "archive", "delete", "cancel")


async def steer_each(
    admin: Admin, queue: str, task_ids: list[str], action: str
) -> list[SelectionOutcome]:
    """Run, archive, delete or cancel each task of a selection, as the single-task action
    would: each decided and fenced on its own, so one task that moved meanwhile or whose
    state refuses the action is reported and the others still move."""
    if action not in SELECTION_ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    error = CANCELLED if action == "cancel" else None
    outcomes: list[SelectionOutcome] = []
    for task_id in dict.fromkeys(task_ids):  # each task once, in the order given
        try:
            task = await _steer(admin, queue, task_id, action, error)
        except (TaskNotFoundError, InvalidStateError) as exc:
            outcomes.append(SelectionOutcome(task_id, error=exc))
        else:
            outcomes.append(SelectionOutcome(task_id, task=task))
    return outcomes


def _deletable(state: TaskState) -> bool:
    try:
        return move(state, "delete") is None
    except InvalidStateError:
        return False


async def _steer(admin: Admin, queue: str, task_id: str, event: str, error: str | None) -> TaskInfo:
    for _ in range(_FENCE_ATTEMPTS):
        task = await admin.get_task(queue, task_id)
        to = move(task.state, event, task_id=task_id)
        if to is TaskState.ACTIVE:  # cancel of an active task: a flag for its worker
            flagged = await admin.request_cancel(queue, task_id)
            if flagged is not None:
                return flagged
            continue
        follow_ups: tuple[EnqueueParams, ...] = ()
        member = None
        if to is TaskState.ARCHIVED:
            after = dataclasses.replace(
                task, state=TaskState.ARCHIVED, last_error=error or task.last_error
            )
            follow_ups = continuations.for_archived(after)
            member = groups.outcome(task, groups.ARCHIVED, error=after.last_error or "archived")
        # A member deleted unfinished: the broker records its stored "deleted" entry.
        moved = await admin.move_task(
            TaskMove(
                queue, task_id, task.state, to, error=error, follow_ups=follow_ups, group=member
            )
        )
        if moved is not None:
            return moved
    # Moved by someone else every time we looked: say what it is now.
    task = await admin.get_task(queue, task_id)
    raise InvalidStateError(f"task {task_id!r} keeps changing state (now {task.state.value})")


def _follow_ups(
    task: TaskInfo,
    outcome: str,
    *,
    result: bytes | None = None,
    error: str = "",
    retried: int,
    now: float,
    max_payload: int,
) -> tuple[EnqueueParams, ...]:
    if not continuations.wanted(task):  # the common case: no header to look at
        return ()
    return continuations.follow_ups(
        task,
        outcome,
        result=result,
        error=error,
        retried=retried,
        now=now,
        max_payload=max_payload,
    )


__all__ = [
    "CANCELLED",
    "LEASE_EXPIRED",
    "SNOOZED_TOO_OFTEN",
    "WORKER_LOST",
    "SelectionOutcome",
    "after_move",
    "archive_task",
    "cancel_task",
    "completed",
    "delete_all",
    "delete_task",
    "failed",
    "gave_up",
    "keeps_key",
    "lease_expired",
    "rescue_expired",
    "run_all",
    "run_task",
    "snoozed",
    "steer_each",
]
