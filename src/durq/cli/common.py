"""What every command shares: the ``--broker``/``--json`` options, running one coroutine per
command on its own event loop, printing (rich for people, JSON for scripts) and turning errors
into one line on stderr with durq's exit codes (0 ok, 1 domain error, 2 usage error)."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar, cast

import typer

from durq.app import App
from durq.brokers import open_broker, resolve_url
from durq.errors import (
    ConfigurationError,
    DuplicateTaskError,
    DurqError,
    TaskIDConflictError,
    ValidationError,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

T = TypeVar("T")

EXIT_OK, EXIT_DOMAIN, EXIT_USAGE = 0, 1, 2

BrokerOpt = Annotated[
    str | None,
    typer.Option(
        "--broker",
        "-b",
        help="Broker URL: sqlite:///path, postgresql://..., redis://... "
        "(default: the DURQ_BROKER_URL environment variable, else sqlite:///durq.sqlite3).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
QueueOpt = Annotated[str, typer.Option("--queue", "-q", help="Queue name.")]

#: Wide enough that no value is ever wrapped or cut when the output is not a terminal.
PIPE_WIDTH = 100_000


def make_console() -> Console:
    """The console for people's output on stdout. On a terminal, tables fit its width; piped
    (not a terminal) nothing is wrapped or cut: one table row per line, every id, name, time
    and URL whole, no colour."""
    from rich.console import Console

    terminal = Console(highlight=False)
    if terminal.is_terminal:
        return terminal
    return Console(highlight=False, width=PIPE_WIDTH, soft_wrap=True)


class _FirstUseConsole:
    """Builds the console on first use: rich is imported by the commands that print for
    people, not by ``durq worker``, which only logs (a faster start)."""

    _console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            self._console = make_console()
        return getattr(self._console, name)


#: Tables for people go to stdout.
console = cast("Console", _FirstUseConsole())


def escape(text: str) -> str:
    """rich's markup escape, importing rich only when a command prints."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


#: Characters that would break a row over lines or act on a terminal: C0 and C1 controls,
#: DEL, and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match[0]
    return _NAMED.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def one_field(text: str) -> str:
    """``text`` on one line: control characters written as escapes (``\\n``, ``\\r``,
    ``\\t``, ``\\x1b``...), as Python writes them in a string literal."""
    return _CONTROL.sub(_escaped, text)


def make_table(title: str | None = None, caption: str | None = None) -> Table:
    """A compact table (no vertical rules), one line per row."""
    from rich import box

    from durq.cli.tables import RowTable

    return RowTable(
        title=title,
        title_justify="left",
        caption=caption,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
    )


def examples(*lines: str) -> str:
    """A command's help epilog: ``Examples:`` then one command per paragraph."""
    return "Examples:\n\n" + "\n\n".join(f"  {line}" for line in lines)


class UsageFailure(DurqError):
    """Invalid command-line input (exit code 2)."""


