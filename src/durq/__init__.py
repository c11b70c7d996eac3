"""durq: durable background tasks for Python web services."""

from durq.app import App
from durq.backoff import capped_power_of_two, exponential, fixed
from durq.brokers.params import EnqueueOutcome
from durq.brokers.views import QueueStats, WorkerInfo
from durq.coalescer import Coalescer
from durq.continuations import Then
from durq.encryption import Encryption
from durq.errors import (
    BrokerUnavailableError,
    DuplicateTaskError,
    DurqError,
    EncryptionError,
    GroupNotFoundError,
    InvalidNameError,
    InvalidPriorityError,
    InvalidStateError,
    NotReady,
    PayloadError,
    QueueNotFoundError,
    SignalTimeoutError,
    SkipRetry,
    Sleeping,
    Snooze,
    StepError,
    TaskArchivedError,
    TaskCancelledError,
    TaskIDConflictError,
    TaskNotFoundError,
    WaitTimeoutError,
    WorkflowNotFoundError,
)
from durq.groups import Group
from durq.limits import Limit
from durq.options import EnqueueRequest
from durq.progress import TaskLogLine, TaskProgress
from durq.states import TaskState
from durq.steps import TaskStep
from durq.task import TaskContext, TaskInfo
from durq.taskdef import TaskDef
from durq.uniqueness import Debounce, Unique
from durq.worker import Worker
from durq.worker.hooks import WorkerHooks
from durq.workflow_progress import WorkflowProgress
from durq.workflows import (
    Node,
    NodeFailed,
    Workflow,
    WorkflowCycleError,
    WorkflowError,
    WorkflowFailedError,
    WorkflowInfo,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # ``durq.testing`` without an import of its own, loaded only when a test asks for it.
    if name == "testing":
        import durq.testing

        return durq.testing
    raise AttributeError(f"module 'durq' has no attribute {name!r}")


__all__ = [
    "App",
    "BrokerUnavailableError",
    "Coalescer",
    "Debounce",
    "DuplicateTaskError",
    "DurqError",
    "Encryption",
    "EncryptionError",
    "EnqueueOutcome",
    "EnqueueRequest",
    "Group",
    "GroupNotFoundError",
    "InvalidNameError",
    "InvalidPriorityError",
    "InvalidStateError",
    "Limit",
    "Node",
    "NodeFailed",
    "NotReady",
    "PayloadError",
    "QueueNotFoundError",
    "QueueStats",
    "SignalTimeoutError",
    "SkipRetry",
    "Sleeping",
    "Snooze",
    "StepError",
    "TaskArchivedError",
    "TaskCancelledError",
    "TaskContext",
    "TaskDef",
    "TaskIDConflictError",
    "TaskInfo",
    "TaskLogLine",
    "TaskNotFoundError",
    "TaskProgress",
    "TaskState",
    "TaskStep",
    "Then",
    "Unique",
    "WaitTimeoutError",
    "Worker",
    "WorkerHooks",
    "WorkerInfo",
    "Workflow",
    "WorkflowCycleError",
    "WorkflowError",
    "WorkflowFailedError",
    "WorkflowInfo",
    "WorkflowNotFoundError",
    "WorkflowProgress",
    "capped_power_of_two",
    "exponential",
    "fixed",
]
