"""``DurqBackend``: Django's Tasks framework (``django.tasks``) on a durq broker.

Settings (every key of ``OPTIONS`` optional)::

    TASKS = {
        "default": {
            "BACKEND": "durq.contrib.django.DurqBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {
                "database": "default",      # the broker lives in this Django database
                # or "broker_url": "redis://…" (else DURQ_BROKER_URL, else the SQLite default)
                "retention": "7d",          # how long results are kept (default 7 days)
                "max_retry": 0,             # retries after a failed attempt (default none)
                "timeout": None,            # per attempt, seconds or "30s"
                "enqueue_on_commit": True,  # see below
                "task_modules": [],         # extra modules the worker imports for tasks
            },
        }
    }

Inside ``transaction.atomic()`` the task row is written in the same transaction as the
business write when the broker is the Django database itself (SQLite file or PostgreSQL
database through psycopg 3): a rollback leaves no task, a commit makes it visible at once.
Where the broker cannot join (Redis, another database), the enqueue waits for the commit
(``transaction.on_commit``) unless ``enqueue_on_commit`` is ``False``."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

from django.db import connections, transaction
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone

import durq
from durq import durations
from durq.brokers import resolve_url
from durq.brokers.sqlite.files import parse_file_mode
from durq.contrib.django import records, registry
from durq.errors import ConfigurationError, DurqError, InvalidNameError, TaskNotFoundError
from durq.names import check_queue, check_type
from durq.options import EnqueueRequest
from durq.sync import SyncRunner

R = TypeVar("R")

#: How long a completed task and its result are kept when ``OPTIONS`` says nothing: durq's
#: own default is an hour; Django's results are meant to be read later.
DEFAULT_RETENTION = 7 * 24 * 3600.0


def _keep_mode(path: str) -> str:
    """``?file_mode=`` of Django's own SQLite file: the file is Django's, so durq keeps its
    mode rather than warning, at every start, that it is wider than durq's 0600."""
    try:
        mode = os.stat(path).st_mode & 0o777
        parse_file_mode(f"{mode:o}")
    except (OSError, ConfigurationError):
        return ""  # not there yet (durq creates it 0600), or a mode durq refuses: its warning
    return f"?file_mode={mode:o}"


def database_url(alias: str, schema: str = "durq") -> str:
    """The durq broker URL of Django database ``alias`` (SQLite or PostgreSQL)."""
    conn = connections[alias]
    settings = conn.settings_dict
    if conn.vendor == "sqlite":
        name = str(settings["NAME"])
        if name == ":memory:" or name.startswith("file:") or "mode=memory" in name:
            raise InvalidTask(
                f"database {alias!r} is in memory: durq's worker needs a file "
                "(set DATABASES[...]['TEST']['NAME'] to a file for tests)"
            )
        path = os.path.abspath(name)
        return f"sqlite:///{path}{_keep_mode(path)}"
    if conn.vendor == "postgresql":
        user = quote(settings.get("USER") or "", safe="")
        password = quote(settings.get("PASSWORD") or "", safe="")
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = settings.get("HOST") or ""
        port = f":{settings['PORT']}" if settings.get("PORT") else ""
        name = quote(str(settings.get("NAME") or ""), safe="")
        return f"postgresql://{auth}{host}{port}/{name}?schema={quote(schema, safe='')}"
    raise InvalidTask(f"durq cannot use the {conn.vendor} database {alias!r} as its broker")


