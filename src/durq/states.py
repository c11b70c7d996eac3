"""The task state machine: every state, and every move between states, in one place."""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    """Where a task is in its life. Each broker stores exactly these names."""

    PENDING = "pending"
    """Ready to run now. In: enqueue without delay, a due scheduled/retry task, the inspector's
    "run", a graceful shutdown handing a task back. Out: a worker claims it (-> active)."""

    SCHEDULED = "scheduled"
    """Waits for ``next_process_at``. In: enqueue with ``process_in``/``process_at``.
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

    def __str__(self) -> str:
        return self.value


#: The allowed moves of a task, as ``(from, event) -> to``.
TRANSITIONS: dict[tuple[TaskState, str], TaskState] = {
    (TaskState.SCHEDULED, "due"): TaskState.PENDING,
    (TaskState.RETRY, "due"): TaskState.PENDING,
    (TaskState.PENDING, "claim"): TaskState.ACTIVE,
    (TaskState.ACTIVE, "complete"): TaskState.COMPLETED,
    (TaskState.ACTIVE, "retry"): TaskState.RETRY,
    (TaskState.ACTIVE, "archive"): TaskState.ARCHIVED,
    (TaskState.ACTIVE, "lease_expired"): TaskState.RETRY,
    (TaskState.ACTIVE, "requeue"): TaskState.PENDING,
    (TaskState.SCHEDULED, "run"): TaskState.PENDING,
    (TaskState.RETRY, "run"): TaskState.PENDING,
    (TaskState.ARCHIVED, "run"): TaskState.PENDING,
    (TaskState.PENDING, "archive"): TaskState.ARCHIVED,
    (TaskState.SCHEDULED, "archive"): TaskState.ARCHIVED,
    (TaskState.RETRY, "archive"): TaskState.ARCHIVED,
}

#: States a worker may take a task from once ``next_process_at`` has passed.
CLAIMABLE: frozenset[TaskState] = frozenset(
    {TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY}
)

#: States a task never leaves by itself (only the inspector or the janitor touch them).
FINISHED: frozenset[TaskState] = frozenset({TaskState.ARCHIVED, TaskState.COMPLETED})


def can_move(state: TaskState, event: str) -> TaskState | None:
    """The state after ``event``, or ``None`` when the table forbids it."""
    return TRANSITIONS.get((state, event))
