"""The task state machine: every state, and every move between states, in one place."""

from __future__ import annotations

from enum import StrEnum

from durq.errors import IllegalTransitionError


class TaskState(StrEnum):
    """Where a task is in its life. Each broker stores exactly these names."""

    PENDING = "pending"
    """Ready to run now. In: enqueue without delay, a due scheduled/retry task, the inspector's
    "run", a graceful shutdown handing a task back. Out: a worker claims it (-> active)."""

    SCHEDULED = "scheduled"
    """Waits for ``next_process_at``. In: enqueue with ``process_in``/``process_at``, a
    handler that snoozed (``durq.Snooze``).
    Out: its time comes (-> pending), the inspector runs, archives or deletes it."""

    ACTIVE = "active"
    """Leased by one worker, which holds the fencing token. In: claim. Out: the handler
    returns (-> completed or deleted), fails (-> retry or archived), the lease expires
    (-> retry), graceful shutdown (-> pending), cancellation (-> archived)."""

    RETRY = "retry"
    """Failed (or not ready yet) and waits for its next attempt at ``next_process_at``.
    In: a failed attempt with retries left, an expired lease. Out: its time comes (-> pending)."""

    ARCHIVED = "archived"
    """Gave up: retries used up, ``SkipRetry``, cancelled, or its worker was lost too often.
    Kept for inspection. Out: only the inspector (run -> pending, delete)."""

    COMPLETED = "completed"
    """Succeeded; kept with its result until its retention passes, then deleted by the janitor."""

    WAITING = "waiting"
    """Waits for other tasks to finish (``enqueue(..., after=[...])``) or for a signal
    (``ctx.wait_for``); not claimable. In: enqueue with a dependency that has not finished;
    a handler that waits for a signal not delivered yet. Out: the last dependency finishes
    (completed, archived, deleted or cancelled) in the same atomic step as that outcome
    (-> pending, or scheduled while its own due time is ahead); the awaited signal is stored
    (-> pending, in the same atomic step) or the wait's time runs out (-> pending, forwarded
    with due tasks); the inspector archives, cancels or deletes it."""

    def __str__(self) -> str:
        return self.value


#: Every move that is decided, as ``(from, event) -> to``; ``None`` as ``to``: the task is
#: deleted. The only table of the lifecycle: :mod:`durq.lifecycle` asks :func:`move` before
#: every state change it decides (worker outcomes, shutdown, rescuer, inspector), and brokers
#: store the result; every row is asked (tests/unit/test_lifecycle.py checks it).
#:
#: Four moves are no rows, because nothing above the seam decides them: a claim (a
#: :data:`CLAIMABLE` task whose time has come -> active), the promotion of due scheduled and
#: retry tasks and of waits for a signal whose time ran out (-> pending), the wake-up of a
#: task waiting for the signal just stored (-> pending) and the janitor's deletion of
#: completed tasks past their retention. Each broker makes them on its own, in the statement or script that finds the
#: tasks, so a row for them would be read by nothing; :class:`TaskState` documents them.
TRANSITIONS: dict[tuple[TaskState, str], TaskState | None] = {
    # the worker's outcome of an attempt (retention 0: completed and deleted at once)
    (TaskState.ACTIVE, "complete"): TaskState.COMPLETED,
    (TaskState.ACTIVE, "fail"): TaskState.RETRY,
    (TaskState.ACTIVE, "give_up"): TaskState.ARCHIVED,
    (TaskState.ACTIVE, "requeue"): TaskState.PENDING,
    # the handler snoozed it (durq.Snooze) or slept (ctx.sleep): no attempt counted
    (TaskState.ACTIVE, "snooze"): TaskState.SCHEDULED,
    # the handler waits for a signal (ctx.wait_for): no attempt counted, no slot held
    (TaskState.ACTIVE, "await_signal"): TaskState.WAITING,
    # the rescuer: an expired lease, or a worker lost too often (poison pill)
    (TaskState.ACTIVE, "lease_expired"): TaskState.RETRY,
    (TaskState.ACTIVE, "worker_lost"): TaskState.ARCHIVED,
    # the inspector
    (TaskState.SCHEDULED, "run"): TaskState.PENDING,
    (TaskState.RETRY, "run"): TaskState.PENDING,
    (TaskState.ARCHIVED, "run"): TaskState.PENDING,
    (TaskState.PENDING, "archive"): TaskState.ARCHIVED,
    (TaskState.SCHEDULED, "archive"): TaskState.ARCHIVED,
    (TaskState.RETRY, "archive"): TaskState.ARCHIVED,
    (TaskState.PENDING, "cancel"): TaskState.ARCHIVED,
    (TaskState.SCHEDULED, "cancel"): TaskState.ARCHIVED,
    (TaskState.RETRY, "cancel"): TaskState.ARCHIVED,
    # an active task is only flagged; its worker then archives it ("give_up")
    (TaskState.ACTIVE, "cancel"): TaskState.ACTIVE,
    (TaskState.PENDING, "delete"): None,
    (TaskState.SCHEDULED, "delete"): None,
    (TaskState.RETRY, "delete"): None,
    (TaskState.ARCHIVED, "delete"): None,
    (TaskState.COMPLETED, "delete"): None,
    # dependencies (``after=``): the last one finished, in the same atomic step
    (TaskState.WAITING, "released"): TaskState.PENDING,
    (TaskState.WAITING, "released_early"): TaskState.SCHEDULED,
    (TaskState.WAITING, "archive"): TaskState.ARCHIVED,
    (TaskState.WAITING, "cancel"): TaskState.ARCHIVED,
    (TaskState.WAITING, "delete"): None,
}

#: States a worker may take a task from once ``next_process_at`` has passed.
CLAIMABLE: frozenset[TaskState] = frozenset(
    {TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY}
)

#: States a task never leaves by itself (only the inspector or the janitor touch them).
FINISHED: frozenset[TaskState] = frozenset({TaskState.ARCHIVED, TaskState.COMPLETED})


def released(due: float, now: float) -> TaskState:
    """The state of a waiting task whose last dependency finished at ``now``: pending, or
    scheduled while its own due time ``due`` is ahead."""
    to = move(TaskState.WAITING, "released_early" if due > now else "released")
    assert to is not None
    return to


def allowed(state: TaskState, event: str) -> bool:
    """Whether :data:`TRANSITIONS` has ``event`` from ``state``."""
    return (state, event) in TRANSITIONS


def move(state: TaskState, event: str, *, task_id: str | None = None) -> TaskState | None:
    """The state after ``event`` (``None``: deleted); IllegalTransitionError when the table
    has no such move."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        what = f"task {task_id!r}" if task_id is not None else "a task"
        raise IllegalTransitionError(
            f"cannot {event.replace('_', ' ')} {what}: it is {state.value}",
            state=state,
            event=event,
        ) from None
