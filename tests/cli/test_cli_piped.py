"""The CLI read by a script: through a pipe (not a terminal) every value comes out whole, one
table row per line, whatever its length; destructive bulk commands ask or refuse."""

from __future__ import annotations

import asyncio
import io
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.cli.clikit import Cli, Result

import durq
import durq.testing

# Longer than any 80-column layout can hold in one cell.
QUEUE = "insurance-partner-coverage-checks-eu-west"
TASK_ID = "coverage:ord_dce78cfd853c516acce60f51-retry-after-partner-outage"
TYPE = "insurance:check_coverage_with_partner"


@pytest.fixture
def piped(cli: Cli) -> Cli:
    """The CLI with no COLUMNS hint: what a script's pipe gets by default."""
    cli.env.pop("COLUMNS", None)
    return cli


def row(result: Result, first: str) -> str:
    """The one output line that starts with ``first`` (a table row)."""
    lines = [line for line in result.out.splitlines() if line.lstrip().startswith(first)]
    assert len(lines) == 1, result.out
    return lines[0]


def test_queue_ls_and_task_ls_keep_ids_names_and_times_whole(piped: Cli) -> None:
    when = "2031-05-17T08:09:10+00:00"
    piped.ok("enqueue", TYPE, "--queue", QUEUE, "--task-id", TASK_ID, "--process-at", when)

    queues = piped.ok("queue", "ls")
    header = row(queues, "queue ")
    assert header.split() == [
        "queue", "pending", "scheduled", "active", "retry", "archived", "completed", "waiting",
        "oldest", "today", "total",
    ]  # fmt: skip
    assert row(queues, QUEUE).split()[:7] == [QUEUE, "0", "1", "0", "0", "0", "0"]

    tasks = piped.ok("task", "ls", "--queue", QUEUE, "--state", "scheduled")
    line = row(tasks, TASK_ID)
    assert f" {TYPE} " in line and " scheduled " in line
    assert " 2031-05-17 08:09:10" in line  # the whole time, date and clock on one line