class DurqBackend(BaseTaskBackend):  # type: ignore[misc]
    """A Django task backend whose tasks durq stores, runs (``manage.py durq_worker``) and
    shows (the dashboard, ``durq task get``), with leases, retries and retention."""

    supports_defer = True  # run_after: durq's process_at
    supports_async_task = True  # async functions run on the worker's event loop
    supports_get_result = True  # from any process, while the result is retained
    supports_priority = True  # durq's priority: the same -100..100 range, higher first

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(self.options)
        unknown = set(options) - {
            "broker_url",
            "database",
            "schema",
            "retention",
            "max_retry",
            "timeout",
            "enqueue_on_commit",
            "task_modules",
        }
        if unknown:
            raise InvalidTask(f"unknown OPTIONS for {alias!r}: {', '.join(sorted(unknown))}")
        if options.get("broker_url") and options.get("database"):
            raise InvalidTask("OPTIONS take either 'broker_url' or 'database', not both")
        self.database: str | None = options.get("database")
        self._broker_url: str | None = options.get("broker_url")
        self.schema: str = options.get("schema", "durq")
        retention = options.get("retention", DEFAULT_RETENTION)
        self.retention = durations.seconds(retention) or 0.0
        self.max_retry = int(options.get("max_retry", 0))
        self.timeout = durations.seconds(options.get("timeout"))
        self.enqueue_on_commit = bool(options.get("enqueue_on_commit", True))
        self.task_modules: list[str] = list(options.get("task_modules", []))
        self._app: durq.App | None = None
        self._runner: SyncRunner | None = None
        self._ready = False
        self._lock = threading.Lock()

    # -- the durq side ---------------------------------------------------------------------

    @property
    def broker_url(self) -> str:
        """The broker URL: ``broker_url``, else the ``database``'s, else ``DURQ_BROKER_URL``,
        else the SQLite default."""
        if self._broker_url:
            return self._broker_url
        if self.database:
            return database_url(self.database, self.schema)
        return resolve_url(None)

    @property
    def app(self) -> durq.App:
        """The durq app of this backend (enqueue, inspector, and the worker's handlers)."""
        with self._lock:
            if self._app is None:
                self._app = durq.App(self.broker_url)
            return self._app

    def call(self, make: Callable[[], Coroutine[Any, Any, R]]) -> R:
        """Run ``make()`` (a coroutine using :attr:`app`, e.g. its inspector) and return its
        result, from sync code."""
        return self._run(make)

    def _run(self, make: Callable[[], Coroutine[Any, Any, R]]) -> R:
        """Run a coroutine on this backend's own loop (one broker for every caller thread)."""
        return self._ready_runner().run(make)

    def _ready_runner(self) -> SyncRunner:
        with self._lock:
            if self._runner is None:
                self._runner = SyncRunner()
            runner = self._runner
        self._ensure_ready(runner)
        return runner

    async def _arun(self, make: Callable[[], Coroutine[Any, Any, R]]) -> R:
        """:meth:`_run` for async callers: awaited, without blocking their loop."""
        return await asyncio.to_thread(self._run, make)

    def _ensure_ready(self, runner: SyncRunner) -> None:
        # The durq tables must exist before a transaction can hold a task row; migrating is
        # idempotent and runs once per process (``manage.py migrate`` also runs it).
        if not self._ready:
            runner.run(self.migrate)
            self._ready = True

    async def migrate(self) -> list[str]:
        """Create or upgrade durq's tables in the broker (idempotent)."""
        broker = self.app.new_broker()  # PostgreSQL's connect() needs the tables already
        try:
            return await broker.migrate()
        finally:
            await broker.close()

    def ready(self) -> None:
        """Open the broker and create durq's tables if needed (done on first use anyway).

        With ``database``, a broker opened before the database's settings changed (a test
        database) is closed and opened on the current one."""
        if self._app is not None and self._app.broker_url != self.broker_url:
            self.close()
        self._ready_runner()

    def close(self) -> None:
        """Close the broker connections and the loop (a later call opens them again)."""
        with self._lock:
            runner, self._runner = self._runner, None
            app, self._app = self._app, None
            self._ready = False
        if runner is not None and app is not None:
            runner.run(app.close)
            runner.close()

    # -- validation ------------------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        """Django's checks, plus durq's names: the queue and the function's module path."""
        super().validate_task(task)
        try:
            check_queue(task.queue_name)
            check_type(task.module_path)
        except InvalidNameError as exc:
            raise InvalidTask(str(exc)) from None

    # -- enqueue ---------------------------------------------------------------------------

    def _request(self, task: Task, result: TaskResult) -> EnqueueRequest:
        return EnqueueRequest(
            task.module_path,
            {"args": result.args, "kwargs": result.kwargs},
            queue=task.queue_name,
            task_id=result.id,
            process_at=task.run_after,
            max_retry=self.max_retry,
            timeout=self.timeout,
            retention=self.retention,
            priority=records.django_to_durq_priority(task.priority),
            headers=records.task_headers(task, self.alias),
        )

    def _pending(self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
        self.validate_task(task)
        registry.remember(task)
        return TaskResult(  # normalises args/kwargs to JSON (TypeError "Unsupported type")
            task=task,
            id=uuid.uuid4().hex,
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    def _enqueued(self, result: TaskResult, info: durq.TaskInfo) -> TaskResult:
        object.__setattr__(result, "enqueued_at", records.local_time(info.enqueued_at))
        task_enqueued.send(type(self), task_result=result)
        return result

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
        """Store the task in durq; inside ``atomic()`` in the same transaction when the broker
        is this Django database, else on commit (see the module docstring)."""
        result = self._pending(task, args, kwargs)
        request = self._request(task, result)
        app = self.app
        conn = self._atomic_connection()
        if conn is not None:
            if self._joinable(conn):
                self._ready_runner()  # the durq tables exist (migrated once per process)
                info = app.enqueue_request_sync(request, connection=conn.connection)
                return self._enqueued(result, info)
            if self.enqueue_on_commit:
                app.params(request)  # refuse a bad payload now, not after the commit
                object.__setattr__(result, "enqueued_at", timezone.now())
                transaction.on_commit(
                    lambda: self._enqueued(result, self._run(lambda: app.enqueue_request(request))),
                    using=conn.alias,
                )
                return result
        info = self._run(lambda: app.enqueue_request(request))
        return self._enqueued(result, info)

    async def aenqueue(self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
        """:meth:`enqueue` for async code (outside a transaction: Django's are sync-only)."""
        result = self._pending(task, args, kwargs)
        request = self._request(task, result)
        app = self.app
        info = await self._arun(lambda: app.enqueue_request(request))
        return self._enqueued(result, info)

    def _atomic_connection(self) -> Any:
        """Django's connection if it is inside ``atomic()`` (the broker's database, or
        ``default``), else ``None``."""
        alias = self.database or "default"
        if alias not in connections:
            return None
        conn = connections[alias]
        return conn if conn.in_atomic_block else None

    def _joinable(self, conn: Any) -> bool:
        """Whether the broker is ``conn``'s database, so a task can join its transaction."""
        url = self.broker_url
        kind = url.split(":", 1)[0].lower()
        if conn.vendor == "sqlite" and kind == "sqlite":
            same = self.database is not None or _same_file(url, conn.settings_dict["NAME"])
        elif conn.vendor == "postgresql" and kind in ("postgresql", "postgres"):
            same = self.database is not None or _same_postgres(url, conn)
            same = same and type(conn.connection).__module__.startswith("psycopg")
        else:
            return False
        if same:
            conn.ensure_connection()
        return same

    # -- results ---------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result from durq's record (any process); ``TaskResultDoesNotExist``
        once it is deleted (after its retention) or if it never existed."""
        return self._run(lambda: self._find(str(result_id)))

    async def aget_result(self, result_id: str) -> TaskResult:
        """:meth:`get_result` for async code."""
        return await self._arun(lambda: self._find(str(result_id)))

    async def _find(self, result_id: str) -> TaskResult:
        inspector = self.app.inspector
        queues = sorted(self.queues) or [q.name for q in await inspector.list_queues()]
        for queue in queues:
            try:
                info = await inspector.get_task_info(queue, result_id)
            except (TaskNotFoundError, InvalidNameError):
                continue
            except DurqError as exc:
                raise TaskResultDoesNotExist(f"{result_id}: {exc}") from exc
            base = registry.lookup(info.type, self.task_modules)
            if base is None:
                raise TaskResultDoesNotExist(
                    f"{result_id}: its function {info.type!r} is not in an imported module"
                )
            info = self.app.decrypted(info)  # Django's result carries args and return value
            return records.to_result(info, records.rebuild(base, info), self.alias)
        raise TaskResultDoesNotExist(result_id)

    def check(self, **kwargs: Any) -> list[Any]:
        """No system checks beyond Django's."""
        return []


def _same_file(url: str, name: Any) -> bool:
    from durq.brokers.sqlite import SQLiteBroker

    path = SQLiteBroker.from_url(url).path
    return os.path.realpath(path) == os.path.realpath(str(name))


def _same_postgres(url: str, conn: Any) -> bool:
    from psycopg.conninfo import conninfo_to_dict

    from durq.brokers.postgres import PostgresBroker

    dsn, _ = PostgresBroker.parse_url(url)
    want = conninfo_to_dict(dsn)
    conn.ensure_connection()
    info = conn.connection.info
    return bool(
        want.get("dbname", "") == info.dbname
        and str(want.get("host") or "") in ("", info.host)
        and str(want.get("port") or "5432") == str(info.port)
    )
