"""Instructions per Redis enqueue, producer and server apart, for builds of durq side by side.

A rate moves with whatever else the machine runs; an instruction count does not. For each
build (an interpreter whose environment has that build of durq, as for ``compare.py``) this
counts, under ``valgrind --tool=callgrind``:

* the producer's instructions per task: the producer process runs under callgrind against
  a private ``redis-server``, once with N1 and once with N2 tasks, and the difference over
  N2 - N1 is the per-task figure (start-up and imports cancel out);
* the server's instructions per task: a private ``redis-server`` runs under callgrind while
  the plain producer sends N1, then N2 tasks (a new server each time), same difference.

Workloads: ``one`` (``app.enqueue`` one after another), ``conc`` (``app.enqueue`` from 50
concurrent callers, make bench's "50 callers") and ``bulk`` (``app.enqueue_many`` of 1,000).
Every server is private (a free port, no persistence, a temporary directory).

    .venv/bin/python benchmarks/instructions.py --build before=/tmp/old/.venv/bin/python \\
        --build after=.venv/bin/python [--one 500,2500] [--conc 1000,3000] [--bulk 2000,6000] \\
        [--workloads one,conc,bulk]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve()


def produce(url: str, workload: str, tasks: int) -> None:
    """The producer (run by a build's interpreter): one warm-up enqueue, then ``tasks``."""
    import durq
    from durq.options import EnqueueRequest

    app = durq.App(url)

    @app.task("noop", retention=0)
    async def noop(payload: dict[str, int]) -> None:
        """Never run: only enqueued."""

    async def run() -> None:
        await app.enqueue("noop", {"i": -1})
        if workload == "one":
            for i in range(tasks):
                await app.enqueue("noop", {"i": i})
        elif workload == "conc":

            async def caller(share: range) -> None:
                for i in share:
                    await app.enqueue("noop", {"i": i})

            await asyncio.gather(*(caller(range(c, tasks, 50)) for c in range(50)))
        else:
            for first in range(0, tasks, 1000):
                last = min(tasks, first + 1000)
                await app.enqueue_many(
                    [EnqueueRequest("noop", {"i": i}) for i in range(first, last)]
                )
        await app.close()

    asyncio.run(run())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def collected(output: str) -> int:
    """The instruction count callgrind writes at exit (in the measured process's stderr)."""
    found = re.findall(r"Collected : (\d+)", output)
    if not found:
        raise RuntimeError(f"no callgrind total in: {output[-500:]}")
    return int(found[-1])


def callgrind(tmp: str, name: str) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/{name}.out"]


@contextlib.contextmanager
def private_redis(tmp: str, counted: bool) -> Iterator[tuple[str, Path]]:
    """A private ``redis-server`` (under callgrind when ``counted``): its URL and its log,
    where callgrind writes its total once the server has stopped."""
    port = free_port()
    server = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"]
    # --hz 1: fewer background ticks, whose number follows how long a run takes, not N.
    server += ["--dir", tmp, "--hz", "1"]
    if counted:
        server = callgrind(tmp, "server") + server
    log = Path(tmp) / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(server, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield f"redis://127.0.0.1:{port}/0", log
    finally:
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)
        proc.wait(120)


def count(python: str, workload: str, tasks: int, side: str) -> int:
    """Instructions of the producer (``side="client"``) or of the server for one run."""
    with tempfile.TemporaryDirectory(prefix="durq-instr-") as tmp:
        with private_redis(tmp, counted=side == "server") as (url, log):
            client = [python, str(HERE), "produce", url, workload, str(tasks)]
            if side == "client":
                client = callgrind(tmp, "client") + client
            done = subprocess.run(client, capture_output=True, text=True, check=True)
        return collected(log.read_text() if side == "server" else done.stderr)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "produce":
        produce(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="append", required=True, help="LABEL=PYTHON")
    parser.add_argument("--one", default="500,2500", help="N1,N2 for one-by-one enqueue")
    parser.add_argument("--conc", default="1000,3000", help="N1,N2 for 50 concurrent callers")
    parser.add_argument("--bulk", default="2000,6000", help="N1,N2 for enqueue_many of 1,000")
    parser.add_argument("--workloads", default="one,conc,bulk")
    args = parser.parse_args()
    builds = [spec.split("=", 1) for spec in args.build]
    rows: list[tuple[str, str, str, float]] = []
    workloads = args.workloads.split(",")
    for workload in workloads:
        sizes = getattr(args, workload)
        n1, n2 = (int(n) for n in sizes.split(","))
        for side in ("client", "server"):
            for label, python in builds:
                python = os.path.abspath(python)
                low, high = (count(python, workload, n, side) for n in (n1, n2))
                rows.append((workload, side, label, (high - low) / (n2 - n1)))
                print(f"{workload} {side} {label}: {rows[-1][3]:,.0f}", file=sys.stderr)
    labels = [label for label, _ in builds]
    print(
        f"instructions per task (callgrind; {args.one} one-by-one, {args.conc} from 50 callers,"
        f" {args.bulk} bulk)\n"
    )
    ratios = [f"{label} / {labels[0]}" for label in labels[1:]]
    print("| workload | counted | " + " | ".join(labels + ratios) + " |")
    print("|---|---|" + "---:|" * (2 * len(labels) - 1))
    for workload in workloads:
        for side in ("client", "server"):
            values = [v for w, s, _, v in rows if w == workload and s == side]
            cells = [f"{v / 1000:,.1f}k" for v in values]
            cells += [f"{v / values[0]:.2f}" for v in values[1:]]
            print(f"| {workload} | {side} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
