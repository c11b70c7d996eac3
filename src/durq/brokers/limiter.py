"""The arithmetic of one flow-control key and the admission of a task, the one copy used by
the brokers that claim in Python (SQLite, PostgreSQL, memory): each reads the counters
inside its claim's transaction (or lock), decides here, and writes the outcome back.
Redis's ``_lib.lua`` and ``claim.lua`` mirror it (the model test holds them to it).

A key's counter holds how many attempts of it run (``running``) and a token bucket for its
rate: up to ``rate`` tokens, refilled at ``rate / per`` a second on the broker's clock, one
taken per start. A claim admits a task only if every limit it carries has room; a task that
has none is *held* (left pending, out of the claimable set) on the first full key, and the
next claim after room appears lets that key's held tasks back, as many as there is room.

W24, cost: a task may take more than one unit of a key (its limit's ``cost``): it starts
only when the key has that many free slots and tokens, takes them all and gives them all
back. A key remembers the largest cost of the tasks held on it (``need``), and lets them
back (or tells workers to look again) only once that much is free, so that a held task of
cost 5 is not let back, held again and polled for at every token.

W25, sequences: a task whose limit is a sequence keeps that key from its first start until
it finishes. An end that is not final (a retry, a snooze or wait, a hand-back, a rescued
lease) gives back only its other limits' units (:func:`given_back`, with ``keep``) and the
task is marked as holding the key (``kept``); a claim then admits it on that key without
counting the slot again (a rate still takes its tokens), and the final end, or the
inspector's archive, cancel or delete, gives the slot back (:func:`kept_back`). Whether an
end keeps the key is decided above the seam (:func:`keeps`); brokers store the mark.

W23, overrides: an operator may set a key's concurrency or rate (or both) at run time. A part
that is set wins over the limit every task of that key carries, until it is reset; the
counter keeps the last limit a task carried beside it, so a reset goes back to that.
:func:`in_force` gives a task's limit as the claim applies it (its cost is its own).

W22, fair keys: a task whose first limit is fair (its template, ``"tenant:{tenant}"``) got a
*turn* when it was stored: one after the last turn of its partition (the resolved key), and
never before its template's *round* (the turn of the latest task of the template a claim
started). :func:`in_turns` gives a claim its tasks in the order the rule takes them: when the
next task in queue order is fair, the template's task whose turn comes first goes instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from durq.brokers.views import LimitStats
from durq.task import MAX_RATE_PER, LimitSpec

_C = TypeVar("_C")
_K = TypeVar("_K", bound=Hashable)


@dataclass(slots=True)
class Counter:
    """One key's state: what runs, the bucket, the last limit a task of it carried, and an
    operator's override of that limit (W23; ``None`` where a part is not overridden)."""

    running: int = 0
    concurrency: int | None = None
    rate: int | None = None
    per: float | None = None
    tokens: float = 0.0
    refilled_at: float = 0.0
    #: Some task may be held on this key (cleared when letting tasks back finds none left).
    waiting: bool = False
    #: W24: the largest cost of the tasks held on it since it last had none.
    need: int = 1
    override_concurrency: int | None = None
    override_rate: int | None = None
    override_per: float | None = None

    def limit(self) -> tuple[int | None, int | None, float | None]:
        """The key's limit in force, ``(concurrency, rate, per)``: each part overridden, or
        the last task's."""
        concurrency = self.concurrency
        if self.override_concurrency is not None:
            concurrency = self.override_concurrency
        if self.override_rate is not None:
            return concurrency, self.override_rate, self.override_per
        return concurrency, self.rate, self.per

    def tokens_at(self, now: float, rate: int | None = None, per: float | None = None) -> float:
        """Tokens in the bucket at ``now``, refilled at the key's rate in force (or
        ``rate``/``per``); unbounded when there is no rate."""
        if rate is None or per is None:
            _, rate, per = self.limit()
        if rate is None or per is None:
            return math.inf
        elapsed = max(0.0, now - self.refilled_at)
        return min(float(rate), self.tokens + elapsed * rate / per)

    def room(self, now: float) -> int:
        """How many more attempts of this key may start at ``now``."""
        concurrency, _, _ = self.limit()
        room = math.inf
        if concurrency is not None:
            room = concurrency - self.running
        tokens = self.tokens_at(now)
        if tokens != math.inf:
            room = min(room, math.floor(tokens + 1e-9))
        room = max(0, int(min(room, 10**9)))
        return room if room >= self.needed() else 0

    def needed(self) -> int:
        """W24: the units its held tasks wait for (1 when none is held), never more than
        the key's limit in force holds: a task of another limit on the key (or held by an
        override below its cost) must not wait forever."""
        if not self.waiting:
            return 1
        need = self.need
        for part in self.limit()[:2]:  # the concurrency and rate in force
            if part is not None:
                need = min(need, part)
        return max(1, need)

    def next_room_at(self, now: float) -> float | None:
        """When enough tokens come for its held tasks, if the bucket is what holds the key
        back (``None`` when a running attempt must end first: its end wakes the workers)."""
        need = self.needed()
        concurrency, rate, per = self.limit()
        if concurrency is not None and self.running + need > concurrency:
            return None
        if rate is None or per is None:
            return None
        missing = need - self.tokens_at(now)
        return now if missing <= 0 else now + missing * per / rate

    def stats(self, queue: str, key: str, waiting: int, now: float) -> LimitStats:
        """The key as the inspector shows it at ``now``."""
        return LimitStats(
            queue=queue,
            key=key,
            running=self.running,
            concurrency=self.concurrency,
            rate=self.rate,
            per=self.per,
            tokens=None if self.limit()[1] is None else self.tokens_at(now),
            waiting=waiting,
            override_concurrency=self.override_concurrency,
            override_rate=self.override_rate,
            override_per=self.override_per,
        )


