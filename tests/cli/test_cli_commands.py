"""The durq command line through a real subprocess: output, --json and exit codes (SPEC
"Command line": 0 ok, 1 domain error, 2 usage error, one line on stderr, no traceback)."""

from __future__ import annotations

from pathlib import Path

from tests.cli.clikit import REPO, Cli, assert_one_line_error

import durq
import durq.brokers.base
from durq.brokers.base import ArchiveParams, ClaimParams, CompleteParams, RetryParams


def test_enqueue_then_task_get_json_roundtrip(cli: Cli) -> None:
    created = cli.ok(
        "enqueue", "email:send", "--payload", '{"to": "a@b.c"}', "--task-id", "order-1",
        "--max-retry", "3", "--timeout", "10s", "--retention", "24h", "--json",
    ).json()  # fmt: skip
    assert created["id"] == "order-1"
    assert created["state"] == "pending"
    assert created["payload"] == {"to": "a@b.c"}
    assert (created["max_retry"], created["timeout"], created["retention"]) == (3, 10.0, 86400.0)

    got = cli.ok("task", "get", "order-1", "--queue", "default", "--json").json()
    assert got == created


def test_enqueue_human_output_and_delay(cli: Cli) -> None:
    result = cli.ok("enqueue", "report:build", "--queue", "low", "--process-in", "1h")
    assert "scheduled" in result.out and "report:build" in result.out
    at = cli.ok(
        "enqueue", "report:build", "--process-at", "2099-01-01T00:00:00Z", "--json"
    ).json()  # fmt: skip
    assert at["state"] == "scheduled"
    assert at["next_process_at"].startswith("2099-01-01T00:00:00")


def test_task_id_conflict_exits_1_naming_the_existing_task(cli: Cli) -> None:
    cli.ok("enqueue", "email:send", "--task-id", "order-7")
    result = cli("enqueue", "email:send", "--task-id", "order-7", "--payload", '{"x": 1}')
    assert_one_line_error(result, 1, "order-7", "pending")
    assert result.out == ""
    # Nothing changed: the first task keeps its (empty) payload.
    assert cli.ok("task", "get", "order-7", "--json").json()["payload"] == {}


def test_unique_duplicate_exits_1_naming_the_first_task(cli: Cli) -> None:
    first = cli.ok("enqueue", "t", "--payload", '{"a": 1}', "--unique", "1h", "--json").json()
    result = cli("enqueue", "t", "--payload", '{"a": 1}', "--unique", "1h")
    assert_one_line_error(result, 1, first["id"])


def test_bad_payload_is_a_usage_error(cli: Cli) -> None:
    assert_one_line_error(cli("enqueue", "email:send", "--payload", '{"to": '), 2, "--payload")
    assert_one_line_error(cli("enqueue", "email:send", "--payload", "[1, 2]"), 2, "JSON object")
    # Nothing was written.
    assert cli.ok("queue", "ls", "--json").json() == []


def test_usage_errors_exit_2(cli: Cli) -> None:
    cases = [
        (["enqueue", "t", "--process-in", "5x"], "duration"),
        (["enqueue", "t", "--timeout", "-3"], "--timeout"),
        (["enqueue", "t", "--queue", "bad queue!"], "queue name"),
        (["enqueue", "bad type!"], "task type"),
        (["enqueue", "t", "--process-at", "tomorrow"], "ISO 8601"),
        (["task", "ls", "--state", "sleeping"], "unknown state"),
        (["task", "ls", "--limit", "many"], "--limit"),
        (["task", "get"], "ID"),
        (["no-such-command"], "no-such-command"),
        (["worker", "x:app", "--queues", "a=x"], "weight"),
    ]
    results = cli.many(*(args for args, _ in cases))
    for (_, fragment), result in zip(cases, results, strict=True):
        assert_one_line_error(result, 2, fragment)


def test_unknown_broker_scheme_exits_2(cli: Cli) -> None:
    commands = [["queue", "ls"], ["enqueue", "t"], ["migrate"], ["workers"], ["demo"]]
    for result in cli.many(*([*c, "--broker", "mysql://localhost/x"] for c in commands)):
        assert_one_line_error(result, 2, "mysql")


