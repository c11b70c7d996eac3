"""What ``durq.Unique`` costs a web handler's single enqueue, beside a plain one, same run.

One ``await app.enqueue(...)`` at a time (the call a handler makes), on a fresh isolated store
per broker (a temporary file, a schema or a key prefix of its own), four ways, interleaved in
rounds so the machine's other load falls on each alike:

* ``plain``: no uniqueness;
* ``unique``: ``Unique(keys=["account_id"])``, every enqueue a new account (creates a task:
  the key is computed in the client and checked by the same insert);
* ``twin/return``: the same account each time, ``on_conflict="return"`` (refused, then the
  twin read back);
* ``debounce``: ``Debounce("doc_id", wait="1h")``, the same document each time (refused, then
  the waiting twin replaced in place).

Prints enqueues per second (median of the rounds) and the ratio to ``plain``. Client-side
figures in one process: they say what the option adds to the call, not a worker's rate.

    .venv/bin/python benchmarks/unique_cost.py [--brokers sqlite,postgresql,redis] [-n 1000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable

from _stores import base_url, each_broker

import durq
from durq.bench.isolation import Isolated

BY_ACCOUNT = durq.Unique(keys=["account_id"])
RETURN = durq.Unique(keys=["account_id"], on_conflict="return")
BURST = durq.Debounce("doc_id", wait="1h")


async def measure(broker_name: str, args: argparse.Namespace, tmpdir: str) -> None:
    n, rounds = args.n, args.rounds
    isolated = Isolated.create(base_url(broker_name, tmpdir))
    await isolated.prepare()
    app = durq.App(isolated.url)
    counter = iter(range(10**9))

    def plain() -> Awaitable[object]:
        return app.enqueue("bench:plain", {"account_id": next(counter)})

    def unique() -> Awaitable[object]:
        return app.enqueue("bench:unique", {"account_id": next(counter)}, unique=BY_ACCOUNT)

    def twin() -> Awaitable[object]:
        return app.enqueue("bench:twin", {"account_id": 1, "n": next(counter)}, unique=RETURN)

    def debounce() -> Awaitable[object]:
        return app.enqueue("bench:doc", {"doc_id": 1, "rev": next(counter)}, unique=BURST)

    ways: dict[str, Callable[[], Awaitable[object]]] = {
        "plain": plain,
        "unique": unique,
        "twin/return": twin,
        "debounce": debounce,
    }
    rates: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for call in ways.values():  # warm: connections, statements, scripts, first twins
            for _ in range(50):
                await call()
        for r in range(rounds):
            order = list(ways.items())
            if r % 2:
                order.reverse()
            for name, call in order:
                t0 = time.perf_counter()
                for _ in range(n):
                    await call()
                rates[name].append(n / (time.perf_counter() - t0))
        base_rate = statistics.median(rates["plain"])
        for name, seen in rates.items():
            rate = statistics.median(seen)
            print(
                f"{broker_name:10} {name:12} {rate:8.0f} enqueues/s  {rate / base_rate:5.2f}x plain"
            )
    finally:
        await app.close()
        await isolated.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=1000, help="enqueues per way per round")
    parser.add_argument("--rounds", type=int, default=3)
    each_broker(parser, measure)


if __name__ == "__main__":
    main()
