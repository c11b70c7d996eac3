"""Errors raised by durq. One root, one docstring per error that is also its default message."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from durq.task import TaskInfo


class DurqError(Exception):
    """durq failed."""

    def __init__(self, message: str | None = None, **context: Any) -> None:
        self.message = message or (self.__doc__ or self.__class__.__name__).strip()
        self.context = context
        super().__init__(self.message)


class ConfigurationError(DurqError, ValueError):
    """Invalid configuration."""


class UnsafeFileError(ConfigurationError):
    """A file or directory durq would use next to the SQLite database is not one it can
    trust (a symlink, not a directory, another user's): remove it, durq recreates it."""


class ValidationError(DurqError, ValueError):
    """Invalid input."""


class InvalidNameError(ValidationError):
    """Invalid queue name or task type."""


class InvalidPriorityError(ValidationError):
    """A task priority must be an integer from -100 to 100."""


class PayloadError(ValidationError):
    """The payload cannot be encoded as a JSON object within the size limit."""


class EncryptionError(DurqError):
    """An encrypted payload or result cannot be read: its key is not among the configured
    keys, or the stored value was altered."""


class TaskIDConflictError(DurqError):
    """A task with this id already exists in this queue."""

    def __init__(self, message: str | None = None, *, existing: TaskInfo | None = None) -> None:
        super().__init__(message)
        #: The task that holds the id, so a web handler can answer with its state.
        self.existing = existing


class DuplicateTaskError(DurqError):
    """An identical task (same queue, type and payload) is already queued within its unique ttl."""

    def __init__(self, message: str | None = None, *, existing_id: str | None = None) -> None:
        super().__init__(message)
        self.existing_id = existing_id


class BrokerUnavailableError(DurqError):
    """The broker cannot be reached; nothing was written."""

    def __init__(self, message: str | None = None, *, operation: str | None = None) -> None:
        super().__init__(message)
        #: Which broker call failed, e.g. ``"postgres.enqueue"``.
        self.operation = operation


class BrokerError(DurqError):
    """The broker refused the operation."""

    def __init__(self, message: str | None = None, *, operation: str | None = None) -> None:
        super().__init__(message)
        self.operation = operation


class SchemaError(BrokerError):
    """The broker's storage is missing or at another schema version: run `durq migrate`."""


class TaskNotFoundError(DurqError, LookupError):
    """No task with this id in this queue."""


class TaskArchivedError(DurqError):
    """The task was archived: it failed for good and has no result."""

    def __init__(self, message: str | None = None, *, info: TaskInfo | None = None) -> None:
        super().__init__(message)
        #: The archived task as last read.
        self.info = info
        #: Its one-line error and the last failed attempt's traceback (``None`` if none).
        self.last_error = info.last_error if info is not None else None
        self.traceback = info.traceback if info is not None else None


class TaskCancelledError(TaskArchivedError):
    """The task was cancelled (archived without a result)."""


class WaitTimeoutError(DurqError, TimeoutError):
    """The task did not end within the wait's timeout; it goes on (this is the wait's own
    limit, not the task's ``timeout``, whose expiry fails an attempt)."""

    def __init__(self, message: str | None = None, *, info: TaskInfo | None = None) -> None:
        super().__init__(message)
        #: The task as last read before the wait gave up.
        self.info = info


class QueueNotFoundError(DurqError, LookupError):
    """No such queue."""


class GroupNotFoundError(DurqError, LookupError):
    """No group with this id in this queue."""


class WorkflowNotFoundError(DurqError, LookupError):
    """No workflow with this id (or its record is past its retention)."""


class ScheduleNotFoundError(DurqError, LookupError):
    """No periodic schedule of this name (stored, or declared in code)."""


class ScheduleConflictError(DurqError):
    """The schedule cannot be written as asked: its name is taken (stored already, or
    declared in code, which is read-only at run time), or it changed meanwhile."""


class InvalidStateError(DurqError):
    """The task is not in a state that allows this operation."""


class IllegalTransitionError(InvalidStateError):
    """The state machine (:data:`durq.states.TRANSITIONS`) has no such move."""

    def __init__(self, message: str | None = None, *, state: Any = None, event: str = "") -> None:
        super().__init__(message, state=state, event=event)
        self.state = state
        self.event = event


class StepError(DurqError):
    """A durable step cannot be run or recorded: its name is not valid or was used twice in
    one attempt, its result is not JSON or too large, or the attempt lost its lease."""


# Control flow for handlers. These are signals, not failures of the library.


class NotReady(Exception):
    """The work is not done yet (e.g. the partner still processes it): try again later.

    Reschedules with the task's backoff, counts toward ``max_retry``, records ``reason`` as
    ``last_error`` and logs at INFO."""

    def __init__(self, reason: str = "not ready") -> None:
        super().__init__(reason)
        self.reason = reason


class Snooze(Exception):
    """Not now, and not a failure: run the task again in ``delay`` seconds (or a duration
    such as ``"5m"``).

    Unlike :class:`NotReady`, a snooze does not count toward ``max_retry``, leaves the
    backoff and ``last_error`` alone and is not counted as a failure. The task waits as
    scheduled; past its type's ``max_snoozes`` it is archived ("snoozed too often")."""

    def __init__(self, delay: Any = 0.0, reason: str = "snoozed") -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


class SignalTimeoutError(DurqError, TimeoutError):
    """``ctx.wait_for``: the signal did not come within the wait's timeout (raised in the
    handler; catch it to go on without the signal)."""


class Sleeping(BaseException):
    """Raised by ``ctx.sleep`` and ``ctx.sleep_until`` once the sleep is recorded: the
    attempt ends and the task waits, scheduled, until ``until`` (epoch seconds), then runs
    again and replays its recorded steps. Not counted as an attempt or a snooze.

    A ``BaseException``, as :class:`asyncio.CancelledError` is, so that a handler's
    ``except Exception`` around a sleep does not swallow it; a handler that catches
    ``BaseException`` must raise it again."""

    def __init__(self, name: str, until: float, awaits: str | None = None) -> None:
        super().__init__(f"sleeping ({name}) until {until}")
        self.name = name
        self.until = until
        #: ``ctx.wait_for``: the signal whose delivery ends the sleep early.
        self.awaits = awaits


class SkipRetry(Exception):
    """Give up now: the task is archived without further retries.

    Logged at INFO as a decision of the handler's; ``alert=True`` makes it a failure like
    any other archive (the ERROR line, with the traceback of the exception it was raised
    from), e.g. for an error the handler knows a retry cannot cure."""

    def __init__(self, reason: str = "skip retry", *, alert: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.alert = alert