def test_unreachable_or_corrupt_database_exits_1(cli: Cli, tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'x.db'}"
    assert_one_line_error(cli("queue", "ls", "--broker", missing), 1)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    assert_one_line_error(cli("enqueue", "t", "--broker", f"sqlite:///{garbage}"), 1)


def test_unknown_task_exits_1(cli: Cli) -> None:
    cli.ok("enqueue", "t")  # the queue exists; the task does not
    verbs = ("get", "run", "delete", "archive", "cancel")
    for result in cli.many(*(["task", verb, "nope", "--queue", "default"] for verb in verbs)):
        assert_one_line_error(result, 1, "nope")


def test_queue_pause_unpause_ls(cli: Cli) -> None:
    cli.ok("enqueue", "t", "--queue", "emails")
    cli.ok("enqueue", "t", "--queue", "emails", "--process-in", "1h")
    assert cli.ok("queue", "pause", "emails", "--json").json() == {
        "queue": "emails",
        "paused": True,
    }
    (queue,) = cli.ok("queue", "ls", "--json").json()
    assert queue["name"] == "emails" and queue["paused"] is True
    assert queue["sizes"]["pending"] == 1 and queue["sizes"]["scheduled"] == 1
    assert queue["size"] == 2
    people = cli.ok("queue", "ls").out
    assert "emails*" in people and "paused" in people

    cli.ok("queue", "unpause", "emails")
    assert cli.ok("queue", "ls", "--json").json()[0]["paused"] is False
    assert_one_line_error(cli("queue", "pause", "bad name"), 2, "queue name")


def test_task_ls_run_archive_delete_cancel(cli: Cli) -> None:
    cli.ok("enqueue", "t", "--task-id", "later", "--process-in", "1h")
    cli.ok("enqueue", "t", "--task-id", "now")

    scheduled = cli.ok("task", "ls", "--queue", "default", "--state", "scheduled", "--json")
    assert [t["id"] for t in scheduled.json()] == ["later"]
    assert "later" in cli.ok("task", "ls", "--state", "scheduled").out

    assert cli.ok("task", "run", "later", "--json").json()["state"] == "pending"
    pending = cli.ok("task", "ls", "--state", "pending", "--json").json()
    assert sorted(t["id"] for t in pending) == ["later", "now"]
    # Pages: one task per page, in order.
    page2 = cli.ok("task", "ls", "--state", "pending", "--limit", "1", "--page", "2", "--json")
    assert len(page2.json()) == 1

    assert cli.ok("task", "archive", "later", "--json").json()["state"] == "archived"
    archived = cli.ok("task", "ls", "--state", "archived", "--json").json()
    assert [t["id"] for t in archived] == ["later"]
    # Archived cannot be archived again: a domain error.
    assert_one_line_error(cli("task", "archive", "later"), 1)

    cancelled = cli.ok("task", "cancel", "now", "--json").json()
    assert cancelled["state"] == "archived" and cancelled["last_error"] == "cancelled"

    assert cli.ok("task", "delete", "later", "--json").json()["deleted"] is True
    assert_one_line_error(cli("task", "get", "later"), 1, "later")
    assert "no pending tasks" in cli.ok("task", "ls").out


def test_queue_run_all_and_delete_all(cli: Cli) -> None:
    for i in range(3):
        cli.ok("enqueue", "t", "--task-id", f"a{i}")
        cli.ok("task", "archive", f"a{i}")
    assert cli.ok("queue", "run-all", "default", "--state", "archived", "--json").json()["run"] == 3
    deleted = cli.ok(
        "queue", "delete-all", "default", "--state", "pending", "--yes", "--json"
    ).json()
    assert deleted["deleted"] == 3


def test_migrate_and_workers(cli: Cli) -> None:
    migrated = cli.ok("migrate", "--json").json()
    assert migrated["broker"] == "sqlite"
    assert isinstance(migrated["applied"], list)
    again = cli.ok("migrate", "--json").json()
    assert again["applied"] == []
    assert "up to date" in cli.ok("migrate").out
    assert cli.ok("workers", "--json").json() == []
    assert "no live workers" in cli.ok("workers").out


