"""Hostile command-line input is a usage error (exit 2, one line on stderr), never an
internal error, and nothing is stored."""

from __future__ import annotations

import pytest
from tests.cli.clikit import Cli, assert_one_line_error

DEEP = '{"a": ' + "[" * 3000 + "]" * 3000 + "}"
DIGITS = '{"n": ' + "7" * 5000 + "}"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--payload", DEEP], "--payload"),
        (["--payload", DIGITS], "--payload"),
        (["--process-in", "99999999999h"], "duration"),
        (["--process-in", "1e308"], "duration"),
        (["--retention", "inf"], "duration"),
        (["--process-at", "9999-12-31T23:59:59Z"], "process_at"),
        (["--max-retry", str(10**30)], "max"),
    ],
    ids=["deep", "digits", "process-in", "process-in-1e308", "retention-inf", "year-9999", "retry"],
)
def test_hostile_options_are_usage_errors(cli: Cli, args: list[str], words: str) -> None:
    result = cli("enqueue", "email:send", *args)
    assert_one_line_error(result, 2, words)
    listed = cli.ok("queue", "ls", "--json").json()
    assert all(q["size"] == 0 for q in listed), listed


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["durq:webhook", "--payload", '{"url": "https://partner.example/hook"}'], "reserved"),
        (["durq:webhook", "--task-id", "webhook:task.completed:x"], "reserved"),
        (["email:send", "--task-id", "."], "path segments"),
        (["email:send", "--task-id", ".."], "path segments"),
    ],
    ids=["reserved-type", "reserved-type-with-id", "dot-id", "dot-dot-id"],
)
def test_S3_reserved_types_and_dot_ids_are_usage_errors(
    cli: Cli, args: list[str], words: str
) -> None:
    result = cli("enqueue", *args)
    assert_one_line_error(result, 2, words)
    listed = cli.ok("queue", "ls", "--json").json()
    assert all(q["size"] == 0 for q in listed), listed