def test_periodic_ls_keeps_the_next_run_whole(piped: Cli, tmp_path: Path) -> None:
    (tmp_path / "schedules.py").write_text(
        "import durq\n"
        "app = durq.App()\n"
        f"app.add_periodic('@every 45s', {TYPE!r}, queue={QUEUE!r},"
        " name='partner-coverage-recheck-every-45-seconds')\n"
    )
    listed = piped.ok("periodic", "ls", "schedules:app")
    line = row(listed, "partner-coverage-recheck-every-45-seconds")
    cells = line.split()
    assert TYPE in cells and QUEUE in cells
    # The next run as one whole ISO time (its value moves on with the clock).
    assert any(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", c) for c in cells), line


def test_lifecycle_demo_keeps_each_command_on_one_line(piped: Cli) -> None:
    result = piped("demo", "--lifecycle", "--broker", piped.url, timeout=60)
    assert result.code == 0, result.err
    # Every hint repeats --broker with its (long) URL: flag and URL on one line.
    wanted = f"durq task ls --queue demo --state archived --broker {piped.url}"
    assert wanted in [line.strip() for line in result.out.splitlines()]


def test_delete_all_without_a_terminal_refuses_unless_yes(piped: Cli) -> None:
    for i in range(2):
        piped.ok("enqueue", TYPE, "--queue", QUEUE, "--task-id", f"{TASK_ID}-{i}")
    refused = piped("queue", "delete-all", QUEUE, "--state", "pending")
    assert refused.code == 2
    assert (
        refused.err.strip() == "error: no terminal to confirm on: add --yes to do it without asking"
    )
    assert len(piped.ok("task", "ls", "--queue", QUEUE, "--json").json()) == 2
    done = piped.ok("queue", "delete-all", QUEUE, "--state", "pending", "--yes", "--json").json()
    assert done == {"queue": QUEUE, "state": "pending", "deleted": 2}
    assert piped.ok("task", "ls", "--queue", QUEUE, "--json").json() == []


def _on_a_terminal(cli: Cli, args: list[str], answer: str) -> tuple[int, str]:
    """Run ``durq args`` with a pseudo-terminal as stdin, stdout and stderr; type ``answer``."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "durq", *args],
        cwd=cli.tmp_path,
        env=cli.env,
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        close_fds=True,
    )
    os.close(secondary)
    os.write(primary, answer.encode() + b"\n")
    chunks = []
    while True:
        try:
            data = os.read(primary, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(primary)
    return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")


def test_delete_all_on_a_terminal_asks_first(piped: Cli) -> None:
    piped.ok("enqueue", TYPE, "--queue", QUEUE, "--task-id", TASK_ID)
    args = ["queue", "delete-all", QUEUE, "--state", "pending"]
    code, screen = _on_a_terminal(piped, args, "n")
    assert f"Delete every pending task of queue '{QUEUE}'?" in screen
    assert code == 1 and "nothing done" in screen
    assert len(piped.ok("task", "ls", "--queue", QUEUE, "--json").json()) == 1
    code, screen = _on_a_terminal(piped, args, "y")
    assert code == 0 and "1 pending task(s)" in screen
    assert piped.ok("task", "ls", "--queue", QUEUE, "--json").json() == []


def test_help_names_the_broker_variable_and_gives_examples(piped: Cli) -> None:
    for command in ("get", "ls", "run", "archive", "cancel", "delete"):
        text = piped.ok("task", command, "--help").out
        assert "DURQ_BROKER_URL" in text, command
        assert "Examples:" in text and f"durq task {command} " in text, command
    assert "--yes" in piped.ok("queue", "delete-all", "--help").out


# A stored error as handlers write them: several lines, a tab, a carriage return and a
# terminal colour code.
ERROR = "partner said:\nHTTP 503\r\n\tretry later \x1b[31mred\x1b[0m"
SHOWN = "partner said:\\nHTTP 503\\r\\n\\tretry later \\x1b[31mred\\x1b[0m"


def test_a_multi_line_error_stays_on_its_row(piped: Cli) -> None:
    """Piped, every field of every row is one line: control characters come out escaped."""
    piped.ok("enqueue", TYPE, "--queue", QUEUE, "--task-id", TASK_ID)
    app = durq.App(piped.url)

    @app.task(TYPE, queue=QUEUE, max_retry=0)
    def fails(payload: dict[str, object]) -> None:
        raise durq.SkipRetry(ERROR)

    async def drain() -> None:
        async with durq.testing.worker(app) as w:
            assert (await w.drain()).outcomes == [(TYPE, "archived")]
        await app.close()

    asyncio.run(drain())
    stored = piped.ok("task", "get", TASK_ID, "--queue", QUEUE, "--json").json()
    assert ERROR in stored["last_error"]  # the JSON keeps the error as it is

    listed = piped.ok("task", "ls", "--queue", QUEUE, "--state", "archived")
    line = row(listed, TASK_ID)
    assert SHOWN[:40] in line  # the column holds the start of the error, on this line
    assert not any(c in listed.out.replace("\n", "") for c in "\r\t\x1b")
    assert len(listed.out.strip().splitlines()) == 4  # title, header, rule, one row

    shown = piped.ok("task", "get", TASK_ID, "--queue", QUEUE)
    lines = shown.out.splitlines()
    assert any(" last_error " in line and SHOWN in line for line in lines)
    assert not any(c in shown.out.replace("\n", "") for c in "\r\t\x1b")
    # One line per field, a traceback too: no row goes on with an empty field name.
    rows = [line.split("│") for line in lines if line.startswith("│")]
    assert rows and all(cells[1].strip() for cells in rows), shown.out


def test_one_field_escapes_every_control_character() -> None:
    from rich.console import Console

    from durq.cli.common import make_table, one_field

    table = make_table("queues")  # the table of queue ls, workers, limit ls, group get...
    table.add_column("name")
    table.add_row("two\nlines")
    out = io.StringIO()
    Console(file=out, width=200).print(table)
    text = out.getvalue()
    assert "two\\nlines" in text and "\nlines" not in text

    assert one_field("a\nb\r\tc\x00\x7f\x85\u2028 é ✓") == (
        "a\\nb\\r\\tc\\x00\\x7f\\x85\\u2028 é ✓"
    )