def test_help_has_examples(cli: Cli) -> None:
    top = cli.ok("--help").out
    for command in ("worker", "enqueue", "task", "queue", "workers", "migrate", "demo"):
        assert command in top
    assert "Examples" in cli.ok("enqueue", "--help").out
    assert "Examples" in cli.ok("task", "--help").out
    # A bare group shows its help.
    assert "ls" in cli.ok("task").out


def test_worker_app_errors_are_one_line(cli: Cli) -> None:
    assert_one_line_error(cli("worker", "no_such_module:app"), 2, "no_such_module")
    assert_one_line_error(cli("worker", "examples.quickstart", cwd=REPO), 2, "module:attribute")
    assert_one_line_error(cli("worker", "examples.quickstart:missing", cwd=REPO), 2, "no attribute")
    assert_one_line_error(
        cli("worker", "examples.quickstart:send_email", cwd=REPO), 2, "not a durq.App"
    )
    broken = cli.tmp_path / "broken_app.py"
    broken.write_text("raise RuntimeError('boom at import')\n")
    assert_one_line_error(cli("worker", "broken_app:app"), 2, "boom at import")
    assert_one_line_error(
        cli("worker", "examples.quickstart:app", "--log-format", "xml", cwd=REPO), 2, "text or json"
    )


def _claim_one(cli: Cli) -> durq.brokers.base.Lease:
    """Take the only pending task of the default queue, as a worker would."""
    app = durq.App(cli.url)

    async def claim() -> durq.brokers.base.Lease:
        broker = await app.broker()
        (lease,) = await broker.claim(ClaimParams(["default"], 1, "w-test", 60))
        return lease

    try:
        return app.run_sync(claim)
    finally:
        app.close_sync()


def test_attempts_never_read_more_than_allowed(cli: Cli) -> None:
    cli.ok("enqueue", "t", "--task-id", "flaky", "--max-retry", "2")
    app = durq.App(cli.url)

    async def fail_every_attempt() -> None:
        broker = await app.broker()
        for _ in range(2):
            (lease,) = await broker.claim(ClaimParams(["default"], 1, "w-test", 60))
            assert await broker.retry(RetryParams(lease.ref, "boom", 0.0))
        (lease,) = await broker.claim(ClaimParams(["default"], 1, "w-test", 60))
        tb = 'Traceback (most recent call last):\n  File "jobs.py", line 3\nValueError: boom\n'
        assert await broker.archive(ArchiveParams(lease.ref, "boom", traceback=tb))

    try:
        app.run_sync(fail_every_attempt)
    finally:
        app.close_sync()
    # Three attempts were made of the three allowed (the first and two retries).
    row = cli.ok("task", "ls", "--state", "archived").out
    assert "3/3" in row and "3/2" not in row
    shown = cli.ok("task", "get", "flaky").out
    assert "3/3" in shown and 'File "jobs.py", line 3' in shown
    assert cli.ok("task", "get", "flaky", "--json").json()["traceback"].endswith("boom\n")


def test_a_completed_task_counts_its_successful_attempt(cli: Cli) -> None:
    cli.ok("enqueue", "t", "--task-id", "done", "--max-retry", "5", "--retention", "1h")
    lease = _claim_one(cli)
    app = durq.App(cli.url)

    async def complete() -> None:
        broker = await app.broker()
        assert await broker.complete(CompleteParams(lease.ref, b"1", retention=3600))

    try:
        app.run_sync(complete)
    finally:
        app.close_sync()
    shown = cli.ok("task", "get", "done").out
    assert "1/6" in shown and "0/6" not in shown
    assert "1/6" in cli.ok("task", "ls", "--state", "completed").out


def test_cancel_of_an_active_task_says_it_is_a_request(cli: Cli) -> None:
    cli.ok("enqueue", "t", "--task-id", "busy")
    _claim_one(cli)
    out = cli.ok("task", "cancel", "busy").out
    assert "cancel requested" in out and "cancelled:" not in out
    data = cli.ok("task", "get", "busy", "--json").json()
    assert data["state"] == "active" and data["cancel_requested"] is True