def load_app(spec: str, broker: str | None = None) -> App:
    """Import ``module:attribute`` (the current directory first on ``sys.path``, as uvicorn
    does) and check that it names a :class:`durq.App` (or an object whose ``durq_app`` is
    one, such as :class:`durq.contrib.celery.Celery`).

    ``broker``, else ``DURQ_BROKER_URL``, overrides the broker the app was built with."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageFailure(
            f"APP must look like module:attribute (e.g. examples.quickstart:app), got {spec!r}"
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UsageFailure(
                f"cannot import {module_name!r}: no such module "
                "(run from the directory that contains it, or set PYTHONPATH)"
            ) from None
        raise UsageFailure(f"cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the user's module failed while importing: say how, in one line
        raise UsageFailure(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageFailure(f"module {module_name!r} has no attribute {attr!r}") from None
    # An adapter's app object (durq.contrib.celery.Celery) carries the durq app it runs.
    if not isinstance(obj, App):
        try:
            obj = getattr(obj, "durq_app", obj)
        except DurqError as exc:
            raise UsageFailure(f"{spec}: {exc}") from None
    if not isinstance(obj, App):
        raise UsageFailure(f"{spec} is a {type(obj).__name__}, not a durq.App")
    url = broker or os.environ.get("DURQ_BROKER_URL")
    if url:
        obj.broker_url = url
    if obj.broker_url is not None:
        open_broker(obj.broker_url)  # an unknown scheme is a usage error, before any I/O
    return obj


def make_app(broker: str | None) -> App:
    """An App on ``broker`` (else ``DURQ_BROKER_URL``, else the SQLite default).

    The broker is built once here so an unknown URL scheme is a usage error before any I/O."""
    url = resolve_url(broker)
    open_broker(url)  # validates the scheme (ConfigurationError) without connecting
    return App(url)


def run(broker: str | App | None, body: Callable[[App], Awaitable[T]]) -> T:
    """Run ``body(app)`` on a fresh event loop (one per command), then close the broker.

    ``broker`` is a URL (or ``None`` for the default), or an app loaded with ``--app``."""
    app = broker if isinstance(broker, App) else make_app(broker)

    async def main() -> T:
        try:
            return await body(app)
        finally:
            await app.close()

    return asyncio.run(main())


def print_json(data: Any) -> None:
    """One JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, default=str, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def fmt_time(value: datetime | float | None) -> str:
    """A moment for tables: local-free ISO seconds in UTC, ``-`` when absent."""
    if value is None or value == 0:
        return "-"
    if not isinstance(value, datetime):
        value = datetime.fromtimestamp(value, UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def fmt_age(seconds: float) -> str:
    """``42s``, ``3m12s``, ``2h05m``: short ages for tables."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def one_line(text: str) -> str:
    """Collapse a message to one line (errors are one line, no traceback)."""
    return " ".join(str(text).split())


def describe_error(exc: BaseException) -> tuple[str, int]:
    """The one-line message and the exit code for an error raised by a command."""
    if isinstance(exc, TaskIDConflictError):
        existing = exc.existing
        if existing is not None:
            return (
                f"task id {existing.id!r} already exists in queue {existing.queue!r} "
                f"(state {existing.state.value}, type {existing.type})",
                EXIT_DOMAIN,
            )
        return exc.message, EXIT_DOMAIN
    if isinstance(exc, DuplicateTaskError) and exc.existing_id:
        return f"{exc.message} (existing task {exc.existing_id})", EXIT_DOMAIN
    if isinstance(exc, ValidationError | ConfigurationError | UsageFailure):
        return exc.message, EXIT_USAGE
    if isinstance(exc, DurqError):
        return exc.message, EXIT_DOMAIN
    return f"{type(exc).__name__}: {exc}", EXIT_DOMAIN


def confirm_or_refuse(question: str, yes: bool) -> None:
    """Go on only when ``--yes`` was given or a person at a terminal says yes.

    Without a terminal (a script, a pipe) and without ``--yes`` it refuses: exit code 2."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageFailure("no terminal to confirm on: add --yes to do it without asking")
    if not typer.confirm(question, default=False, err=True):
        fail("not confirmed: nothing done")


def fail(message: str, code: int = EXIT_DOMAIN) -> NoReturn:
    """Print ``error: message`` (one line) on stderr and exit with ``code``."""
    sys.stderr.write(f"error: {one_line(message)}\n")
    sys.stderr.flush()
    raise SystemExit(code)


def parse_json_object(text: str | None, what: str = "--payload") -> dict[str, Any]:
    """A JSON object from the command line; a usage error for anything else."""
    if text is None or text == "":
        return {}
    value = parse_json(text, what)
    if not isinstance(value, dict):
        raise UsageFailure(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def parse_json(text: str, what: str) -> Any:
    """Any JSON value from the command line; a usage error when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageFailure(f"{what} is not valid JSON: {exc.msg} at position {exc.pos}") from None
    except RecursionError:
        raise UsageFailure(f"{what} is nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise UsageFailure(f"{what} is not usable JSON: {exc}") from None
