"""Counted instructions of the worker's own path per task, without a broker's work.

``benchmarks/check.py``'s ``task`` figure counts a task from its claim to its stored
completion, the broker's Python included (the memory broker's claim builds a ``TaskInfo``
and a lease per task). This counts what is left when the broker costs next to nothing: the
real fetcher, acker and executor (concurrency 10, the worker's log summary hook and one hook
that counts completions, as ``app.worker()`` runs them) on a stand-in broker whose claims
hand out leases built ahead (one ``TaskInfo``, a lease per task) and whose completions are
answered at once. A no-op handler that takes its payload. Run under callgrind with N1 and
N2 tasks; the figure is the difference over N2 - N1, as check.py takes its own.

    .venv/bin/python benchmarks/worker_path.py [--sizes 200,1200]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def workload(tasks: int) -> None:
    """The measured program: a warm-up drain of 20 tasks, then one of ``tasks``."""
    import durq
    from durq.brokers.base import CAP_COMPLETE_AND_CLAIM, ClaimParams, CompleteParams, Lease
    from durq.observability.logging import TaskSummary
    from durq.states import TaskState
    from durq.task import TaskInfo
    from durq.worker.executor import Executor
    from durq.worker.fetcher import Fetcher

    app = durq.App("memory://")

    @app.task("noop", retention=0)
    async def noop(payload: dict[str, int]) -> None:
        """Does nothing."""

    class Broker:
        """Claims hand out the leases it holds; completions are stored at once."""

        capabilities = frozenset({CAP_COMPLETE_AND_CLAIM})

        def __init__(self, leases: list[Lease]) -> None:
            self.leases = leases
            self.clock = app.clock

        async def claim(self, params: ClaimParams) -> list[Lease]:
            taken = self.leases[: params.limit]
            del self.leases[: params.limit]
            await asyncio.sleep(0)  # a round trip's loop turn
            return taken

        async def complete_and_claim(
            self, items: Sequence[CompleteParams], params: ClaimParams
        ) -> tuple[list[bool], list[Lease]]:
            return [True] * len(items), await self.claim(params)

        async def complete_many(self, items: Sequence[CompleteParams]) -> list[bool]:
            await asyncio.sleep(0)
            return [True] * len(items)

        async def wait_for_work(self, queues: list[str], timeout: float) -> None:
            await asyncio.sleep(3600)  # never idle before the last task: claims fill slots

    class Done(durq.WorkerHooks):
        def __init__(self, left: int) -> None:
            self.left = left
            self.all_done = asyncio.Event()

        def task_finished(self, task: Any, outcome: str, duration: float) -> None:
            self.left -= 1
            if self.left == 0:
                self.all_done.set()

    async def drain(count: int) -> None:
        info = TaskInfo("t", "default", "noop", b'{"i": 1}', TaskState.ACTIVE, max_retry=3)
        broker = Broker([Lease(info, f"token-{i}") for i in range(count)])
        done = Done(count)
        hooks = [done, TaskSummary("w")]
        executor = Executor(app, broker, concurrency=10, worker_id="w", hooks=hooks)  # type: ignore[arg-type]
        fetcher = Fetcher(
            broker,  # type: ignore[arg-type]
            executor,
            queues={"default": 1},
            strict=False,
            worker_id="w",
            lease_seconds=30,
            poll_interval=5,
        )
        fetcher.start()
        await done.all_done.wait()
        await fetcher.stop()
        await executor.drain(None)
        await executor.close()

    async def run() -> None:
        await drain(20)
        await drain(tasks)

    asyncio.run(run())


def main() -> None:
    if sys.argv[1:2] == ["workload"]:
        workload(int(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200,1200", help="N1,N2 tasks")
    parser.add_argument("--python", default=sys.executable, help="the interpreter measured")
    args = parser.parse_args()
    n1, n2 = (int(x) for x in args.sizes.split(","))
    from check import _count  # this directory is on sys.path when run as a script

    first, second = (_count(args.python, HERE, [str(n)]) for n in (n1, n2))
    print(f"worker path: {(second - first) / (n2 - n1):,.0f} instructions per task")


if __name__ == "__main__":
    main()