def test_worker_refuses_a_schedule_without_a_handler(cli: Cli) -> None:
    (cli.tmp_path / "cron_app.py").write_text(
        "import durq\n"
        "app = durq.App()\n"
        "@app.task('reports:send')\n"
        "async def send(payload: dict) -> None: ...\n"
        "app.add_periodic('@every 60s', 'reports:refresh')\n"
    )
    result = cli("worker", "cron_app:app")
    assert_one_line_error(result, 2, "'reports:refresh'")
    assert "no handler" in result.err


def test_group_get_shows_progress_and_task_get_names_the_group(cli: Cli) -> None:
    cli.ok("migrate")
    app = durq.App(cli.url)
    try:
        group = app.enqueue_group_sync(
            [durq.EnqueueRequest("part", {"i": i}) for i in range(3)], then="merge"
        )
        app.run_sync(lambda: app.inspector.delete_task("default", group.tasks[1].id))
    finally:
        app.close_sync()
    shown = cli.ok("group", "get", group.id).out
    assert f"group {group.id} (queue default): 1/3 finished" in shown
    assert "1 deleted, 2 pending" in shown and f"group:{group.id}" in shown
    data = cli.ok("group", "get", group.id, "--json").json()
    assert data["total"] == 3 and data["finished"] == 1
    assert data["by_state"] == {"pending": 2, "deleted": 1}
    assert [m["id"] for m in data["members"]] == [t.id for t in group.tasks]
    assert f"{group.id} (queue default)" in cli.ok("task", "get", group.tasks[0].id).out
    missing = cli("group", "get", "nope")
    assert missing.code == 1 and missing.err_lines == ["error: no group 'nope' in queue 'default'"]
    assert cli("group", "get", "bad:id").code == 2


def test_limit_ls_shows_running_waiting_and_tokens(cli: Cli) -> None:
    assert "no limits counted yet" in cli.ok("limit", "ls").out
    app = durq.App(cli.url)

    async def fill() -> None:
        limit = [durq.Limit("partner:{p}", concurrency=1), durq.Limit("api", rate="5/m")]
        for _ in range(3):
            await app.enqueue("partner:call", {"p": "acme"}, limit=limit)
        broker = await app.broker()
        await broker.claim(ClaimParams(["default"], 10, "w1", 30.0))

    try:
        app.run_sync(fill)
    finally:
        app.close_sync()
    rows = {r["key"]: r for r in cli.ok("limit", "ls", "--json").json()}
    assert rows["partner:acme"]["running"] == 1
    assert rows["partner:acme"]["concurrency"] == 1
    assert rows["partner:acme"]["waiting"] == 2
    assert (rows["api"]["rate"], rows["api"]["per"]) == (5, 60.0)
    assert 3.9 < rows["api"]["tokens"] < 5  # one taken, refilling at 1 per 12 s
    table = cli.ok("limit", "ls", "--queue", "default").out
    assert "partner:acme" in table and "1/1" in table and "5/m" in table  # as written in the Limit
    assert_one_line_error(cli("limit", "ls", "--queue", "bad queue"), 2, "queue")


def test_W23_limit_set_and_reset_an_override(cli: Cli) -> None:
    app = durq.App(cli.url)

    def claim() -> list[str]:
        async def body() -> list[str]:
            broker = await app.broker()
            leases = await broker.claim(ClaimParams(["default"], 10, "w1", 30.0))
            return [x.task.id for x in leases]

        try:
            return app.run_sync(body)
        finally:
            app.close_sync()

    async def fill() -> list[str]:
        limit = durq.Limit("partner:{p}", concurrency=1)
        return [(await app.enqueue("partner:call", {"p": "acme"}, limit=limit)).id for _ in "abc"]

    try:
        ids = app.run_sync(fill)
    finally:
        app.close_sync()
    assert claim() == ids[:1]
    done = cli.ok("limit", "set", "partner:acme", "--concurrency", "2")
    assert "limit partner:acme in queue default overridden: 2" in done.out
    assert claim() == ids[1:2]  # no restart: the next claim applies it
    (row,) = cli.ok("limit", "ls", "--json").json()
    assert (row["concurrency"], row["override"]) == (
        1,
        {"concurrency": 2, "rate": None, "per": None},
    )
    table = cli.ok("limit", "ls").out
    assert "2/2" in table and "set (tasks': 1)" in table
    got = cli.ok("limit", "set", "api", "--rate", "10/s", "--queue", "default", "--json").json()
    assert (got["key"], got["running"], got["override"]["rate"]) == ("api", 0, 10)
    assert "overridden: 0, 5/m" in cli.ok("limit", "set", "api", "-c", "0", "-r", "5/m").out
    assert "reset" in cli.ok("limit", "reset", "partner:acme").out
    assert claim() == []  # back to the tasks' own 1, with 2 running
    assert_one_line_error(cli("limit", "reset", "partner:acme"), 1, "no override", "partner:acme")
    assert_one_line_error(cli("limit", "set", "k", "--queue", "nowhere", "-c", "1"), 1, "queue")
    assert_one_line_error(cli("limit", "set", "k"), 2, "--concurrency")
    assert_one_line_error(cli("limit", "set", "k", "-c", "-1"), 2, "concurrency")
    assert_one_line_error(cli("limit", "set", "k", "--rate", "fast"), 2, "rate")
    assert_one_line_error(cli("limit", "set", "k" * 201, "-c", "1"), 2, "limit key")


