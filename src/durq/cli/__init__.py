"""The ``durq`` command line.

Each command group lives in its own module and registers itself on :data:`app` with one line
below; :func:`main` runs the app and maps errors to durq's exit codes (0 ok, 1 domain error,
2 usage error), always as one line on stderr and without a traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Annotated, Any

import typer

from durq.cli import (
    bench,
    common,
    dash,
    demo,
    encryption,
    enqueue,
    group,
    limit,
    migrate,
    queue,
    schedule,
    scheduler,
    task,
    worker,
    workers,
    workflow,
)
from durq.errors import DurqError

app = typer.Typer(
    name="durq",
    help="durq: durable background tasks. Run workers, enqueue and inspect tasks.",
    epilog=(
        "Examples:\n\n"
        "  durq demo\n\n"
        "  durq worker examples.quickstart:app --concurrency 20\n\n"
        '  durq enqueue email:send --payload \'{"to": "a@b.c"}\'\n\n'
        "  durq task ls --queue default --state archived\n\n"
        "The broker comes from --broker, else $DURQ_BROKER_URL, else sqlite:///durq.sqlite3."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"durq {version()}")
        raise typer.Exit(0)


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            callback=_print_version,
            is_eager=True,
            help="Print durq's version and exit.",
        ),
    ] = False,
) -> None:
    """durq: durable background tasks. Run workers, enqueue and inspect tasks."""


def version() -> str:
    """The installed durq's version (its package metadata; the source tree's otherwise)."""
    try:
        return metadata.version("durq")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        from durq import __version__

        return __version__


# One line per command group; new groups (dash, bench) add a module and a line here.
worker.register(app)
enqueue.register(app)
task.register(app)
group.register(app)
workflow.register(app)
queue.register(app)
workers.register(app)
limit.register(app)
migrate.register(app)
demo.register(app)
bench.register(app)
scheduler.register(app)
schedule.register(app)
dash.register(app)
encryption.register(app)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``durq`` script (and ``python -m durq``)."""
    sys.exit(run(argv))


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit code."""
    command = typer.main.get_command(app)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = command.main(args, prog_name="durq", standalone_mode=False)
    except DurqError as exc:
        message, code = common.describe_error(exc)
        return _error(message, code)
    except (KeyboardInterrupt, typer.Abort):
        return _error("interrupted", 130)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:
        if _is_click_error(exc):
            return _click_error(exc)
        if os.environ.get("DURQ_DEBUG"):
            raise
        return _error(
            f"internal error: {type(exc).__name__}: {exc} (DURQ_DEBUG=1 shows the traceback)",
            common.EXIT_DOMAIN,
        )
    return result if isinstance(result, int) else 0


def _is_click_error(exc: BaseException) -> bool:
    # typer may vendor its own click: recognise its errors by shape, not by class.
    return hasattr(exc, "format_message") and hasattr(exc, "exit_code")


def _click_error(exc: Any) -> int:
    names = {cls.__name__ for cls in type(exc).__mro__}
    ctx = getattr(exc, "ctx", None)
    if "NoArgsIsHelpError" in names and ctx is not None:
        # A bare group (``durq``, ``durq task``) shows its help, not an error.
        typer.echo(ctx.get_help())
        return common.EXIT_OK
    message = str(exc.format_message())
    if "UsageError" in names:
        path = ctx.command_path if ctx is not None else "durq"
        return _error(f"{message} (see '{path} --help')", common.EXIT_USAGE)
    return _error(message, int(exc.exit_code))


def _error(message: str, code: int) -> int:
    sys.stderr.write(f"error: {common.one_line(message)}\n")
    sys.stderr.flush()
    return code


__all__ = ["app", "main", "run"]
