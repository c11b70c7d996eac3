"""Durable tasks under a kill storm: tasks of five steps and two durable sleeps, run by real
worker processes SIGKILLed at random. Every task must finish, and no step may run again once
its record was stored; a step run twice is the documented at-least-once window (its worker
died after the step's side effect, before its record), which this test counts.

The workers write their own ledger (``steps-<pid>.log``): ``do`` when a step's side effect
runs, ``rec`` once ``ctx.step`` returned (the record is stored), ``fin`` when the handler
returns. Short form in ``make test``; the full 2,000-task form is ``make chaos``."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import durq
from chaos.harness import Cluster, enqueue_work, final_states, storm
from chaos.test_storm import migrate


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@dataclass
class StepLedger:
    """What the workers wrote: per (task, step) the times its side effect ran (with the pid)
    and the first time its record was seen stored; the tasks whose handler returned."""

    done: dict[tuple[str, int], list[tuple[float, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    recorded: dict[tuple[str, int], float] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, directory: Path) -> StepLedger:
        ledger = cls()
        for path in sorted(directory.glob("steps-*.log")):
            for line in path.read_text().splitlines():
                kind, task_id, step_s, pid_s, at_s = line.split()
                key, at = (task_id, int(step_s)), float(at_s)
                if kind == "do":
                    ledger.done[key].append((at, int(pid_s)))
                elif kind == "rec":
                    ledger.recorded[key] = min(at, ledger.recorded.get(key, at))
                elif kind == "fin":
                    ledger.finished.add(task_id)
        return ledger


async def durable_storm(
    url: str,
    clusters: Callable[..., Cluster],
    *,
    tasks: int,
    kill_every: float,
    timeout: float,
    ms: int = 20,
) -> dict[str, object]:
    await migrate(url)
    ids = await enqueue_work(url, tasks, ms=ms, type="chaos:durable")
    cluster = clusters(url, 3, "--lease", "4", "--concurrency", "16", "--rescue", "1")
    cluster.start_all()
    await cluster.wait_ready()
    took, _ = await storm(cluster, url, tasks, kill_every=kill_every, timeout=timeout)
    cluster.stop()
    ledger = StepLedger.read(cluster.dir)
    states = await final_states(url)

    after_record: list[tuple[str, int]] = []
    window: list[tuple[str, int]] = []
    unexplained: list[tuple[str, int]] = []
    for key, runs in ledger.done.items():
        runs.sort()
        stored = ledger.recorded.get(key)
        for (_, pid), (again, _) in itertools.pairwise(runs):
            window.append(key)
            if stored is not None and again > stored:
                after_record.append(key)  # its record was stored before this run began
            died = cluster.deaths.get(pid)  # the run before: its worker must have been killed
            if died is None or died[0] != "killed":
                unexplained.append(key)
    steps_run = sum(len(r) for r in ledger.done.values())
    figures: dict[str, object] = {
        "broker": url.split(":", 1)[0],
        "tasks": tasks,
        "seconds": round(took, 1),
        "kills": cluster.kills,
        "steps_run": steps_run,
        "steps_run_twice": len(window),
        "after_record": len(after_record),
        "finished": len(ledger.finished),
        "final": states,
    }
    print(f"\n[durable storm] {json.dumps(figures)}")
    assert states.get("completed") == tasks, states
    assert set(ids) <= ledger.finished, "a task's handler never returned"
    assert not after_record, f"a step ran again after its record: {after_record[:5]}"
    assert not unexplained, f"a step ran twice without a killed worker: {unexplained[:5]}"
    assert all(len(ledger.done[(t, i)]) >= 1 for t in ids for i in range(5))
    assert cluster.kills >= 1
    await check_recorded(url, ids[:20])
    return figures


async def check_recorded(url: str, ids: list[str]) -> None:
    """The tasks show their five steps and two sleeps, each recorded once."""
    app = durq.App(url)
    try:
        for task_id in ids:
            info = await app.inspector.get_task_info("chaos", task_id)
            assert [s.name for s in info.steps] == ["s0", "s1", "z1", "s2", "s3", "z3", "s4"]
            assert info.retried == 0 or info.lost > 0  # attempts are spent only by kills
    finally:
        await app.close()


@pytest.mark.timeout(240)
async def test_durable_storm_short(broker_kind: str, broker_url: str, clusters) -> None:
    if broker_kind != "sqlite":
        pytest.skip("the short form runs on the embedded default; make chaos runs every broker")
    await durable_storm(broker_url, clusters, tasks=400, kill_every=0.5, timeout=180)


@pytest.mark.chaos
@pytest.mark.timeout(900)
async def test_durable_storm_full(broker_url: str, clusters) -> None:
    await durable_storm(broker_url, clusters, tasks=2000, kill_every=2.0, timeout=840)
