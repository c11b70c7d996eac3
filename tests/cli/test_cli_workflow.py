"""``durq workflow get|ls|cancel`` through the real CLI (a subprocess) on SQLite."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.cli.clikit import Cli

import durq


async def _run_one(url: str) -> str:
    """A diamond run to its end by a worker; its id."""
    app = durq.App(url)

    @app.task("etl:step")
    async def step(payload: dict[str, Any], ctx: durq.TaskContext) -> int:
        return 1 + sum(ctx.dependencies.values())

    wf = durq.Workflow("nightly-etl", id="done-1")
    a = wf.add("etl:step", {}, name="extract")
    b = wf.add("etl:step", {}, name="transform", after=[a])
    wf.add("etl:step", {}, name="load", after=[a, b])
    try:
        info = await app.enqueue_workflow(wf)
        async with app.worker(concurrency=2, poll_interval=0.2):
            assert await app.wait(info, timeout=60) == {"load": 4}
    finally:
        await app.close()
    return info.id


def test_workflow_get_ls_and_cancel(cli: Cli) -> None:
    cli.ok("migrate")
    done = asyncio.run(_run_one(cli.url))
    app = durq.App(cli.url)
    try:
        wf = durq.Workflow("import", id="open-1")
        first = wf.add("imp:read", {}, name="read")
        wf.add("imp:write", {}, name="write", after=[first])
        app.enqueue_workflow_sync(wf)
    finally:
        app.close_sync()

    shown = cli.ok("workflow", "get", done).out
    assert "workflow done-1 (nightly-etl): succeeded, 3/3 finished (3 completed)" in shown
    rows = {line.split()[0]: line.split() for line in shown.splitlines()[3:]}
    assert rows["load"][:5] == ["load", "etl:step", "completed", "1", "extract,"]
    assert rows["extract"][4] == "-"
    data = cli.ok("workflow", "get", done, "--json").json()
    assert data["state"] == "succeeded"
    assert [(n["name"], n["after"]) for n in data["nodes"]] == [
        ("extract", []),
        ("transform", ["extract"]),
        ("load", ["extract", "transform"]),
    ]
    assert data["nodes"][0]["task_id"] == "wf:done-1:extract"
    node = cli.ok("task", "get", "wf:done-1:load").out
    rows = ([c.strip() for c in line.strip("│ ").split("│")] for line in node.splitlines())
    fields = {cells[0]: cells[1] for cells in rows if len(cells) == 2}
    assert fields["workflow"] == "done-1 (nightly-etl), node load"

    listed = cli.ok("workflow", "ls", "--json").json()
    assert [w["id"] for w in listed["workflows"]] == ["open-1", "done-1"]
    assert [w["state"] for w in listed["workflows"]] == ["running", "succeeded"]
    running = cli.ok("workflow", "ls", "--state", "running").out
    assert "open-1" in running and "done-1" not in running
    assert cli.ok("workflow", "ls", "--older-than", "1h", "--json").json()["workflows"] == []
    paged = cli.ok("workflow", "ls", "--limit", "1", "--json").json()
    assert [w["id"] for w in paged["workflows"]] == ["open-1"] and paged["cursor"]
    rest = cli.ok("workflow", "ls", "--limit", "1", "--cursor", paged["cursor"], "--json").json()
    assert [w["id"] for w in rest["workflows"]] == ["done-1"]

    assert cli.ok("workflow", "cancel", "open-1").out.strip() == (
        "workflow open-1: 2 node(s) cancelled"
    )
    after = cli.ok("workflow", "get", "open-1", "--json").json()
    assert after["state"] == "cancelled"
    assert {(n["state"], n["last_error"]) for n in after["nodes"]} == {("archived", "cancelled")}
    assert cli.ok("workflow", "cancel", "open-1", "--json").json() == {
        "id": "open-1",
        "cancelled": 0,
    }

    missing, bad_id, bad_state, bad_age, cancel_missing = cli.many(
        ("workflow", "get", "nope"),
        ("workflow", "get", "bad:id"),
        ("workflow", "ls", "--state", "done"),
        ("workflow", "ls", "--newer-than", "soon"),
        ("workflow", "cancel", "nope"),
    )
    assert (missing.code, missing.err_lines) == (1, ["error: no workflow 'nope'"])
    assert bad_id.code == 2 and bad_id.err_lines == [
        "error: invalid workflow id 'bad:id': use letters, digits and _ . - @ + ="
    ]
    assert bad_state.code == 2 and "unknown workflow state 'done'" in bad_state.err
    assert bad_age.code == 2 and "--newer-than must be a duration" in bad_age.err
    assert (cancel_missing.code, cancel_missing.err_lines) == (1, ["error: no workflow 'nope'"])
