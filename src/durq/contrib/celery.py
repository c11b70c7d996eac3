"""A road in from Celery: Celery's task API over a durq app, so a codebase moves task by task.

Change the import and keep the tasks::

    from durq.contrib.celery import Celery, shared_task   # was: from celery import ...

    app = Celery("proj", broker="redis://localhost:6379/0")

    @app.task(bind=True, max_retries=5, default_retry_delay=30)
    def charge(self, order_id):
        ...
        raise self.retry(countdown=60)

    charge.delay(42)                       # or .apply_async((42,), countdown=10, queue="pay")

Run the worker with durq's command: ``durq worker proj.celery:app``. What maps to what, and
what does not move, is in ``docs/from-celery.md``. A task's Celery arguments travel as the
JSON payload ``{"args": [...], "kwargs": {...}}``; results are stored by the broker itself
(no result backend to configure)."""

from __future__ import annotations

import contextvars
import importlib
import os
import random
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, overload

import durq
from durq.errors import ConfigurationError, TaskArchivedError, TaskNotFoundError, WaitTimeoutError
from durq.lifecycle import CANCELLED
from durq.states import TaskState
from durq.task import TaskContext, TaskInfo

__all__ = [
    "AsyncResult",
    "Celery",
    "MaxRetriesExceededError",
    "Retry",
    "Signature",
    "Task",
    "crontab",
    "shared_task",
]

#: Celery's defaults where durq's differ: three retries, three minutes apart.
DEFAULT_MAX_RETRIES = 3
DEFAULT_RETRY_DELAY = 180.0
#: ``max_retries=None`` (retry for ever) in Celery; durq counts retries, so a bound this large.
UNBOUNDED_RETRIES = 10**6
_BROKER_SCHEMES = ("sqlite", "postgres", "postgresql", "redis", "rediss", "memory")
# apply_async options that have no meaning over durq and are accepted without effect.
_IGNORED_OPTIONS = frozenset(
    {
        "retry",
        "retry_policy",
        "serializer",
        "compression",
        "exchange",
        "routing_key",
        "add_to_parent",
    }
)
# Task options that describe Celery's transport or result backend: nothing to do over durq
# (it always acknowledges after the attempt and stores results with the task).
_IGNORED_TASK_OPTIONS = frozenset(
    {
        "acks_late",
        "track_started",
        "serializer",
        "typing",
        "trail",
        "reject_on_worker_lost",
        "store_errors_even_if_ignored",
        "acks_on_failure_or_timeout",
        "shared",
    }
)
_STATES = {
    TaskState.PENDING: "PENDING",
    TaskState.SCHEDULED: "PENDING",
    TaskState.ACTIVE: "STARTED",
    TaskState.RETRY: "RETRY",
    TaskState.COMPLETED: "SUCCESS",
    TaskState.ARCHIVED: "FAILURE",
    TaskState.WAITING: "PENDING",
}


class MaxRetriesExceededError(Exception):
    """``self.retry()`` was called with no retries left (and no ``exc`` to raise instead)."""


class Retry(durq.NotReady):
    """Raised by ``self.retry()``: the task runs again after ``countdown`` seconds (or the
    task's ``default_retry_delay``). Raise it (``raise self.retry(...)``) as in Celery."""

    def __init__(self, message: str = "retry", *, countdown: float | None = None) -> None:
        super().__init__(message)
        self.countdown = countdown


@dataclass(frozen=True)
class Request:
    """What ``self.request`` tells a bound task about the attempt it runs."""

    id: str
    retries: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    queue: str
    headers: dict[str, str] = field(default_factory=dict)
    task: str = ""

    @property
    def delivery_info(self) -> dict[str, Any]:
        return {"routing_key": self.queue}


_request: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
    "durq_celery_request", default=None
)


def crontab(
    minute: str | int = "*",
    hour: str | int = "*",
    day_of_week: str | int = "*",
    day_of_month: str | int = "*",
    month_of_year: str | int = "*",
) -> str:
    """Celery's ``crontab(...)`` as the cron expression durq's schedules take."""
    return f"{minute} {hour} {day_of_month} {month_of_year} {day_of_week}"


