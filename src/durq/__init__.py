"""durq: durable background tasks for Python web services."""

from durq.errors import (
    BrokerUnavailableError,
    DuplicateTaskError,
    DurqError,
    NotReady,
    PayloadError,
    QueueNotFoundError,
    SkipRetry,
    TaskIDConflictError,
    TaskNotFoundError,
)
from durq.states import TaskState
from durq.task import TaskContext, TaskInfo

__version__ = "0.1.0"

__all__ = [
    "BrokerUnavailableError",
    "DuplicateTaskError",
    "DurqError",
    "NotReady",
    "PayloadError",
    "QueueNotFoundError",
    "SkipRetry",
    "TaskContext",
    "TaskIDConflictError",
    "TaskInfo",
    "TaskNotFoundError",
    "TaskState",
]
