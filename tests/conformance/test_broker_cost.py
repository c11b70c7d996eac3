"""W24: a task may weigh more than one unit against a limit (its cost): it starts only when
its key has that many free slots and tokens, takes them all and gives them all back; a held
task of cost c is let back, and its workers told to look again, only once c are there."""

from __future__ import annotations

import pytest
from brokerkit import A, P, claim, claim_ids, params, snapshot
from test_broker_limits import _ends, enqueue, limits_of

from durq.brokers import FullBroker
from durq.brokers.base import Claimed, CompleteParams
from durq.clock import FakeClock
from durq.task import LimitSpec, limits_from_json, limits_to_json


def conc(key: str, n: int, cost: int = 1) -> LimitSpec:
    return LimitSpec(key, concurrency=n, cost=cost)


def rate(key: str, n: int, per: float, cost: int = 1) -> LimitSpec:
    return LimitSpec(key, rate=n, per=per, cost=cost)


async def test_W24_a_task_takes_its_cost_of_the_keys_slots(
    broker: FullBroker, clock: FakeClock
) -> None:
    await enqueue(broker, clock, "big", conc("k", 3, cost=2))
    await enqueue(broker, clock, "s1", conc("k", 3))
    await enqueue(broker, clock, "s2", conc("k", 3))
    leases = await claim(broker, limit=10)
    assert [x.task.id for x in leases] == ["big", "s1"]
    assert await limits_of(broker) == {"k": (3, 1)}
    assert await broker.complete(CompleteParams(leases[0].ref))  # big gives both back
    assert await claim_ids(broker, limit=10) == ["s2"]
    assert await limits_of(broker) == {"k": (2, 0)}
    stored = await broker.admin.get_task("default", "s2")
    assert stored.limits == (conc("k", 3),)


async def test_W24_a_held_task_comes_back_only_when_its_cost_is_free(
    broker: FullBroker, clock: FakeClock
) -> None:
    """Two tasks of cost 1 run; one of cost 3 is held. One slot freed is not enough: it
    stays held (not let back and held again); the second frees it."""
    await enqueue(broker, clock, "a", conc("k", 3))
    await enqueue(broker, clock, "b", conc("k", 3))
    await enqueue(broker, clock, "big", conc("k", 3, cost=3))
    a, b = await claim(broker, limit=10)
    assert await snapshot(broker) == {A: ["a", "b"], P: ["big"]}
    assert (await broker.admin.get_task("default", "big")).held_by == "k"
    assert await broker.complete(CompleteParams(a.ref))
    got = await claim(broker, limit=10)
    assert [x.task.id for x in got] == []
    if isinstance(got, Claimed):
        assert got.wake_at is None  # a running attempt must end first: no token to wait for
    assert (await broker.admin.get_task("default", "big")).held_by == "k"
    assert await broker.complete(CompleteParams(b.ref))
    assert await claim_ids(broker, limit=10) == ["big"]
    assert await limits_of(broker) == {"k": (3, 0)}


async def test_W24_cost_against_a_rate_waits_for_that_many_tokens(
    broker: FullBroker, clock: FakeClock
) -> None:
    """4 per 10 s, cost 2: two start on the full bucket; the third waits for two tokens
    (5 s), not for the first one (2.5 s)."""
    for i in range(3):
        await enqueue(broker, clock, f"r{i}", rate("r", 4, 10.0, cost=2))
    assert await claim_ids(broker, limit=10) == ["r0", "r1"]
    got = await claim(broker, limit=10)
    assert got == []
    if isinstance(got, Claimed):
        assert got.wake_at is not None
        assert clock.now() + 4.9 < got.wake_at <= clock.now() + 5.0
    clock.advance(3.0)  # one token and a bit: not enough
    got = await claim(broker, limit=10)
    assert got == []
    if isinstance(got, Claimed):
        assert got.wake_at is not None
        assert clock.now() + 1.9 < got.wake_at <= clock.now() + 2.0
    clock.advance(2.1)
    assert await claim_ids(broker, limit=10) == ["r2"]
    stats = (await broker.admin.list_limits("default"))[0]
    assert stats.tokens is not None and stats.tokens < 1


async def test_W24_cost_and_concurrency_and_rate_together(
    broker: FullBroker, clock: FakeClock
) -> None:
    """A task of cost 2 on a key of 2 at once and 2 per 10 s: it needs both, and a task of
    cost 1 behind it takes what is left, never more."""
    spec = LimitSpec("both", concurrency=2, rate=2, per=10.0, cost=2)
    one = LimitSpec("both", concurrency=2, rate=2, per=10.0)
    await enqueue(broker, clock, "big", spec)
    await enqueue(broker, clock, "small", one)
    (big,) = await claim(broker, limit=10)
    assert big.task.id == "big"
    assert await broker.complete(CompleteParams(big.ref))  # slots back, tokens not
    assert await claim_ids(broker, limit=10) == []
    clock.advance(5.1)  # one token
    assert await claim_ids(broker, limit=10) == ["small"]


@pytest.mark.parametrize("end", list(_ends(FakeClock())))  # the ends W13 checks, by name
async def test_W24_every_end_of_an_attempt_gives_its_whole_cost_back(
    broker: FullBroker, clock: FakeClock, end: str
) -> None:
    await enqueue(broker, clock, "first", conc("k", 2, cost=2))
    await enqueue(broker, clock, "second", conc("k", 2, cost=2))
    (lease,) = await claim(broker, limit=10)
    assert await claim_ids(broker, limit=10) == []
    await _ends(clock)[end](broker, lease)
    got = await claim_ids(broker, limit=10)
    assert len(got) == 1 and got[0] in {"first", "second"}
    assert (await limits_of(broker))["k"][0] == 2


def test_W24_stored_limits_read_old_rows_and_round_trip() -> None:
    old = limits_from_json('[["k",3,null,null],["f:a",2,null,null,"f:{p}"]]')
    assert old == (LimitSpec("k", 3), LimitSpec("f:a", 2, fair="f:{p}"))
    specs = (LimitSpec("f:a", 2, fair="f:{p}", cost=2), LimitSpec("k", 3, cost=3))
    text = limits_to_json(specs)
    assert text == '[["f:a",2,null,null,"f:{p}",2],["k",3,null,null,null,3]]'
    assert limits_from_json(text) == specs
    assert limits_to_json((LimitSpec("k", 3),)) == '[["k",3,null,null]]'


async def test_W24_enqueue_keeps_the_cost(broker: FullBroker) -> None:
    await broker.enqueue(params("t", limits=(conc("k", 5, cost=4),)))
    info = await broker.admin.get_task("default", "t")
    assert info.limits == (conc("k", 5, cost=4),)