def test_W14_task_get_shows_progress_and_log_lines(cli: Cli) -> None:
    from durq.brokers.base import ProgressParams
    from durq.progress import encode_line, encode_progress

    cli.ok("enqueue", "t", "--task-id", "busy-rows")
    lease = _claim_one(cli)
    app = durq.App(cli.url)

    async def report() -> None:
        broker = await app.broker()
        assert await broker.report_progress(
            ProgressParams(
                lease.ref,
                progress=encode_progress(1, 0.4, "rows 400/1000", 1_700_000_000.0),
                lines=(
                    encode_line(1, 1_700_000_000.0, "info", "started"),
                    encode_line(1, 1_700_000_001.0, "warning", "slow row 17"),
                ),
            )
        )

    try:
        app.run_sync(report)
    finally:
        app.close_sync()
    shown = cli.ok("task", "get", "busy-rows").out
    assert "40% rows 400/1000 (attempt 1)" in shown
    assert "attempt 1 22:13:20 info started" in shown
    assert "warning slow row 17" in shown
    data = cli.ok("task", "get", "busy-rows", "--json").json()
    assert data["progress"]["fraction"] == 0.4 and data["progress"]["attempt"] == 1
    assert [line["message"] for line in data["logs"]] == ["started", "slow row 17"]


def test_task_get_shows_the_recorded_steps(cli: Cli) -> None:
    from durq.brokers.base import StepsParams
    from durq.steps import encode

    cli.ok("enqueue", "t", "--task-id", "stepped")
    lease = _claim_one(cli)
    app = durq.App(cli.url)
    entry = {"result": [1, 2], "started": 1_700_000_000.0, "ended": 1_700_000_000.5}

    async def record() -> None:
        broker = await app.broker()
        steps = encode({"charge": {**entry, "attempt": 1}, "mail": {**entry, "attempt": 2}})
        assert await broker.record_steps(StepsParams(lease.ref, steps))

    try:
        app.run_sync(record)
    finally:
        app.close_sync()
    shown = cli.ok("task", "get", "stepped").out
    assert "charge 0.500s (attempt 1)" in shown and "mail 0.500s (attempt 2)" in shown
    data = cli.ok("task", "get", "stepped", "--json").json()
    assert [(s["name"], s["result"], s["attempt"]) for s in data["steps"]] == [
        ("charge", [1, 2], 1),
        ("mail", [1, 2], 2),
    ]


def test_W19_task_signal(cli: Cli) -> None:
    cli.ok("enqueue", "t", "--task-id", "waits", "--process-in", "1h")
    done = cli.ok("task", "signal", "waits", "partner-callback", "--data", '{"policy": "P-1"}')
    assert "delivered" in done.out
    again = cli.ok("task", "signal", "waits", "partner-callback", "--json").json()
    assert again == {
        "queue": "default",
        "id": "waits",
        "name": "partner-callback",
        "delivered": False,
    }
    assert_one_line_error(cli("task", "signal", "waits", "bad name"), 2, "signal name")
    assert_one_line_error(cli("task", "signal", "waits", "x", "--data", "{bad"), 2, "--data")
    assert_one_line_error(cli("task", "signal", "nope", "x"), 1, "not found")