def stored(row: Any) -> Counter:
    """A stored counter (a ``limits`` table row, by column name) as a :class:`Counter`."""
    return Counter(
        running=row["running"],
        concurrency=row["concurrency"],
        rate=row["rate"],
        per=row["per"],
        tokens=row["tokens"],
        refilled_at=row["refilled_at"],
        waiting=bool(row["waiting"]),
        need=row["need"],
        override_concurrency=row["override_concurrency"],
        override_rate=row["override_rate"],
        override_per=row["override_per"],
    )


def fresh(spec: LimitSpec, now: float) -> Counter:
    """The counter of a key no claim has started a task of: nothing running, and a bucket
    that filled long ago, so that it is full at the rate of whichever task takes from it
    first, not of the first task a claim looked at (which another key may hold back, and
    PostgreSQL creates the counters of a claim's keys before the limiter decides)."""
    return Counter(
        concurrency=spec.concurrency,
        rate=spec.rate,
        per=spec.per,
        tokens=0.0,
        refilled_at=now - 2 * MAX_RATE_PER,
    )


def unclaimed(now: float) -> Counter:
    """The counter an override creates for a key no claim has counted (W23): nothing
    running, and a bucket full at whatever rate applies first (see :func:`fresh`)."""
    return Counter(tokens=0.0, refilled_at=now - 2 * MAX_RATE_PER)


def in_force(spec: LimitSpec, counter: Counter) -> LimitSpec:
    """W23: a task's limit as the claim applies it: each part the key's override sets
    replaces the task's own (``spec`` itself when nothing is overridden)."""
    if counter.override_concurrency is None and counter.override_rate is None:
        return spec
    concurrency, rate, per = spec.concurrency, spec.rate, spec.per
    if counter.override_concurrency is not None:
        concurrency = counter.override_concurrency
        if spec.sequence and spec.concurrency is not None:
            # W25: a sequence runs one at a time; an override may pause it, not widen it.
            concurrency = min(concurrency, spec.concurrency)
    if counter.override_rate is not None:
        rate, per = counter.override_rate, counter.override_per
    return replace(spec, concurrency=concurrency, rate=rate, per=per)


def admits(spec: LimitSpec, counter: Counter, now: float, kept: bool = False) -> bool:
    """Whether one more attempt under ``spec`` may start (the task's own limit decides,
    unless the key's override replaces it): ``cost`` free slots and tokens. W25: a task
    that ``kept`` its sequence's key holds its slot already and needs only the tokens."""
    spec = in_force(spec, counter)
    if (
        spec.concurrency is not None
        and not (kept and spec.sequence)
        and counter.running + spec.cost > spec.concurrency
    ):
        return False
    if spec.rate is None:
        return True
    # The bucket refills at the task's rate.
    return counter.tokens_at(now, spec.rate, spec.per) >= spec.cost - 1e-9


def take(spec: LimitSpec, counter: Counter, now: float, kept: bool = False) -> None:
    """Count one start: ``cost`` running units, and as many tokens at the rate in force;
    the key keeps the task's own limit (what a reset of an override goes back to). W25:
    the slot of a sequence's key the task ``kept`` is counted already."""
    rule = in_force(spec, counter)
    if rule.rate is not None and rule.per is not None:
        counter.tokens = counter.tokens_at(now, rule.rate, rule.per) - spec.cost
        counter.refilled_at = now
    counter.concurrency, counter.rate, counter.per = spec.concurrency, spec.rate, spec.per
    if spec.rate is None or spec.per is None:
        counter.rate = counter.per = None
    if not (kept and spec.sequence):
        counter.running += spec.cost


