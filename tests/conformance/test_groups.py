"""Groups on every broker: members created all or none, the fan-in follow-up created exactly
once with every member's outcome, under concurrent completions and a worker killed during the
last member's completion."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import durq
from conformance.apps import FAST, exists, marker_lines, wait_for_state, worker_process
from durq import groups, lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import CAP_CROSS_QUEUE_GROUPS, ClaimParams
from durq.clock import FakeClock
from durq.errors import GroupNotFoundError, ValidationError
from durq.states import TaskState

R = durq.EnqueueRequest


async def waiting(app: durq.App, queue: str, task_id: str) -> bool:
    """Whether the follow-up ``task_id`` exists, still waiting for its group."""
    info = await app.inspector.get_task_info(queue, task_id)
    return info.state is TaskState.WAITING


async def test_members_are_created_all_or_none(app: durq.App) -> None:
    await app.enqueue("job:run", {"n": 0}, task_id="taken")
    await app.enqueue("job:run", {"u": 1}, unique=3600)
    before = {q.name: q.size for q in await app.inspector.list_queues()}
    with pytest.raises(durq.TaskIDConflictError) as conflict:
        await app.enqueue_group([R("job:run", {"n": 1}), R("job:run", {"n": 2}, task_id="taken")])
    assert conflict.value.existing is not None and conflict.value.existing.id == "taken"
    with pytest.raises(durq.DuplicateTaskError):
        await app.enqueue_group([R("job:run", {"n": 3}), R("job:run", {"u": 1}, unique=3600)])
    with pytest.raises(ValidationError):  # the same task twice
        await app.enqueue_group([R("job:run", {}, task_id="x"), R("job:run", {}, task_id="x")])
    with pytest.raises(ValidationError):
        await app.enqueue_group([])
    after = {q.name: q.size for q in await app.inspector.list_queues()}
    assert after == before  # nothing of the refused groups was written

    group = await app.enqueue_group(
        [R("job:run", {"n": i}) for i in range(3)], then=durq.Then("job:merge")
    )
    assert [t.state for t in group.tasks] == [TaskState.PENDING] * 3
    assert group.then_id == f"group:{group.id}"
    info = await app.inspector.get_group(group.queue, group.id)
    assert (info.total, info.finished, info.by_state) == (3, 0, {"pending": 3})
    assert [m.id for m in info.members] == [t.id for t in group.tasks]
    with pytest.raises(GroupNotFoundError):
        await app.inspector.get_group(group.queue, "nope")


async def test_two_members_with_one_unique_key_write_nothing(app: durq.App) -> None:
    """The second member is a duplicate of the first: the group is refused as a whole."""
    with pytest.raises(durq.DuplicateTaskError):
        await app.enqueue_group(
            [R("job:run", {"u": 2}, unique=3600), R("job:run", {"u": 2}, unique=3600)]
        )
    # Not even the first member was written.
    assert [q.size for q in await app.inspector.list_queues()] in ([], [0])


async def test_follow_up_once_with_every_members_outcome(app: durq.App) -> None:
    got: list[dict[str, Any]] = []
    done = asyncio.Event()

    @app.task("part:ok")  # retention 0: deleted on completion, its result lives in the group
    async def ok(payload: dict[str, Any]) -> dict[str, Any]:
        return {"double": payload["n"] * 2}

    @app.task("part:fail")
    async def fail(payload: dict[str, Any]) -> None:
        raise durq.SkipRetry("no luck")

    @app.task("part:merge", retention=60)
    async def merge(payload: dict[str, Any]) -> None:
        got.append(payload)
        done.set()

    group = await app.enqueue_group(
        [
            R("part:ok", {"n": 1}),
            R("part:fail", {}),
            R("part:ok", {"n": 2}, process_in=3600),  # cancelled before it runs
            R("part:ok", {"n": 3}, process_in=3600),  # deleted before it runs
            R("part:ok", {"n": 4}),
        ],
        then=durq.Then("part:merge"),
    )
    ids = [t.id for t in group.tasks]
    await app.inspector.cancel_task("default", ids[2])
    await app.inspector.delete_task("default", ids[3])
    progress = await app.inspector.get_group("default", group.id)
    assert progress.finished == 2 and progress.by_state["archived"] == 1
    assert await waiting(app, "default", f"group:{group.id}")
    async with app.worker(concurrency=4, **FAST):
        await asyncio.wait_for(done.wait(), 15)
        await asyncio.sleep(0.3)  # a second follow-up would run here
    (payload,) = got
    assert payload["group"] == {"id": group.id, "queue": "default", "size": 5}
    members = payload["members"]
    assert [m["id"] for m in members] == ids
    assert [m["state"] for m in members] == [
        "completed",
        "archived",
        "archived",
        "deleted",
        "completed",
    ]
    assert members[0]["result"] == {"double": 2} and members[4]["result"] == {"double": 8}
    assert members[1]["error"] == "SkipRetry: no luck" or "no luck" in members[1]["error"]
    assert members[2]["error"] == "cancelled"
    assert members[3] == {"id": ids[3], "queue": "default", "type": "part:ok", "state": "deleted"}
    info = await app.inspector.get_group("default", group.id)
    assert info.finished == info.total == 5 and info.finished_at is not None
    assert info.by_state == {"completed": 2, "archived": 2, "deleted": 1}
    follow = await app.inspector.get_task_info("default", f"group:{group.id}")
    assert groups.followed_by(follow) == (group.id, "default")
    # A finished member deleted or archived again later changes nothing.
    await app.inspector.delete_task("default", ids[1])
    assert (await app.inspector.get_group("default", group.id)).finished == 5


async def _claim_all(broker: FullBroker, queue: str, n: int) -> list[Any]:
    leases: list[Any] = []
    deadline = time.monotonic() + 10
    while len(leases) < n and time.monotonic() < deadline:
        leases += await broker.claim(ClaimParams([queue], n - len(leases), "w", 60))
    assert len(leases) == n
    return leases


async def test_concurrent_completions_create_the_follow_up_once(
    broker: FullBroker,
    make_broker: Callable[..., Awaitable[FullBroker]],
    app: durq.App,
) -> None:
    """Several brokers (workers) complete and archive the members of one group at once, many
    rounds: each group gets one follow-up, with every member."""
    workers = [broker, *[await make_broker() for _ in range(3)]]
    app = durq.App(broker)
    size = 8
    for round_ in range(6):
        group = await app.enqueue_group(
            [R("m:x", {"i": i}, queue="fan") for i in range(size)],
            then=durq.Then("m:merge", queue="fan"),
        )
        leases = await _claim_all(broker, "fan", size)
        now = broker.clock.now()

        async def finish(i: int, lease: Any) -> bool:
            w = workers[i % len(workers)]
            if i % 3 == 0:
                return await w.archive(lifecycle.gave_up(lease, "boom", now=now))
            result = json.dumps({"i": i}).encode()
            return await w.complete(lifecycle.completed(lease, result, now=now))

        assert all(await asyncio.gather(*(finish(i, lease) for i, lease in enumerate(leases))))
        info = await broker.admin.get_group(group.queue, group.id)
        assert info.finished == size, round_
        (follow,) = await _claim_all(broker, "fan", 1)
        assert follow.task.id == f"group:{group.id}"
        body = json.loads(follow.task.raw_payload)
        assert sorted(m["id"] for m in body["members"]) == sorted(t.id for t in group.tasks)
        states = [m["state"] for m in body["members"]]
        assert states.count("archived") == len(range(0, size, 3))
        assert await broker.claim(ClaimParams(["fan"], 10, "w", 60)) == []


async def test_batched_completions_and_rescued_members(
    broker: FullBroker, clock: FakeClock
) -> None:
    """complete_many with members of two groups, and a member archived by the rescuer
    (worker lost): both groups fan in once."""
    app = durq.App(broker)
    g1 = await app.enqueue_group([R("m:x", {"g": 1, "i": i}) for i in range(3)], then="m:done")
    g2 = await app.enqueue_group([R("m:x", {"g": 2, "i": i}) for i in range(2)], then="m:done")
    leases = await _claim_all(broker, "default", 5)
    now = broker.clock.now()
    last = next(lease for lease in leases if lease.task.id == g1.tasks[0].id)
    rest = [lease for lease in leases if lease is not last]
    done = await broker.complete_many([lifecycle.completed(x, b"1", now=now) for x in rest])
    assert all(done)
    assert await waiting(app, "default", f"group:{g1.id}")
    assert not await waiting(app, "default", f"group:{g2.id}")
    # The last member's worker dies: the rescuer archives it as lost, the group fans in.
    clock.advance(120)
    later = clock.now()
    moved = await broker.move_leases([lifecycle.lease_expired(last, now=later, max_lost=1)])
    assert moved == [True]
    follow = await app.inspector.get_task_info("default", f"group:{g1.id}")
    members = json.loads(follow.raw_payload)["members"]
    assert [m["state"] for m in members] == ["archived", "completed", "completed"]
    assert members[0]["error"] == "worker lost" and members[1]["result"] == 1


async def test_delete_all_releases_unfinished_members(app: durq.App) -> None:
    group = await app.enqueue_group(
        [R("m:x", {"i": i}, process_in=3600) for i in range(3)], then="m:done"
    )
    assert await app.inspector.delete_all("default", TaskState.SCHEDULED) == 3
    follow = await app.inspector.get_task_info("default", f"group:{group.id}")
    members = json.loads(follow.raw_payload)["members"]
    assert [m["state"] for m in members] == ["deleted"] * 3


def test_group_without_follow_up_and_sync_face(app: durq.App, broker_url: str) -> None:
    app = durq.App(broker_url)  # the fixture's storage is migrated; this one is sync
    try:
        group = app.enqueue_group_sync([R("m:x", {}), R("m:y", {})])
        assert group.then_id is None and len(group.tasks) == 2
        info = app.run_sync(lambda: app.inspector.get_group(group.queue, group.id))
        assert info.total == 2 and info.then_id is None
    finally:
        app.close_sync()


async def test_follow_up_exists_once_after_a_kill_during_the_last_completion(
    app: durq.App, broker_url: str, tmp_path: Path
) -> None:
    """SIGKILL the worker process the moment the last member's handler returned: whatever
    instant the kill lands in, the follow-up exists exactly when every member is recorded;
    after recovery it exists and runs once, with every member completed."""
    marker = tmp_path / "marker.txt"
    size = 3
    with worker_process(broker_url, marker, lease=1.5) as proc:
        group = await app.enqueue_group(
            [R("test:returns", {"n": i}, queue="kill", retention=60) for i in range(size)],
            then=durq.Then("test:merge", queue="kill", retention=60),
        )
        deadline = time.monotonic() + 20
        while sum(line[0] == "return" for line in marker_lines(marker)) < size:
            assert time.monotonic() < deadline, "the worker never ran every member"
            await asyncio.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait(20)
    progress = await app.inspector.get_group("kill", group.id)
    released = not await waiting(app, "kill", f"group:{group.id}")
    assert released == (progress.finished == size), progress

    runs: list[dict[str, Any]] = []

    @app.task("test:returns", queue="kill", retention=60)
    def returns(payload: dict[str, Any]) -> dict[str, Any]:
        return {"n": payload["n"]}

    @app.task("test:merge", queue="kill", retention=60)
    def merge(payload: dict[str, Any]) -> None:
        runs.append(payload)

    async with app.worker(queues=["kill"], lease_seconds=2, **FAST):
        await wait_for_state(app, "kill", f"group:{group.id}", TaskState.COMPLETED, timeout=30)
        await asyncio.sleep(0.3)
    assert len(runs) == 1
    assert [m["result"] for m in runs[0]["members"]] == [{"n": i} for i in range(size)]
    assert (await app.inspector.get_group("kill", group.id)).finished == size


async def test_finished_group_is_kept_for_its_retention(
    broker: FullBroker, clock: FakeClock
) -> None:
    app = durq.App(broker)
    group = await app.enqueue_group([R("m:x", {})], then="m:done", retention=600)
    (lease,) = await _claim_all(broker, "default", 1)
    assert await broker.complete(lifecycle.completed(lease, None, now=clock.now()))
    clock.advance(599)
    await broker.delete_expired(100)
    assert (await broker.admin.get_group("default", group.id)).finished == 1
    clock.advance(2)
    await broker.delete_expired(100)
    with pytest.raises(GroupNotFoundError):
        await broker.admin.get_group("default", group.id)
    assert await exists(app, "default", f"group:{group.id}")  # the follow-up stays


async def test_members_in_several_queues(broker: FullBroker, clock: FakeClock) -> None:
    """Members in two queues and the follow-up in a third fan in like one queue does where
    the broker writes across queues atomically; a Redis Cluster refuses queues of several
    hash slots at enqueue, writing nothing."""
    app = durq.App(broker)
    requests = [R("m:x", {"i": 0}, queue="qa"), R("m:x", {"i": 1}, queue="qb")]
    then = durq.Then("m:done", queue="qc")
    if CAP_CROSS_QUEUE_GROUPS not in broker.capabilities:
        with pytest.raises(ValidationError):
            await app.enqueue_group(requests, then=then)
        assert not [q for q in await broker.admin.list_queues() if q.size]
        return
    group = await app.enqueue_group(requests, then=then)
    assert group.queue == "qa"
    leases = [*await _claim_all(broker, "qa", 1), *await _claim_all(broker, "qb", 1)]
    for lease in leases:
        assert await broker.complete(lifecycle.completed(lease, b"7", now=clock.now()))
    (follow,) = await _claim_all(broker, "qc", 1)
    members = json.loads(follow.task.raw_payload)["members"]
    assert [(m["queue"], m["result"]) for m in members] == [("qa", 7), ("qb", 7)]
    assert (await broker.admin.get_group("qa", group.id)).finished == 2


async def test_a_group_of_the_maximum_size_fans_in_once(broker: FullBroker) -> None:
    """A group of ``groups.MAX_MEMBERS`` members is created whole; its members finish through
    batched completions (a worker's acks) and the inspector's bulk delete (the last one);
    the follow-up is created once, with every member, and no member is left behind."""
    app = durq.App(broker)
    size = groups.MAX_MEMBERS
    group = await app.enqueue_group(
        [R("m:x", {"i": i}, task_id=f"m{i}") for i in range(size - 1)]
        + [R("m:x", {"i": size - 1}, task_id=f"m{size - 1}", process_in=3600)],
        then="m:merge",
    )
    assert len(group.tasks) == size
    info = await broker.admin.get_group(group.queue, group.id)
    assert (info.total, info.finished, info.by_state) == (
        size,
        0,
        {"pending": size - 1, "scheduled": 1},
    )
    now = broker.clock.now()
    done = 0
    while done < size - 1:
        leases = await broker.claim(ClaimParams(["default"], 1000, "w", 600))
        assert leases, done
        finished = [lifecycle.completed(x, b"1", now=now) for x in leases]
        assert all(await broker.complete_many(finished))
        done += len(leases)
    assert done == size - 1
    assert await waiting(app, "default", f"group:{group.id}")
    # The last member, deleted by the inspector, releases the group.
    assert await broker.admin.move_all("default", TaskState.SCHEDULED, None) == 1
    (follow,) = await broker.claim(ClaimParams(["default"], 10, "w", 60))
    assert follow.task.id == f"group:{group.id}"
    body = json.loads(follow.task.raw_payload)
    assert body["group"] == {"id": group.id, "queue": "default", "size": size}
    assert [m["id"] for m in body["members"]] == [f"m{i}" for i in range(size)]
    assert [m["state"] for m in body["members"]] == ["completed"] * (size - 1) + ["deleted"]
    info = await broker.admin.get_group(group.queue, group.id)
    assert (info.finished, info.by_state) == (size, {"completed": size - 1, "deleted": 1})
    # The members completed and the follow-up: no member orphaned, no second follow-up.
    stats = await broker.admin.queue_stats("default")
    sizes = {s: n for s, n in stats.sizes.items() if n}
    assert sizes == {TaskState.COMPLETED: size - 1, TaskState.ACTIVE: 1}
    assert await broker.claim(ClaimParams(["default"], 10, "w", 60)) == []


async def test_a_group_over_the_maximum_or_refused_at_its_last_member_writes_nothing(
    broker: FullBroker,
) -> None:
    """One member more than the maximum is refused before the broker is asked; a group of
    the maximum whose last member's id is taken leaves nothing of itself."""
    app = durq.App(broker)
    size = groups.MAX_MEMBERS
    await app.enqueue("m:x", {}, task_id="taken")
    before = {q.name: q.sizes for q in await broker.admin.list_queues()}
    with pytest.raises(ValidationError, match=f"at most {size} members"):
        await app.enqueue_group([R("m:x", {"i": i}) for i in range(size + 1)], then="m:merge")
    assert {q.name: q.sizes for q in await broker.admin.list_queues()} == before
    members = [app.params(R("m:x", {"i": i})) for i in range(size - 1)]
    members.append(app.params(R("m:x", {}, task_id="taken")))
    params = groups.build("refused", members, "m:merge", app, retention=60, max_payload=1 << 20)
    with pytest.raises(durq.TaskIDConflictError):
        await broker.enqueue_group(params)
    with pytest.raises(GroupNotFoundError):
        await broker.admin.get_group("default", "refused")
    assert {q.name: q.sizes for q in await broker.admin.list_queues()} == before


async def test_wait_for_the_follow_up_while_the_group_runs(app: durq.App) -> None:
    """The follow-up exists from enqueue_group on, waiting for its group: app.wait on its
    id waits for the members and then for the follow-up itself."""

    @app.task("w:part")
    async def part(payload: dict[str, Any]) -> int:
        return int(payload["n"])

    @app.task("w:sum", retention=60)
    async def total(payload: dict[str, Any]) -> int:
        return sum(m["result"] for m in payload["members"])

    group = await app.enqueue_group(
        [R("w:part", {"n": n}) for n in range(4)], then=durq.Then("w:sum")
    )
    assert group.then_id is not None
    follow = await app.inspector.get_task_info("default", group.then_id)
    assert follow.state is TaskState.WAITING
    assert json.loads(follow.raw_payload)["members"] == []
    async with app.worker(concurrency=4, **FAST):
        assert await app.wait(group.then_id, timeout=30) == 6


async def test_a_taken_follow_up_id_refuses_the_group(broker: FullBroker) -> None:
    """The follow-up's id is checked with the members: taken, nothing of the group is made."""
    app = durq.App(broker)
    await app.enqueue("m:x", {}, task_id="group:g1")
    before = {q.name: q.size for q in await broker.admin.list_queues()}
    params = groups.build(
        "g1",
        [app.params(R("m:x", {"i": i})) for i in range(2)],
        "m:done",
        app,
        retention=60,
        max_payload=app.max_payload,
    )
    with pytest.raises(durq.TaskIDConflictError) as conflict:
        await broker.enqueue_group(params)
    assert conflict.value.existing is not None and conflict.value.existing.id == "group:g1"
    assert {q.name: q.size for q in await broker.admin.list_queues()} == before
    with pytest.raises(GroupNotFoundError):
        await broker.admin.get_group("default", "g1")


async def test_a_cancelled_follow_up_never_runs(broker: FullBroker, clock: FakeClock) -> None:
    app = durq.App(broker)
    group = await app.enqueue_group([R("m:x", {"i": i}) for i in range(2)], then="m:done")
    assert group.then_id is not None
    await app.inspector.cancel_task("default", group.then_id)
    leases = await _claim_all(broker, "default", 2)
    for lease in leases:
        assert await broker.complete(lifecycle.completed(lease, b"1", now=clock.now()))
    assert (await broker.admin.get_group("default", group.id)).finished == 2
    follow = await app.inspector.get_task_info("default", group.then_id)
    assert follow.state is TaskState.ARCHIVED
    assert not await broker.claim(ClaimParams(["default"], 10, "w", 60))
