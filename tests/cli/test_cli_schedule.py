"""``durq schedule``: stored schedules from the command line, in real processes."""

from __future__ import annotations

from pathlib import Path

from tests.cli.clikit import Cli, assert_one_line_error

import durq
from durq.states import TaskState

APP = """
import durq

app = durq.App()
app.add_periodic("@hourly", "job:code", queue="cron")
"""


def test_add_ls_pause_resume_trigger_rm(cli: Cli) -> None:
    added = cli.ok(
        "schedule", "add", "report:eu", "*/5 * * * *", "report:build",
        "--payload", '{"region": "eu"}', "--tz", "Europe/Berlin", "--overlap", "skip",
        "--queue", "reports", "--json",
    ).json()  # fmt: skip
    assert added[0]["name"] == "report:eu" and added[0]["source"] == "stored"
    assert (added[0]["tz"], added[0]["overlap"], added[0]["version"]) == (
        "Europe/Berlin",
        "skip",
        1,
    )
    edited = cli.ok(
        "schedule", "edit", "report:eu", "--cron", "0 * * * *", "--payload", '{"r": 2}', "--json"
    ).json()[0]
    assert (edited["schedule"], edited["payload"], edited["version"]) == ("0 * * * *", {"r": 2}, 2)
    assert edited["overlap"] == "skip" and edited["queue"] == "reports"  # the rest is kept
    listed = cli.ok("schedule", "ls").out
    assert "report:eu" in listed and "active" in listed
    assert cli.ok("schedule", "pause", "report:eu", "--json").json()[0]["state"] == "paused"
    assert "paused" in cli.ok("schedule", "ls").out
    assert cli.ok("schedule", "resume", "report:eu", "--json").json()[0]["state"] == "active"
    run = cli.ok("schedule", "trigger", "report:eu", "--json").json()
    assert run["id"].startswith("periodic:report:eu:run:") and run["queue"] == "reports"
    app = durq.App(cli.url)
    info = app.run_sync(lambda: app.inspector.get_task_info("reports", run["id"]))
    assert info.payload == {"r": 2} and info.state is TaskState.PENDING
    cli.ok("schedule", "rm", "report:eu")
    assert cli.ok("schedule", "ls", "--json").json() == []


def test_backfill_and_its_dry_run(cli: Cli) -> None:
    cli.ok("schedule", "add", "tick", "@every 5m", "job:tick", "--queue", "cron")
    window = ("--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T00:12:00Z")
    dry = cli.ok("schedule", "backfill", "tick", *window, "--dry-run", "--json").json()
    assert len(dry["ticks"]) == 3 and dry["enqueued"] == []
    done = cli.ok("schedule", "backfill", "tick", *window, "--json").json()
    assert len(done["enqueued"]) == 3
    again = cli.ok("schedule", "backfill", "tick", *window).out
    assert "0 enqueued, 3 existed already" in again
    too_many = cli("schedule", "backfill", "tick", "--from", "2026-01-01", "--to", "2026-02-01")
    assert_one_line_error(too_many, 2, "more than 1000 ticks")


def test_bad_input_is_one_line_and_exit_2(cli: Cli) -> None:
    results = cli.many(
        ["schedule", "add", "x", "not a cron", "job:run"],
        ["schedule", "add", "x", "@hourly", "job:run", "--tz", "Mars/Olympus"],
        ["schedule", "add", "x", "@hourly", "job:run", "--overlap", "sometimes"],
        ["schedule", "add", "x", "@hourly", "job:run", "--payload", "[1]"],
        ["schedule", "backfill", "x", "--from", "yesterday", "--to", "today"],
    )
    for result, fragment in zip(
        results, ["cron", "time zone", "overlap", "JSON object", "ISO 8601"], strict=True
    ):
        assert_one_line_error(result, 2, fragment)
    assert cli.ok("schedule", "ls", "--json").json() == []


def test_unknown_names_and_code_entries_exit_1(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "sched_app.py").write_text(APP, encoding="utf-8")
    assert_one_line_error(cli("schedule", "rm", "nope"), 1, "no stored schedule")
    assert_one_line_error(cli("schedule", "pause", "nope"), 1, "no stored schedule")
    refused = cli("schedule", "add", "job:code", "@daily", "job:run", "--app", "sched_app:app")
    assert_one_line_error(refused, 1, "declared in code")
    cli.ok("schedule", "add", "mine", "@daily", "job:run")
    assert_one_line_error(cli("schedule", "add", "mine", "@daily", "job:run"), 1, "stored already")
    rows = cli.ok("schedule", "ls", "--app", "sched_app:app", "--json").json()
    assert [(r["name"], r["source"]) for r in rows] == [("job:code", "code"), ("mine", "stored")]
    # durq periodic ls shows both too, with their next runs.
    status = cli.ok("periodic", "ls", "sched_app:app", "--json").json()
    assert [(r["name"], r["source"]) for r in status] == [("job:code", "code"), ("mine", "stored")]
