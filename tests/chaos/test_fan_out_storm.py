"""Fan-out decided at run time under a kill storm: tasks that each start a child workflow
(``ctx.run_workflow``: ten row nodes and their sum) and wait for it, run by real worker
processes SIGKILLed at random. Every task must end with the sum of its own child, each
child must be created once (its nodes exist once: a second creation would add tasks), and
the durq node that wakes the waiting task must have woken it.

Short form in ``make test`` (SQLite); every broker in ``make chaos``."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

import durq
from chaos.harness import QUEUE, Cluster, enqueue_work, final_states, storm
from chaos.test_durable_storm import StepLedger
from chaos.test_storm import migrate
from durq.child_workflows import child_id

ROWS = 10  # chaos_worker.FAN_OUT_ROWS
#: Each task's own tasks: itself, its rows, their sum and the node that wakes it.
PER_TASK = 1 + ROWS + 1 + 1


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def fan_out_storm(
    url: str,
    clusters: Callable[..., Cluster],
    *,
    tasks: int,
    kill_every: float,
    timeout: float,
    ms: int = 20,
) -> dict[str, object]:
    await migrate(url)
    ids = await enqueue_work(url, tasks, ms=ms, prefix="f", type="chaos:fanout")
    # What is checked is the wait and the child's creation, not the guard that archives a
    # task whose workers died holding it three times (a loaded machine makes that likely).
    cluster = clusters(
        url, 3, "--lease", "4", "--concurrency", "16", "--rescue", "1", "--max-lost", "25"
    )
    cluster.start_all()
    await cluster.wait_ready()
    took, _ = await storm(cluster, url, tasks * PER_TASK, kill_every=kill_every, timeout=timeout)
    cluster.stop()
    ledger = StepLedger.read(cluster.dir)
    states = await final_states(url)
    figures: dict[str, object] = {
        "broker": url.split(":", 1)[0],
        "tasks": tasks,
        "seconds": round(took, 1),
        "kills": cluster.kills,
        "handler_runs": sum(len(r) for r in ledger.done.values()),
        "final": states,
    }
    print(f"\n[fan-out storm] {json.dumps(figures)}")
    # Exactly each task's own tasks, all completed: no child workflow created twice.
    assert states == {"completed": tasks * PER_TASK}, states
    assert set(ids) <= ledger.finished
    # Each task ran at least twice (it ends its attempt to wait for its child).
    assert all(len(ledger.done[(t, 0)]) >= 2 for t in ids)
    app = durq.App(url)
    try:
        for task_id in ids:
            assert await app.wait(task_id, queue=QUEUE, timeout=10) == {"sum": sum(range(ROWS))}
            wid = child_id(QUEUE, task_id, "workflow:rows")
            done = await app.inspector.get_task_info(QUEUE, f"wf:{wid}:durq-done")
            assert done.state is durq.TaskState.COMPLETED
    finally:
        await app.close()
    assert cluster.kills >= 1
    return figures


@pytest.mark.timeout(300)
async def test_fan_out_storm_short(broker_url: str, clusters) -> None:
    if not broker_url.startswith("sqlite"):
        pytest.skip("the short form runs on the embedded default; make chaos runs every broker")
    await fan_out_storm(broker_url, clusters, tasks=150, kill_every=0.5, timeout=240, ms=60)


@pytest.mark.chaos
@pytest.mark.timeout(900)
async def test_fan_out_storm_full(broker_url: str, clusters) -> None:
    await fan_out_storm(broker_url, clusters, tasks=300, kill_every=2.0, timeout=840)