def blocking(
    specs: tuple[LimitSpec, ...], counters: dict[str, Counter], now: float, kept: bool = False
) -> str | None:
    """The first key of ``specs`` without room (``None``: all admit). Keys missing from
    ``counters`` are added fresh."""
    for spec in specs:
        counter = counters.get(spec.key)
        if counter is None:
            counter = counters[spec.key] = fresh(spec, now)
        if not admits(spec, counter, now, kept):
            return spec.key
    return None


def admit(
    specs: tuple[LimitSpec, ...], counters: dict[str, Counter], now: float, kept: bool = False
) -> str | None:
    """Admit one task carrying ``specs`` (count its start on every key: ``None``), or the
    first key without room, which the task is then held on (the key is marked waiting).
    ``kept``: the task holds its sequences' keys (W25)."""
    full = blocking(specs, counters, now, kept)
    if full is not None:
        counter = counters[full]
        cost = next(s.cost for s in specs if s.key == full)
        counter.need = max(counter.need, cost) if counter.waiting else cost
        counter.waiting = True
        return full
    for spec in specs:
        take(spec, counters[spec.key], now, kept)
    return None


def keeps(specs: tuple[LimitSpec, ...]) -> bool:
    """W25: whether an end of an attempt that is not final keeps the task's keys (it has a
    sequence among its limits); the worker, rescuer and inspector ask, brokers store it."""
    return any(spec.sequence for spec in specs)


def given_back(specs: tuple[LimitSpec, ...], keep: bool) -> tuple[LimitSpec, ...]:
    """The limits whose units an end of an attempt gives back: all of them, or with
    ``keep`` (W25) all but the sequences, whose keys the task keeps."""
    return tuple(s for s in specs if not s.sequence) if keep else specs


def kept_back(specs: tuple[LimitSpec, ...]) -> tuple[LimitSpec, ...]:
    """W25: the limits whose slots a task that kept its keys gives back when it is archived,
    cancelled or deleted without running: its sequences."""
    return tuple(s for s in specs if s.sequence)


def wake_at(counters: Iterable[Counter], now: float) -> float | None:
    """When a token comes for the first key with held tasks that only its bucket holds
    back (``None``: none waits on a token)."""
    times = [t for c in counters if c.waiting and (t := c.next_room_at(now)) is not None]
    return min(times, default=None)


def outlook(counters: Iterable[Counter], now: float) -> tuple[bool, float | None]:
    """For the counters of keys with held tasks: whether one has room at ``now`` (a claim
    would let its tasks back), and if none has, when a token comes for the first."""
    wake: float | None = None
    for counter in counters:
        if counter.room(now) > 0:
            return True, None
        at = counter.next_room_at(now)
        if at is not None and (wake is None or at < wake):
            wake = at
    return False, wake


def in_turns(
    order: Sequence[_C],
    ident: Callable[[_C], Hashable],
    template: Callable[[_C], _K | None],
    turns: Callable[[_K], Iterable[_C]],
) -> Iterator[tuple[_C, _C]]:
    """W22: the tasks of ``order`` (one queue's claimable tasks in claim order) in the order
    a claim takes them, each once, with the task of ``order`` whose place it takes (itself
    for a task without a fair limit); the caller admits or holds each in turn.

    While the first task of ``order`` not yet given is fair, the claim takes the task of its
    template whose turn comes first: ``turns(template)`` lists the template's claimable tasks
    by priority, then turn, then enqueue order (read again when those are used up; tasks it
    gives that are already taken are skipped). A template thus keeps its place in the queue,
    that of its first task in order, and its partitions take turns in that place. A task
    without a fair limit (``template`` gives ``None``) costs one call of ``template``."""
    given: set[Hashable] = set()
    lists: dict[_K, Iterator[_C]] = {}
    i = 0
    while i < len(order):
        head = order[i]
        if ident(head) in given:
            i += 1
            continue
        name = template(head)
        pick = head
        if name is not None:
            found = _next_untaken(lists.get(name), ident, given)
            if found is None:  # read the template's line again: a claim may take many
                lists[name] = iter(turns(name))
                found = _next_untaken(lists[name], ident, given)
            if found is not None:
                pick = found
        given.add(ident(pick))
        yield pick, head


def _next_untaken(
    items: Iterator[_C] | None, ident: Callable[[_C], Hashable], given: set[Hashable]
) -> _C | None:
    if items is None:
        return None
    for item in items:
        if ident(item) not in given:
            return item
    return None


def fair_template(specs: tuple[LimitSpec, ...]) -> str | None:
    """The template of a task's fair limit (stored first), if it has one."""
    return specs[0].fair if specs else None


__all__ = [
    "Counter",
    "admit",
    "admits",
    "blocking",
    "fair_template",
    "fresh",
    "given_back",
    "in_force",
    "in_turns",
    "keeps",
    "kept_back",
    "outlook",
    "stored",
    "take",
    "unclaimed",
    "wake_at",
]