def _schedule_text(schedule: Any) -> str:
    """A Celery beat schedule (seconds, a timedelta, this module's crontab, or Celery's own
    crontab object) as a durq schedule string."""
    if isinstance(schedule, str):
        return schedule
    if isinstance(schedule, timedelta):
        schedule = schedule.total_seconds()
    if isinstance(schedule, int | float) and not isinstance(schedule, bool):
        if schedule < 1 or schedule != int(schedule):
            raise ConfigurationError(
                f"a periodic interval must be a whole number of seconds >= 1, got {schedule!r}"
            )
        return f"@every {int(schedule)}s"
    parts = [getattr(schedule, f"_orig_{n}", None) for n in _CRON_FIELDS]
    if all(p is not None for p in parts):  # celery.schedules.crontab
        return crontab(*(str(p) for p in parts))
    raise ConfigurationError(
        f"cannot read the schedule {schedule!r}: give seconds, a timedelta or a crontab"
    )


_CRON_FIELDS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")


class Settings(dict[str, Any]):
    """``app.conf``: Celery's settings by their lower-case names, readable as attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


class Signal:
    """A Celery app signal (``on_after_configure``): receivers are called with the app as
    ``sender`` once, when the durq app is first built."""

    def __init__(self) -> None:
        self.receivers: list[Callable[..., Any]] = []

    def connect(self, receiver: Callable[..., Any] | None = None, **_: Any) -> Any:
        if receiver is None:
            return self.connect
        self.receivers.append(receiver)
        return receiver

    def send(self, sender: Any) -> None:
        for receiver in self.receivers:
            receiver(sender=sender)


@dataclass(frozen=True)
class Signature:
    """``task.s(...)``: a call kept for later (a periodic entry, or ``.delay()``)."""

    task: Task
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        return self.task.apply_async(
            (*self.args, *(args or ())),
            {**self.kwargs, **(kwargs or {})},
            **{**self.options, **options},
        )

    def set(self, **options: Any) -> Signature:
        return Signature(self.task, self.args, self.kwargs, {**self.options, **options})


class AsyncResult:
    """A task's result handle, as Celery's: ``.get()``, ``.state``, ``.ready()``…

    ``get()`` blocks (use it in scripts and sync code; async code awaits ``app.wait``)."""

    def __init__(self, id: str, *, app: Celery, queue: str | None = None) -> None:
        self.id = id
        self.app = app
        self.queue = queue or app.durq_app.default_queue

    def __repr__(self) -> str:
        return f"<AsyncResult: {self.id}>"

    def _info(self) -> TaskInfo | None:
        inspector = self.app.durq_app.inspector
        try:
            return self.app.durq_app.run_sync(lambda: inspector.get_task_info(self.queue, self.id))
        except TaskNotFoundError:
            return None

    @property
    def state(self) -> str:
        """PENDING, STARTED, RETRY, SUCCESS, FAILURE or REVOKED (cancelled); PENDING also for
        an id durq does not know, as in Celery."""
        info = self._info()
        if info is None:
            return "PENDING"
        if info.state is TaskState.ARCHIVED and info.last_error == CANCELLED:
            return "REVOKED"
        return _STATES[info.state]

    status = state

    def ready(self) -> bool:
        return self.state in ("SUCCESS", "FAILURE", "REVOKED")

    def successful(self) -> bool:
        return self.state == "SUCCESS"

    def failed(self) -> bool:
        return self.state == "FAILURE"

    @property
    def result(self) -> Any:
        """The return value once it succeeded, the error text once it failed, else None."""
        info = self._info()
        if info is None:
            return None
        if info.state is TaskState.COMPLETED:
            return info.result
        if info.state is TaskState.ARCHIVED:
            return info.last_error
        return None

    info = result

    @property
    def traceback(self) -> str | None:
        found = self._info()
        return None if found is None else found.traceback

    def get(self, timeout: float | None = None, propagate: bool = True, **_: Any) -> Any:
        """Wait for the task's end and return its result. A failed task raises
        :class:`durq.TaskArchivedError` (``propagate=False``: returns the error text);
        ``timeout`` passing raises :class:`durq.WaitTimeoutError` (a ``TimeoutError``)."""
        try:
            return self.app.durq_app.wait_sync(self.id, queue=self.queue, timeout=timeout)
        except TaskArchivedError as exc:
            if propagate:
                raise
            return exc.info.last_error if exc.info is not None else str(exc)
        except WaitTimeoutError:
            raise

    wait = get


class Task:
    """A Celery-style task over a durq task type. Calling it runs the function here and
    now (as Celery does); ``delay``/``apply_async`` enqueue it."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        bind: bool = False,
        queue: str | None = None,
        max_retries: int | None = DEFAULT_MAX_RETRIES,
        default_retry_delay: float = DEFAULT_RETRY_DELAY,
        autoretry_for: Iterable[type[BaseException]] = (),
        dont_autoretry_for: Iterable[type[BaseException]] = (),
        retry_backoff: bool | float = False,
        retry_backoff_max: float = 600,
        retry_jitter: bool = True,
        time_limit: float | None = None,
        soft_time_limit: float | None = None,
        priority: int | None = None,
        ignore_result: bool = False,
        rate_limit: str | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise ConfigurationError(
                f"task {name!r}: durq.contrib.celery does not take {sorted(unknown)} "
                "(see docs/from-celery.md)"
            )
        self.run = fn
        self.name = name
        self.bind = bind
        self.queue = queue
        self.max_retries = max_retries
        self.default_retry_delay = float(default_retry_delay)
        self.autoretry_for = tuple(autoretry_for)
        self.dont_autoretry_for = tuple(dont_autoretry_for)
        self.retry_backoff = retry_backoff
        self.retry_backoff_max = float(retry_backoff_max)
        self.retry_jitter = retry_jitter
        # durq has one time limit, which cancels the attempt: the smaller of the two.
        limits = [t for t in (time_limit, soft_time_limit) if t is not None]
        self.time_limit = min(limits) if limits else None
        self.priority = priority
        self.ignore_result = ignore_result
        self.rate_limit = rate_limit
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__module__ = getattr(fn, "__module__", __name__)
        self._apps: weakref.WeakSet[Celery] = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"<@task: {self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.bind:
            return self.run(self, *args, **kwargs)
        return self.run(*args, **kwargs)

    # -- the app it enqueues through ------------------------------------------------------

    @property
    def app(self) -> Celery:
        """The app this task enqueues through: its own (``@app.task``), else the app made
        last (``@shared_task``, as Celery's current app)."""
        for own in self._apps:
            return own
        app = Celery.current()
        if app is None:
            raise ConfigurationError(
                f"task {self.name!r} has no app: create durq.contrib.celery.Celery(...) first"
            )
        return app

    # -- enqueue ---------------------------------------------------------------------------

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        return Signature(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        return Signature(self, args, kwargs)

    signature = s

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Enqueue with these arguments (blocking; ``await task.adelay(...)`` in async code)."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Enqueue; ``countdown``, ``eta``, ``expires``, ``queue``, ``task_id``,
        ``priority`` and ``headers`` as in Celery (see docs/from-celery.md)."""
        app = self.app
        payload, enqueue_options = self._enqueue_args(args, kwargs, options)
        info = app.durq_app.enqueue_sync(self.name, payload, **enqueue_options)
        return AsyncResult(info.id, app=app, queue=info.queue)

    async def adelay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """:meth:`delay` for async code (FastAPI handlers)."""
        return await self.aapply_async(args, kwargs)

    async def aapply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """:meth:`apply_async` for async code."""
        app = self.app
        payload, enqueue_options = self._enqueue_args(args, kwargs, options)
        info = await app.durq_app.enqueue(self.name, payload, **enqueue_options)
        return AsyncResult(info.id, app=app, queue=info.queue)

    def _enqueue_args(
        self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None, options: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if args is not None and (isinstance(args, str | bytes) or not isinstance(args, Sequence)):
            raise TypeError(f"apply_async args must be a list or tuple, got {type(args).__name__}")
        payload = {"args": list(args or ()), "kwargs": dict(kwargs or {})}
        out: dict[str, Any] = {}
        for key, value in options.items():
            if key in _IGNORED_OPTIONS:
                continue
            if value is None:
                continue
            if key == "countdown":
                out["process_in"] = float(value)
            elif key == "eta":
                out["process_at"] = value
            elif key == "expires":
                out["deadline"] = value if isinstance(value, datetime) else _in(float(value))
            elif key in ("queue", "task_id", "priority", "headers"):
                out[key] = value
            elif key == "ignore_result":
                if value:
                    out["retention"] = 0
            else:
                raise TypeError(
                    f"apply_async got {key!r}, which durq.contrib.celery does not take "
                    "(see docs/from-celery.md)"
                )
        if self.priority is not None:
            out.setdefault("priority", self.priority)
        if self.ignore_result:
            out.setdefault("retention", 0)
        return payload, out

    # -- running ----------------------------------------------------------------------------

    @property
    def request(self) -> Request:
        """The attempt this bound task runs (set while it runs)."""
        current = _request.get()
        if current is None:
            raise RuntimeError(f"task {self.name!r} is not running: no request")
        return current

    def retry(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        exc: BaseException | None = None,
        countdown: float | None = None,
        eta: datetime | None = None,
        max_retries: int | None = None,
        **_: Any,
    ) -> Retry:
        """Run the task again later: ``raise self.retry(countdown=60)``. With no retries
        left it raises ``exc`` (or :class:`MaxRetriesExceededError`), which fails the task.
        ``args``/``kwargs`` other than the attempt's are refused (the payload is stored)."""
        request = self.request
        if (args is not None and tuple(args) != request.args) or (
            kwargs is not None and dict(kwargs) != request.kwargs
        ):
            raise ConfigurationError("retry() with other arguments: enqueue a new task instead")
        limit = self.max_retries if max_retries is None else max_retries
        if limit is not None and request.retries >= limit:
            if exc is not None:
                raise exc
            raise MaxRetriesExceededError(
                f"{self.name}[{request.id}]: retried {request.retries} times"
            )
        if eta is not None:
            now = datetime.now(UTC)
            target = eta if eta.tzinfo else eta.replace(tzinfo=UTC)
            countdown = max(0.0, (target - now).total_seconds())
        reason = f"{type(exc).__name__}: {exc}" if exc is not None else "retry"
        return Retry(reason, countdown=countdown)

    def retry_delay(self, retried: int, exc: BaseException) -> float:
        """Seconds before the next attempt: ``retry(countdown=)``, else the backoff of
        ``retry_backoff``, else ``default_retry_delay``."""
        if isinstance(exc, Retry) and exc.countdown is not None:
            return exc.countdown
        if self.retry_backoff and not isinstance(exc, Retry):
            factor = 1.0 if self.retry_backoff is True else float(self.retry_backoff)
            delay = min(self.retry_backoff_max, factor * 2**retried)
            return random.uniform(0, delay) if self.retry_jitter else delay
        return self.default_retry_delay

    def handler(self, payload: Any, ctx: TaskContext) -> Any:
        """The durq handler: unpack the Celery arguments, run, map retries and failures."""
        if not isinstance(payload, dict):
            raise durq.SkipRetry(f"payload is not a Celery call: {type(payload).__name__}")
        args = tuple(payload.get("args") or ())
        kwargs = dict(payload.get("kwargs") or {})
        token = _request.set(
            Request(ctx.id, ctx.retried, args, kwargs, ctx.queue, ctx.headers, self.name)
        )
        try:
            return self(*args, **kwargs)
        except Retry:
            raise
        except Exception as exc:
            retryable = isinstance(exc, self.autoretry_for) and not isinstance(
                exc, self.dont_autoretry_for
            )
            if retryable:
                raise
            # Celery fails a task at its first exception unless told to retry: so does this.
            raise durq.SkipRetry(f"{type(exc).__name__}: {exc}", alert=True) from exc
        finally:
            _request.reset(token)


class Celery:
    """Celery's app object over a durq :class:`~durq.App` (``self.durq_app``), built on
    first use from ``broker`` (a durq broker URL), else ``conf.broker_url``, else
    ``DURQ_BROKER_URL``, else durq's SQLite default.

    ``app``: an existing durq app to run the Celery tasks on (beside its own), instead.
    ``durq worker module:app`` accepts this object. ``backend`` is accepted and unused:
    durq keeps results with the task."""

    _current: weakref.ReferenceType[Celery] | None = None
    _lock = threading.RLock()  # on_after_configure receivers may read durq_app

    def __init__(
        self,
        main: str | None = None,
        *,
        broker: str | None = None,
        backend: str | None = None,
        include: Iterable[str] = (),
        app: durq.App | None = None,
        **settings: Any,
    ) -> None:
        self.main = main
        self.conf = Settings(settings)
        if broker is not None:
            self.conf.broker_url = broker
        self.conf.setdefault("result_backend", backend)
        self._include = list(include)
        self._autodiscover: list[Callable[[], Iterable[str]]] = []
        self.tasks: dict[str, Task] = {}
        self.on_after_configure = Signal()
        self._periodic: list[tuple[Any, Signature, str | None, dict[str, Any]]] = []
        # A given app learns each task as it is declared; the rest (task modules to import,
        # schedules, on_after_configure) waits for the first use, as Celery's configuration.
        self._durq: durq.App | None = app
        self._configured = False
        with Celery._lock:
            Celery._current = weakref.ref(self)
        for task in _shared:
            self._register(task)

    @classmethod
    def current(cls) -> Celery | None:
        """The app made last (Celery's ``current_app``)."""
        return None if cls._current is None else cls._current()

    def __repr__(self) -> str:
        return f"<durq.contrib.celery.Celery {self.main or '__main__'}>"

    # -- configuration ------------------------------------------------------------------------

    def config_from_object(self, obj: Any, namespace: str | None = None, **_: Any) -> None:
        """Read Celery settings from an object or ``"module"`` / ``"module:attr"`` (e.g.
        ``"django.conf:settings"``); with ``namespace="CELERY"`` only ``CELERY_*`` names."""
        if isinstance(obj, str):
            module_name, _sep, attr = obj.partition(":")
            found: Any = importlib.import_module(module_name)
            for part in filter(None, attr.split(".")):
                found = getattr(found, part)
            obj = found
        prefix = f"{namespace}_" if namespace else ""
        for key in dir(obj):
            if not key.isupper() or not key.startswith(prefix):
                continue
            self.conf[key[len(prefix) :].lower()] = getattr(obj, key)

    def autodiscover_tasks(
        self,
        packages: Iterable[str] | Callable[[], Iterable[str]] | None = None,
        related_name: str = "tasks",
        **_: Any,
    ) -> None:
        """Import ``<package>.tasks`` of each package (default: Django's installed apps)
        when the durq app is built, as Celery does when its worker starts."""

        def modules() -> Iterable[str]:
            names = packages() if callable(packages) else packages
            if names is None:  # Django's installed apps, once Django is set up
                import django  # type: ignore[import-not-found]
                from django.apps import apps  # type: ignore[import-not-found]

                if not apps.ready:
                    django.setup()
                names = [config.name for config in apps.get_app_configs()]
            return [f"{name}.{related_name}" for name in names]

        self._autodiscover.append(modules)

    # -- tasks -------------------------------------------------------------------------------

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """``@app.task`` or ``@app.task(bind=True, name=..., max_retries=..., queue=...)``."""

        def decorate(func: Callable[..., Any]) -> Task:
            task = _make_task(func, options)
            task._apps.add(self)
            self._register(task)
            return task

        return decorate(fn) if fn is not None else decorate

    def _register(self, task: Task) -> None:
        self.tasks[task.name] = task
        if self._durq is not None:
            _define(self._durq, task, self.conf)

    def send_task(
        self,
        name: str,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Enqueue a task by name (it may be defined in another code base)."""
        task = self.tasks.get(name) or Task(lambda *a, **k: None, name=name)
        task._apps.add(self)
        return task.apply_async(args, kwargs, **options)

    def AsyncResult(self, task_id: str, queue: str | None = None) -> AsyncResult:
        return AsyncResult(task_id, app=self, queue=queue)

    def add_periodic_task(
        self, schedule: Any, sig: Signature, name: str | None = None, **options: Any
    ) -> None:
        """Run ``sig`` on ``schedule`` (seconds, a timedelta or a crontab), beat's way."""
        self._periodic.append((schedule, sig, name, options))
        if self._configured and self._durq is not None:
            self._add_periodic(self._durq, schedule, sig, name, options)

    # -- the durq app ------------------------------------------------------------------------

    @property
    def durq_app(self) -> durq.App:
        """The durq app behind this one (``durq worker`` runs it)."""
        with Celery._lock:
            if not self._configured:
                self._configured = True
                try:
                    self._configure(self._durq or self._new_app())
                except BaseException:
                    self._configured = False
                    raise
            assert self._durq is not None
            return self._durq

    def _new_app(self) -> durq.App:
        url = os.environ.get("DURQ_BROKER_URL") or self.conf.get("broker_url")
        if url:
            scheme = str(url).split(":", 1)[0].split("+", 1)[0]
            if scheme not in _BROKER_SCHEMES:
                raise ConfigurationError(
                    f"durq has no {scheme!r} broker: use a sqlite://, postgresql:// or redis:// "
                    "URL (or set DURQ_BROKER_URL)"
                )
        return durq.App(url or None, default_queue=self.conf.get("task_default_queue", "default"))

    def _configure(self, app: durq.App) -> None:
        """Import the task modules, then give ``app`` every task and schedule."""
        for module in [*self._include, *self.conf.get("include", ())]:
            importlib.import_module(module)
        for discover in self._autodiscover:
            for module in discover():
                try:
                    importlib.import_module(module)
                except ModuleNotFoundError as exc:
                    if exc.name != module:
                        raise
        for task in list(self.tasks.values()):
            _define(app, task, self.conf)
        self._durq = app
        for entry_name, entry in dict(self.conf.get("beat_schedule") or {}).items():
            entry_task = self.tasks.get(entry["task"])
            if entry_task is None:
                raise ConfigurationError(f"beat_schedule {entry_name!r}: no task {entry['task']!r}")
            sig = Signature(entry_task, tuple(entry.get("args", ())), dict(entry.get("kwargs", {})))
            self._add_periodic(app, entry["schedule"], sig, entry_name, entry.get("options", {}))
        for schedule, sig, name, options in list(self._periodic):
            self._add_periodic(app, schedule, sig, name, options)
        self.on_after_configure.send(self)  # what it adds goes straight to the app

    def _add_periodic(
        self,
        app: durq.App,
        schedule: Any,
        sig: Signature,
        name: str | None,
        options: Mapping[str, Any],
    ) -> None:
        app.add_periodic(
            _schedule_text(schedule),
            sig.task.name,
            payload={"args": list(sig.args), "kwargs": dict(sig.kwargs)},
            queue=options.get("queue") or sig.options.get("queue"),
            tz=self.conf.get("timezone"),
            name=_entry_name(name or sig.task.name),
        )


def _entry_name(name: str) -> str:
    """A beat entry's free-text name as a durq periodic name (letters, digits, ``_.:-``)."""
    cleaned = "".join(c if c.isalnum() or c in "_.:-" else "-" for c in name).strip("-")
    return cleaned or "periodic"


def _in(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def _define(app: durq.App, task: Task, conf: Mapping[str, Any]) -> None:
    """Register ``task`` on the durq app (idempotent: shared tasks meet every app)."""
    if task.name in app.tasks:
        return
    limit = None
    if task.rate_limit:
        limit = durq.Limit(key=f"celery-rate:{task.name}", rate=task.rate_limit)
    retries = task.max_retries if task.max_retries is not None else UNBOUNDED_RETRIES
    app.task(
        task.name,
        queue=task.queue or conf.get("task_default_queue"),
        max_retry=retries,
        timeout=task.time_limit,
        retry_delay=task.retry_delay,
        limit=limit,
    )(task.handler)


_shared: list[Task] = []


def _make_task(fn: Callable[..., Any], options: dict[str, Any]) -> Task:
    options = dict(options)
    name = options.pop("name", None) or f"{fn.__module__}.{fn.__name__}"  # as Celery names it
    for key in _IGNORED_TASK_OPTIONS:
        options.pop(key, None)
    retry_kwargs = options.pop("retry_kwargs", None) or {}
    if "max_retries" in retry_kwargs:
        options.setdefault("max_retries", retry_kwargs["max_retries"])
    if "countdown" in retry_kwargs:
        options.setdefault("default_retry_delay", retry_kwargs["countdown"])
    return Task(fn, name=name, **options)


@overload
def shared_task(fn: Callable[..., Any], /) -> Task: ...
@overload
def shared_task(**options: Any) -> Callable[[Callable[..., Any]], Task]: ...
def shared_task(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """``@shared_task``: a task every :class:`Celery` app of the process knows (for reusable
    apps, e.g. Django apps' ``tasks.py``); it enqueues through the app made last."""

    def decorate(func: Callable[..., Any]) -> Task:
        task = _make_task(func, options)
        _shared.append(task)
        current = Celery.current()
        if current is not None:
            current._register(task)
        return task

    return decorate(fn) if fn is not None else decorate
