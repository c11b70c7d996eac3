"""What the worker, the dashboard, observability and the testing kit use of an app.

These modules sit below :mod:`durq.app`: they name the protocols here, which
:class:`durq.App` satisfies as it is, rather than the app itself, so the layers read top to
bottom and none of them imports the app back, not even for types."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from durq.brokers import FullBroker
    from durq.brokers.params import ArchivedRetention, EnqueueParams
    from durq.clock import Clock
    from durq.encryption import Encryption
    from durq.inspector import Inspector
    from durq.periodic import PeriodicRegistry
    from durq.schedules import StoredSchedules
    from durq.task import TaskInfo, WorkflowRunner
    from durq.taskdef import TaskDef
    from durq.worker.hooks import WorkerHooks

#: Called with the headers of every new task, e.g. to inject trace context.
HeaderHook = Callable[[dict[str, str]], None]
#: Wraps the broker call of an enqueue: given the tasks about to be sent, a context manager
#: that yields them (headers may change, e.g. a producer span's trace context) and sees how
#: the call ended (an exception propagates through it).
SendHook = Callable[[list["EnqueueParams"]], AbstractContextManager[list["EnqueueParams"]]]


class HookPoints(Protocol):
    """The hook lists of an app that metrics and tracing add themselves to."""

    header_hooks: list[HeaderHook]
    send_hooks: list[SendHook]
    enqueue_hooks: list[Callable[[TaskInfo], None]]
    worker_hooks: list[WorkerHooks]


class AdminView(Protocol):
    """An app as the dashboard and the health and queue probes see it."""

    @property
    def clock(self) -> Clock: ...
    @property
    def inspector(self) -> Inspector: ...
    @property
    def schedules(self) -> PeriodicRegistry: ...
    @property
    def stored_schedules(self) -> StoredSchedules: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...
    async def signal(
        self, task: TaskInfo | str, name: str, payload: Any = None, *, queue: str | None = None
    ) -> bool: ...


class MetricsHost(HookPoints, AdminView, Protocol):
    """An app as a metrics server serves it: its hooks, its inspector and its broker probe."""


class WorkerView(Protocol):
    """An app as a worker runs it: its handlers, limits, keys, schedules and brokers."""

    @property
    def tasks(self) -> Mapping[str, TaskDef[Any, Any]]: ...
    @property
    def default_queue(self) -> str: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def max_payload(self) -> int: ...
    @property
    def max_result(self) -> int: ...
    @property
    def encryption(self) -> Encryption | None: ...
    @property
    def archived_retention(self) -> ArchivedRetention: ...
    @property
    def schedules(self) -> PeriodicRegistry: ...
    @property
    def worker_hooks(self) -> list[WorkerHooks]: ...
    @property
    def child_workflows(self) -> WorkflowRunner: ...
    async def broker(self) -> FullBroker: ...
    def worker_broker(self) -> tuple[FullBroker, bool]: ...
    def release(self, broker: FullBroker) -> None: ...
