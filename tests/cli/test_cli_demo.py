"""``durq demo`` runs to the end by itself, exits 0 and shows every lifecycle outcome."""

from __future__ import annotations

from tests.cli.clikit import Cli


def _lifecycle_args(cli: Cli) -> list[str]:
    # Once the web-service demo owns plain `durq demo`, the lifecycle demo is --lifecycle.
    help_text = cli.ok("demo", "--help").out
    return ["demo", "--lifecycle"] if "--lifecycle" in help_text else ["demo"]


def test_demo_runs_to_the_end_and_shows_the_outcomes(cli: Cli) -> None:
    args = _lifecycle_args(cli)
    # A first run: each run has its own task ids, so `make demo` can be run again on the
    # same SQLite file; the checks below are about the second run.
    assert cli(*args, timeout=30).code == 0
    result = cli(*args, timeout=30)
    assert result.code == 0, result.err
    out = result.out
    for outcome in ("completed", "archived", "conflict", "scheduled", "retry"):
        assert outcome in out, outcome
    assert "TaskIDConflictError" in out
    assert "durq task ls --queue demo --state archived" in out
    # The archive alert (W4) is one ERROR log line on stderr.
    assert "ERROR" in result.err and "task archived" in result.err

    # The tasks stay inspectable afterwards (retention).
    archived = cli.ok("task", "ls", "--queue", "demo", "--state", "archived", "--json").json()
    assert [t["type"] for t in archived] == ["demo:charge_card"] * 2
    completed = cli.ok("task", "ls", "--queue", "demo", "--state", "completed", "--json").json()
    assert sorted(t["type"] for t in completed) == sorted(
        ["demo:greet", "demo:poll_partner", "demo:remind"] * 2
    )
