"""A registered task type (:class:`TaskDef`) and what ``@app.task`` returns.

It sits below the app: a task definition reaches its app through :class:`TaskClient`, the
four calls it makes, so the worker, web helpers and periodic schedules can name it without
importing the app."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar, cast, overload

from durq import backoff
from durq.options import DEFAULT_MAX_SNOOZES, Duration, EnqueueRequest, TaskDefaults
from durq.payloads import HandlerShape, inspect_handler, rebuild_result
from durq.task import TaskInfo

T = TypeVar("T")
R = TypeVar("R")


class TaskClient(Protocol):
    """What a task definition asks of its app: enqueue, wait, and the sync face."""

    @property
    def enqueue(self) -> Callable[..., Awaitable[TaskInfo]]: ...
    @property
    def enqueue_sync(self) -> Callable[..., TaskInfo]: ...
    @property
    def wait(self) -> Callable[..., Awaitable[Any]]: ...
    def run_sync(self, make: Callable[[], Awaitable[R]]) -> R: ...


class TaskDef(Generic[T, R]):
    """A registered task type: its handler and its default options.

    ``T`` is the payload type the handler takes (its first parameter's annotation) and ``R``
    what it returns (awaited, for an async handler), so ``enqueue`` is checked by mypy.
    Calling it runs the handler directly (handy in tests); ``enqueue`` queues it."""

    def __init__(
        self,
        app: TaskClient,
        type: str,
        fn: Callable[..., Any],
        defaults: TaskDefaults,
        retry_delay: backoff.RetryDelay,
        max_snoozes: int = DEFAULT_MAX_SNOOZES,
    ) -> None:
        self.app = app
        self.type = type
        self.fn = fn
        self.defaults = defaults
        self.retry_delay = retry_delay
        #: Snoozes (:class:`durq.Snooze`) a task of this type may take before it is archived.
        self.max_snoozes = max_snoozes
        self.shape: HandlerShape = inspect_handler(fn)
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", type)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def request(self, payload: T | None = None, **options: Any) -> EnqueueRequest:
        """An :class:`EnqueueRequest` for bulk enqueue."""
        return EnqueueRequest(self.type, payload, **options)

    async def enqueue(self, payload: T | None = None, **options: Any) -> TaskInfo:
        """Enqueue this task; options as :meth:`durq.App.enqueue`."""
        return await self.app.enqueue(self.type, payload, **options)

    def enqueue_sync(self, payload: T | None = None, **options: Any) -> TaskInfo:
        """Blocking :meth:`enqueue`, for WSGI code."""
        return self.app.enqueue_sync(self.type, payload, **options)

    async def wait(
        self,
        task: TaskInfo | str,
        *,
        queue: str | None = None,
        timeout: Duration | None = None,
    ) -> R:
        """:meth:`durq.App.wait` for a task of this type: the result, rebuilt into the handler's
        return model when it has one (a dataclass, pydantic or msgspec model). A task id
        alone is looked up in ``queue``, by default this type's queue."""
        if isinstance(task, str):
            queue = queue or self.defaults.queue
        result = await self.app.wait(task, queue=queue, timeout=timeout)
        return cast(R, rebuild_result(self.shape.result_model, result))

    def wait_sync(
        self,
        task: TaskInfo | str,
        *,
        queue: str | None = None,
        timeout: Duration | None = None,
    ) -> R:
        """Blocking :meth:`wait`, for WSGI code and scripts."""
        return self.app.run_sync(lambda: self.wait(task, queue=queue, timeout=timeout))

    def __repr__(self) -> str:
        return f"<TaskDef {self.type!r} queue={self.defaults.queue!r}>"


class TaskDecorator(Protocol):
    """What ``@app.task(...)`` returns: typed by the handler's payload and result."""

    @overload
    def __call__(self, fn: Callable[[T], Awaitable[R]]) -> TaskDef[T, R]: ...
    @overload
    def __call__(self, fn: Callable[[T, Any], Awaitable[R]]) -> TaskDef[T, R]: ...
    @overload
    def __call__(self, fn: Callable[[], Awaitable[R]]) -> TaskDef[Any, R]: ...
    @overload
    def __call__(self, fn: Callable[[T], R]) -> TaskDef[T, R]: ...
    @overload
    def __call__(self, fn: Callable[[T, Any], R]) -> TaskDef[T, R]: ...
    @overload
    def __call__(self, fn: Callable[[], R]) -> TaskDef[Any, R]: ...
    @overload
    def __call__(self, fn: Callable[..., Any]) -> TaskDef[Any, Any]: ...


class TaskRegistry(Protocol):
    """An app's handlers by task type, and ``@app.task`` to add one."""

    tasks: dict[str, TaskDef[Any, Any]]

    @property
    def task(self) -> Callable[..., TaskDecorator]: ...
