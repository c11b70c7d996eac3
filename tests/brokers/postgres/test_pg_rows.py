"""The hot paths build TaskInfo without reading it back: what they build must equal the row."""

from __future__ import annotations

import json
import re
from typing import Any

from durq.brokers.base import ClaimParams, EnqueueParams
from durq.brokers.postgres import PostgresBroker
from durq.brokers.postgres.rows import CLAIM_COLUMNS, EnqueuePlan, Row, enqueue_plan
from durq.brokers.postgres.storage import QUERIES, raw_statement, render_raw
from durq.clock import FakeClock
from durq.states import TaskState


def task(task_id: str, **options: object) -> EnqueueParams:
    return EnqueueParams(
        id=task_id,
        queue="default",
        type="rows:check",
        payload=json.dumps({"id": task_id}).encode(),
        **options,  # type: ignore[arg-type]
    )


def test_claim_returns_the_columns_claimed_info_reads() -> None:
    text = QUERIES["claimed_columns"]
    columns = [re.sub(r"::\w+$", "", c.strip()).removeprefix("t.") for c in text.split(",")]
    assert tuple(columns) == CLAIM_COLUMNS
    for name in ("claim_lease", "lease_rows", "complete_claim"):
        assert "RETURNING" in QUERIES[name] and "{claimed_columns}" in QUERIES[name]
    # complete_claim's dependents leased in the statement: the same columns, named again.
    listed = re.search(r"SELECT (r\.id,.*?)\s+FROM", QUERIES["complete_claim"], re.S)
    assert listed is not None
    names = tuple(c.strip().removeprefix("r.") for c in listed.group(1).split(","))
    assert names == CLAIM_COLUMNS


async def test_enqueue_answers_what_the_row_holds(pg: PostgresBroker, clock: FakeClock) -> None:
    now = clock.now()
    one = await pg.enqueue(
        task("one", timeout=30.0, deadline=now + 600, retention=60.0, headers={"tp": "x"})
    )
    later = await pg.enqueue(task("later", process_at=now + 50, max_retry=2))
    many = await pg.enqueue_many(
        [task("m1"), task("m2", unique_key="k", unique_ttl=30.0), task("m1")]
    )
    assert [o.created for o in many] == [True, True, False]
    for info in [one, later, many[0].info, many[1].info]:
        assert info is not None
        assert info == await pg.admin.get_task("default", info.id)
    assert later.state is TaskState.SCHEDULED


async def test_claim_answers_what_the_row_holds(pg: PostgresBroker) -> None:
    await pg.enqueue_many([task(f"c{i}", headers={"n": str(i)} if i % 2 else {}) for i in range(5)])
    leases = await pg.claim(ClaimParams(["default"], 10, "w1", 30.0))
    assert [lease.task.id for lease in leases] == [f"c{i}" for i in range(5)]
    for lease in leases:
        assert lease.task == await pg.admin.get_task("default", lease.task.id)
        assert lease.task.state is TaskState.ACTIVE and lease.task.worker_id == "w1"


def run_plan(plan: EnqueuePlan, answers: list[list[Row] | None]) -> tuple[list[str], Any]:
    """Drive an enqueue plan with canned answers: the statements it asked for, its result."""
    names = []
    try:
        name, _ = next(plan)
        for answer in answers:
            names.append(name)
            name, _ = plan.send(answer)
    except StopIteration as stop:
        return names, stop.value
    raise AssertionError(f"the plan asked for more: {name}")


def test_a_batch_alone_without_unique_keys_is_one_plain_insert() -> None:
    """The common bulk enqueue: one statement, without ON CONFLICT's look-ups (enqueue_fresh),
    every task created on the clock it read."""
    items = [task("a"), task("b", process_at=200.0)]
    names, outcomes = run_plan(enqueue_plan(items, 100.0, None, alone=True), [[{"now": 101.0}]])
    assert names == ["enqueue_fresh"]
    assert [o.info.state for o in outcomes] == [TaskState.PENDING, TaskState.SCHEDULED]
    assert outcomes[0].info.enqueued_at == outcomes[0].info.next_process_at
    assert outcomes[0].info.enqueued_at.timestamp() == 101.0


def test_a_refused_plain_insert_goes_again_with_on_conflict() -> None:
    """A unique violation refused the whole plain insert: the same batch goes as ``enqueue``,
    whose answer names the rows it inserted; the refused one is looked up."""
    items = [task("a"), task("b")]
    answers: list[list[Row] | None] = [
        None,
        [{"n": 1, "now": 101.0, "queues": ["default"], "ids": ["a"]}],
        [],  # enqueue_conflicts: the holder of "b" is gone already
        [{"n": 1, "now": 102.0}],  # enqueue_one: "b" again
    ]
    names, outcomes = run_plan(enqueue_plan(items, 100.0, None, alone=True), answers)
    assert names == ["enqueue_fresh", "enqueue", "enqueue_conflicts", "enqueue_one"]
    assert all(o.created for o in outcomes)


def test_unique_keys_a_caller_transaction_or_one_task_keep_on_conflict() -> None:
    """A plain insert is tried only where a refusal is rare and costs nothing but itself: not
    with unique keys (refusals are their point), not in a caller's transaction (a failed
    statement would abort it), not for one task (its own statement)."""
    keyed = [task("a"), task("b", unique_key="k", unique_ttl=60.0)]
    two = [task("a"), task("b")]
    assert next(enqueue_plan(keyed, 100.0, None, alone=True))[0] == "enqueue"
    assert next(enqueue_plan(two, 100.0, "ch"))[0] == "enqueue"
    assert next(enqueue_plan(two, 100.0, None))[0] == "enqueue"
    assert next(enqueue_plan([task("a")], 100.0, None, alone=True))[0] == "enqueue_one"


def test_the_worker_claims_run_as_raw_statements_numbered_once() -> None:
    """The claims past psycopg's query cache run with ``$n`` parameters, numbered once: each
    name one number, in order of first use, and nothing of psycopg's syntax left."""
    statement = raw_statement(b"SELECT %(a)s, %(b)b::text[], %(a)s")
    assert statement.text == b"SELECT $1, $2::text[], $1"
    assert statement.params({"b": ["x"], "a": 1, "unused": 0}) == [1, ["x"]]
    for name, raw in render_raw("durq").items():
        assert b"%(" not in raw.text, name
        numbers = {int(n) for n in re.findall(rb"\$(\d+)", raw.text)}
        assert numbers == set(range(1, len(raw.names) + 1)), name
        assert b"$" not in QUERIES[name].encode(), name  # no other $ to be confused with
