"""How :class:`durq.Coalescer` groups concurrent calls into round trips and gives each caller
its own answer, watched through the round trips it asks for."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

import durq


class Store:
    """Round trips of one event-loop pass each (or ``passes``); records what each carried.

    An item ``bad…`` is refused: alone it raises, in a batch the whole batch raises;
    an item ``own…`` is refused in its own entry of a batch's answers. A round trip that
    carries a held item waits until it is let go."""

    def __init__(self, *, down: bool = False, passes: int = 1) -> None:
        self.passes = passes
        self.trips: list[list[str]] = []
        self.down = down
        self._held: dict[str, asyncio.Event] = {}
        #: Round trips under way now, and the most there ever were at once.
        self.flying = self.most = 0

    def hold(self, item: str) -> asyncio.Event:
        """Hold the round trip that carries ``item`` until the event is set."""
        gate = self._held[item] = asyncio.Event()
        return gate

    async def _trip(self, items: list[str]) -> None:
        self.trips.append(items)
        self.flying += 1
        self.most = max(self.most, self.flying)
        try:
            for item in items:
                if item in self._held:
                    await self._held[item].wait()
            for _ in range(self.passes):
                await asyncio.sleep(0)
        finally:
            self.flying -= 1
        if self.down:
            raise durq.BrokerUnavailableError("down")

    async def one(self, item: str) -> str:
        await self._trip([item])
        if item.startswith(("bad", "own")):
            raise ValueError(item)
        return item.upper()

    async def many(self, items: Sequence[str]) -> list[str | BaseException]:
        await self._trip(list(items))
        if any(i.startswith("bad") for i in items):
            raise ValueError("a bad item")
        return [ValueError(i) if i.startswith("own") else i.upper() for i in items]


def coalescer(store: Store, **options: object) -> durq.Coalescer[str, str]:
    return durq.Coalescer(store.one, store.many, **options)  # type: ignore[arg-type]


async def test_a_lone_caller_is_sent_alone_and_at_once() -> None:
    store = Store()
    c = coalescer(store)
    for i in range(5):
        assert await c.send(f"t{i}") == f"T{i}"
    assert store.trips == [[f"t{i}"] for i in range(5)]


async def test_calls_made_during_a_round_trip_go_together_in_arrival_order() -> None:
    store = Store()
    c = coalescer(store)

    async def caller(n: int) -> list[str]:
        return [await c.send(f"c{n}-{i}") for i in range(3)]

    answers = await asyncio.gather(*(caller(n) for n in range(20)))
    assert answers == [[f"C{n}-{i}" for i in range(3)] for n in range(20)]
    # The first call alone; then each round trip carries the next call of every caller.
    assert [len(t) for t in store.trips] == [1, 20, 20, 19]
    assert store.trips[1] == [f"c{n}-0" for n in range(1, 20)] + ["c0-1"]


async def test_max_batch_caps_a_round_trip() -> None:
    store = Store()
    c = coalescer(store, max_batch=4)
    answers = await asyncio.gather(*(c.send(f"t{i}") for i in range(10)))
    assert answers == [f"T{i}" for i in range(10)]
    assert [len(t) for t in store.trips] == [1, 4, 4, 1]


@pytest.mark.parametrize(
    ("refused", "trips"),
    [
        # The batch raises: sent again one by one, the error reaches its caller only.
        ("bad", [["a"], ["b", "bad", "c"], ["b"], ["bad"], ["c"]]),
        # The batch answers the error in the item's own entry: not sent again.
        ("own", [["a"], ["b", "own", "c"]]),
    ],
)
async def test_an_error_reaches_the_caller_it_belongs_to_only(
    refused: str, trips: list[list[str]]
) -> None:
    store = Store()
    c = coalescer(store)
    answers = await asyncio.gather(
        *(c.send(i) for i in ("a", "b", refused, "c")), return_exceptions=True
    )
    assert answers[:2] == ["A", "B"] and answers[3] == "C"
    assert isinstance(answers[2], ValueError) and str(answers[2]) == refused
    assert store.trips == trips


async def test_an_unreachable_backend_fails_every_caller_of_the_batch_once() -> None:
    store = Store(down=True)
    c = coalescer(store)
    answers = await asyncio.gather(*(c.send(f"t{i}") for i in range(5)), return_exceptions=True)
    assert all(isinstance(a, durq.BrokerUnavailableError) for a in answers)
    assert [len(t) for t in store.trips] == [1, 4]  # not sent again one by one


async def test_fail_together_names_the_errors_no_item_escapes() -> None:
    store = Store()
    c = coalescer(store, fail_together=(ValueError,))
    answers = await asyncio.gather(
        *(c.send(i) for i in ("a", "b", "bad", "c")), return_exceptions=True
    )
    assert answers[0] == "A"
    assert all(isinstance(a, ValueError) for a in answers[1:])
    assert store.trips == [["a"], ["b", "bad", "c"]]


async def test_items_kept_apart_wait_for_the_next_batch_in_their_place() -> None:
    store = Store()
    c = coalescer(store, apart=lambda item: item[0])
    answers = await asyncio.gather(*(c.send(i) for i in ("x0", "a1", "b1", "a2", "c1", "a3")))
    assert answers == ["X0", "A1", "B1", "A2", "C1", "A3"]
    assert store.trips == [["x0"], ["a1", "b1", "c1"], ["a2"], ["a3"]]


async def in_flight(
    c: durq.Coalescer[str, str], first: str, *waiting: str
) -> tuple[asyncio.Future[str], list[asyncio.Future[str]]]:
    """``first`` sent (its round trip in flight), then ``waiting`` sent while it is."""
    sent = asyncio.ensure_future(c.send(first))
    await asyncio.sleep(0)
    later = [asyncio.ensure_future(c.send(item)) for item in waiting]
    await asyncio.sleep(0)
    return sent, later


async def test_a_cancelled_waiting_caller_is_not_sent() -> None:
    store = Store()
    c = coalescer(store)
    gate = store.hold("first")
    first, (gone, kept) = await in_flight(c, "first", "gone", "kept")
    gone.cancel()
    gate.set()
    assert await first == "FIRST"
    assert await kept == "KEPT"
    assert gone.cancelled()
    assert store.trips == [["first"], ["kept"]]


async def test_a_caller_cancelled_in_flight_leaves_its_batch_going() -> None:
    store = Store()
    c = coalescer(store)
    gates = store.hold("first"), store.hold("a")
    first, waiting = await in_flight(c, "first", "a", "b", "c")
    gates[0].set()
    assert await first == "FIRST"
    while len(store.trips) < 2:  # the batch of a, b and c is on its way, held
        await asyncio.sleep(0)
    waiting[1].cancel()
    gates[1].set()
    assert [await waiting[0], await waiting[2]] == ["A", "C"]
    assert waiting[1].cancelled()
    assert store.trips == [["first"], ["a", "b", "c"]]
    assert await c.send("next") == "NEXT"  # the lane is idle again, not stuck


async def test_the_first_caller_cancelled_frees_the_lane() -> None:
    store = Store()
    c = coalescer(store)
    store.hold("first")  # never let go: only the cancel ends it
    first, (later,) = await in_flight(c, "first", "later")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await later == "LATER"
    assert store.trips == [["first"], ["later"]]


async def test_a_wrong_number_of_answers_fails_the_batch_instead_of_hanging() -> None:
    async def one(item: str) -> str:
        await asyncio.sleep(0)
        return item

    async def many(items: Sequence[str]) -> list[str]:
        await asyncio.sleep(0)
        return list(items[1:])

    c: durq.Coalescer[str, str] = durq.Coalescer(one, many)
    answers = await asyncio.gather(*(c.send(i) for i in "abc"), return_exceptions=True)
    assert answers[0] == "a"
    assert all(isinstance(a, RuntimeError) for a in answers[1:])


def test_each_event_loop_has_a_lane_of_its_own() -> None:
    """Two threads, each with its loop: one loop's round trip in flight does not make the
    other loop's call wait for it, and no batch mixes the calls of two loops."""
    trips: list[tuple[str, list[str]]] = []
    b_done = threading.Event()

    async def one(item: str) -> str:
        trips.append((threading.current_thread().name, [item]))
        if item == "a-first":  # held until loop B has been answered
            assert await asyncio.to_thread(b_done.wait, 10), "loop B waited for loop A"
        await asyncio.sleep(0)
        return item

    async def many(items: Sequence[str]) -> list[str]:
        trips.append((threading.current_thread().name, list(items)))
        await asyncio.sleep(0)
        return list(items)

    c: durq.Coalescer[str, str] = durq.Coalescer(one, many)
    a_started = threading.Event()
    answers: dict[str, list[str]] = {}

    async def run_a() -> None:
        first = asyncio.ensure_future(c.send("a-first"))
        await asyncio.sleep(0)
        a_started.set()
        rest = await asyncio.gather(*(c.send(f"a{i}") for i in range(3)))
        answers["a"] = [await first, *rest]

    async def run_b() -> None:
        answers["b"] = list(await asyncio.gather(*(c.send(f"b{i}") for i in range(3))))
        b_done.set()

    def thread_a() -> None:
        asyncio.run(run_a())

    def thread_b() -> None:
        assert a_started.wait(10)
        asyncio.run(run_b())

    threads = [
        threading.Thread(target=thread_a, name="A"),
        threading.Thread(target=thread_b, name="B"),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert answers == {"a": ["a-first", "a0", "a1", "a2"], "b": ["b0", "b1", "b2"]}
    for thread, items in trips:
        assert {i[0] for i in items} == {thread.lower()}, trips
    assert ("B", ["b0"]) in trips  # loop B's first call went alone, at once


async def test_two_round_trips_in_flight_share_the_callers_evenly() -> None:
    store = Store(passes=5)
    c = coalescer(store, in_flight=2)

    async def caller(n: int) -> list[str]:
        return [await c.send(f"c{n}-{i}") for i in range(4)]

    answers = await asyncio.gather(*(caller(n) for n in range(20)))
    assert answers == [[f"C{n}-{i}" for i in range(4)] for n in range(20)]
    assert store.most == 2
    sent = [item for trip in store.trips for item in trip]
    assert sorted(sent) == sorted(f"c{n}-{i}" for n in range(20) for i in range(4))
    # The first call alone, then the others in two halves that keep their size: while one
    # is in flight the callers of the other are answered and gather again.
    assert [len(t) for t in store.trips] == [1, 10, 10, 10, 10, 10, 10, 10, 9]


async def test_two_in_flight_keep_arrival_order_and_a_lone_caller_alone() -> None:
    store = Store(passes=5)
    c = coalescer(store, in_flight=2)
    for i in range(3):
        assert await c.send(f"t{i}") == f"T{i}"
    assert store.trips == [["t0"], ["t1"], ["t2"]]
    answers = await asyncio.gather(*(c.send(f"a{i}") for i in range(9)))
    assert answers == [f"A{i}" for i in range(9)]
    assert store.trips[3:] == [["a0"], ["a1", "a2", "a3", "a4", "a5"], ["a6", "a7", "a8"]]


def test_in_flight_is_checked() -> None:
    store = Store()
    with pytest.raises(ValueError, match="in_flight"):
        coalescer(store, in_flight=0)
    with pytest.raises(ValueError, match="apart"):
        coalescer(store, in_flight=2, apart=lambda item: item)


async def test_gather_sends_the_first_call_with_those_of_the_same_pass() -> None:
    store = Store()
    c = coalescer(store, gather=True)
    # A lone caller: one pass of the loop later, still alone.
    assert await c.send("lone") == "LONE"

    async def caller(n: int) -> list[str]:
        return [await c.send(f"c{n}-{i}") for i in range(3)]

    answers = await asyncio.gather(*(caller(n) for n in range(20)))
    assert answers == [[f"C{n}-{i}" for i in range(3)] for n in range(20)]
    # Callers that call in one pass go in one round trip, the first one included.
    assert [len(t) for t in store.trips] == [1, 20, 20, 20]
    assert store.trips[1] == [f"c{n}-0" for n in range(20)]
