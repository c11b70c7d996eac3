"""The chaos harness: real worker processes, a ledger they cannot fake, and a checker.

* :class:`Cluster` starts ``chaos_worker.py`` subprocesses, kills them with SIGKILL or stops
  them with SIGTERM, restarts them, and records when each pid died and how.
* :func:`read_ledger` parses the workers' append-only ledger files into :class:`Run` records.
* :func:`check` compares the runs with the task ids the test enqueued and the broker's final
  state: lost, unexpected, duplicated (and whether each duplicate is explained by a kill, a
  shutdown hand-back or a worker loss), overlapping live runs, recovery latency after kills.
* :class:`ThrowawayPostgres` and :class:`servers.PrivateRedis` are private servers in a temp dir on
  their own port, for scenarios that crash the server itself (never the shared ones).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import durq
from durq.brokers import open_broker
from durq.options import EnqueueRequest
from servers import free_port, wait_port

WORKER = Path(__file__).with_name("chaos_worker.py")
QUEUE = "chaos"


# -- the ledger ---------------------------------------------------------------------------------


@dataclass
class Run:
    """One start of a handler, as the ledger saw it."""

    task_id: str
    attempt: int
    pid: int
    start: float
    #: "end" (handler returned), "cancel" (handed back or cancelled), "killed", "exited", "open".
    how: str = "open"
    stop: float | None = None


def read_ledger(directory: Path, deaths: dict[int, tuple[str, float]]) -> list[Run]:
    """All runs of all workers; a run without an end line ends when its process died."""
    runs: list[Run] = []
    for path in sorted(directory.glob("ledger-*.log")):
        open_runs: dict[tuple[str, int], list[Run]] = defaultdict(list)
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 5:  # cannot happen with one write(2) per line; counted if it does
                runs.append(Run("<torn line>", -1, -1, 0.0, "torn"))
                continue
            kind, task_id, attempt_s, pid_s, at_s = parts
            attempt, pid, at = int(attempt_s), int(pid_s), float(at_s)
            if kind == "start":
                run = Run(task_id, attempt, pid, at)
                runs.append(run)
                open_runs[(task_id, attempt)].append(run)
            else:
                pending = open_runs.get((task_id, attempt))
                if pending:
                    run = pending.pop(0)
                    run.how, run.stop = kind, at
    for run in runs:
        if run.how == "open" and run.pid in deaths:
            run.how, run.stop = deaths[run.pid]
    return runs


@dataclass
class Report:
    """What the checker found. ``ok`` means: nothing lost, nothing unexpected, no overlap,
    every duplicate explained, and the broker shows every task completed."""

    tasks: int
    runs: int
    lost: list[str]
    unexpected: list[str]
    duplicated: int
    #: Tasks whose handler *returned* more than once (a kill between the end and the ack).
    completed_twice: int
    unexplained_duplicates: list[str]
    overlaps: list[str]
    final_states: dict[str, int]
    recovery: list[float]
    kills: int = 0
    restarts: int = 0
    torn_lines: int = 0
    #: Killed pid -> tasks run again because of that kill: the handlers it was running, and
    #: those that had returned but whose completion had not reached the broker.
    reruns_by_kill: dict[int, int] = field(default_factory=dict)
    #: Killed pid -> of those, the tasks whose handler had returned (completed twice).
    duplicates_by_kill: dict[int, int] = field(default_factory=dict)
    #: Tasks run again because a crash of the broker server dropped their lease or their
    #: completion: runs claimed or ended within the writes it may lose (``check``).
    reruns_by_crash: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def max_reruns_per_kill(self) -> int:
        return max(self.reruns_by_kill.values(), default=0)

    @property
    def max_duplicates_per_kill(self) -> int:
        return max(self.duplicates_by_kill.values(), default=0)

    @property
    def duplicates_per_kill(self) -> float:
        """Completed-twice tasks caused by kills, per kill."""
        return sum(self.duplicates_by_kill.values()) / self.kills if self.kills else 0.0

    @property
    def recovery_p99(self) -> float:
        return percentile(self.recovery, 99)

    @property
    def all_completed(self) -> bool:
        done = self.final_states.get("completed", 0)
        others = sum(n for s, n in self.final_states.items() if s != "completed")
        return done == self.tasks and others == 0

    @property
    def ok(self) -> bool:
        return (
            not self.lost
            and not self.unexpected
            and not self.unexplained_duplicates
            and not self.overlaps
            and not self.torn_lines
            and self.all_completed
        )

    def summary(self) -> str:
        rec = self.recovery
        return (
            f"tasks={self.tasks} runs={self.runs} kills={self.kills} restarts={self.restarts} "
            f"lost={len(self.lost)} unexpected={len(self.unexpected)} "
            f"duplicated={self.duplicated} (completed twice {self.completed_twice}, "
            f"unexplained {len(self.unexplained_duplicates)}) overlaps={len(self.overlaps)} "
            f"final={self.final_states} recovery: n={len(rec)} "
            f"p50={percentile(rec, 50):.2f}s p99={percentile(rec, 99):.2f}s "
            f"max={max(rec, default=0.0):.2f}s per kill: re-runs max {self.max_reruns_per_kill}, "
            f"completed twice max {self.max_duplicates_per_kill} "
            f"mean {self.duplicates_per_kill:.2f}; re-runs after the server crash "
            f"{self.reruns_by_crash} {self.extra or ''}"
        )


def percentile(values: Sequence[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def check(
    expected: Iterable[str],
    runs: list[Run],
    final_states: dict[str, int],
    *,
    deaths: dict[int, tuple[str, float]] | None = None,
    kills: int = 0,
    restarts: int = 0,
    crashes: Sequence[tuple[float, float]] = (),
    lost_writes: float = 0.0,
) -> Report:
    """Check the runs against the tasks expected and the broker's final states.

    ``crashes``: when each crash of the broker server began and when it was back. Such a
    crash explains a second start of a task whose run was claimed or ended from
    ``lost_writes`` seconds before it began until the server was back: the server may drop
    that many seconds of acknowledged writes (Redis with ``appendfsync everysec`` when its
    fsync falls behind; none with PostgreSQL's ``synchronous_commit = on``), and a completion
    sent during the outage is fenced out if the lease was lost. Those re-runs are counted
    apart from the kills'."""
    expected_ids = set(expected)
    deaths = deaths or {}
    by_task: dict[str, list[Run]] = defaultdict(list)
    torn = 0
    for run in runs:
        if run.how == "torn":
            torn += 1
            continue
        by_task[run.task_id].append(run)
    lost = sorted(t for t in expected_ids if not any(r.how == "end" for r in by_task.get(t, [])))
    unexpected = sorted(set(by_task) - expected_ids)
    duplicated = completed_twice = 0
    unexplained: list[str] = []
    overlaps: list[str] = []
    recovery: list[float] = []
    reruns: dict[int, int] = defaultdict(int)
    twice: dict[int, int] = defaultdict(int)
    crash_reruns = 0
    for task_id, task_runs in by_task.items():
        task_runs.sort(key=lambda r: r.start)
        if len(task_runs) > 1:
            duplicated += 1
        if sum(r.how == "end" for r in task_runs) > 1:
            completed_twice += 1
        for before, after in itertools.pairwise(task_runs):
            # A second start is explained only by the first run's process dying (SIGKILL,
            # a poison pill) while it ran or before its outcome reached the broker, by a
            # hand-back (cancel at shutdown), or by a server crash that dropped its writes.
            by_crash = before.how == "end" and _crash_explains(before, after, crashes, lost_writes)
            crash_reruns += by_crash
            # A crash's re-run is not charged to a later death of the process as well.
            died = None if by_crash else deaths.get(before.pid)
            died_after_end = (
                before.how == "end"
                and died is not None
                and before.stop is not None
                and died[1] >= before.stop
            )
            explained = died_after_end or by_crash
            if before.how not in ("killed", "cancel", "exited") and not explained:
                unexplained.append(task_id)
            if (
                died is not None
                and died[0] == "killed"
                and (before.how == "killed" or died_after_end)
            ):
                reruns[before.pid] += 1
                if died_after_end:
                    twice[before.pid] += 1
            stop = before.stop if before.stop is not None else float("inf")
            if after.start < stop:
                overlaps.append(task_id)
            if before.how == "killed" and before.stop is not None:
                recovery.append(after.start - before.stop)
    return Report(
        tasks=len(expected_ids),
        runs=len(runs) - torn,
        lost=lost,
        unexpected=unexpected,
        duplicated=duplicated,
        completed_twice=completed_twice,
        unexplained_duplicates=sorted(set(unexplained)),
        overlaps=sorted(set(overlaps)),
        final_states=final_states,
        recovery=recovery,
        kills=kills,
        restarts=restarts,
        torn_lines=torn,
        reruns_by_kill=dict(reruns),
        duplicates_by_kill=dict(twice),
        reruns_by_crash=crash_reruns,
    )


def _crash_explains(
    before: Run, after: Run, crashes: Sequence[tuple[float, float]], lost_writes: float
) -> bool:
    """Whether a crash of the server, begun before ``after`` started, may have dropped the
    lease or the completion of ``before`` (a run that ended)."""
    stop = before.start if before.stop is None else before.stop  # an ended run has one
    return any(
        after.start >= down and any(down - lost_writes <= m <= up for m in (before.start, stop))
        for down, up in crashes
    )


# -- the cluster of worker processes ---------------------------------------------------------------


class Cluster:
    """``size`` worker subprocesses on one broker URL, each writing its own ledger file."""

    def __init__(self, url: str, directory: Path, size: int, *worker_args: str) -> None:
        self.url = url
        self.dir = directory
        self.size = size
        self.worker_args = list(worker_args)
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * size
        #: pid -> ("killed" | "exited", when): the end of every run the ledger left open.
        self.deaths: dict[int, tuple[str, float]] = {}
        self.kills = 0
        self.restarts = 0
        self.rng = random.Random(os.environ.get("DURQ_CHAOS_SEED", "7"))
        self.dir.mkdir(parents=True, exist_ok=True)

    def start(self, slot: int, *extra: str) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"worker-{slot}.stderr", "ab")
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), self.url, str(self.dir), *self.worker_args, *extra],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        self.procs[slot] = proc
        return proc

    def start_all(self) -> None:
        for slot in range(self.size):
            self.start(slot)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every live worker has started taking tasks."""
        deadline = time.monotonic() + timeout
        while True:
            pids = [p.pid for p in self.procs if p is not None and p.poll() is None]
            if all((self.dir / f"ready-{pid}").exists() for pid in pids):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers not ready: {self.stderr_tail()}")
            await asyncio.sleep(0.05)

    def kill(self, slot: int) -> int:
        """SIGKILL one worker (no chance to hand anything back) and record when."""
        proc = self.procs[slot]
        assert proc is not None
        proc.kill()
        when = time.time()
        proc.wait()
        self.deaths[proc.pid] = ("killed", when)
        self.kills += 1
        return proc.pid

    def kill_random_and_restart(self) -> None:
        """SIGKILL a random worker that has started taking tasks, and start it again. One
        still starting is spared: on a busy machine a start can take longer than the storm's
        period, and killing starters would stop all progress (not a fault of the broker)."""
        ready = [
            slot
            for slot, proc in enumerate(self.procs)
            if proc is not None
            and proc.poll() is None
            and (self.dir / f"ready-{proc.pid}").exists()
        ]
        if not ready:
            return
        slot = self.rng.choice(ready)
        self.kill(slot)
        self.start(slot)
        self.restarts += 1

    def respawn_exited(self) -> None:
        """Restart workers that died on their own (a poison pill, start-up while a broker was
        down); their open runs end at the time we noticed."""
        for slot, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is not None:
                self.deaths.setdefault(proc.pid, ("exited", time.time()))
                self.start(slot)
                self.restarts += 1

    def terminate_all(self, timeout: float = 30.0) -> list[int]:
        """SIGTERM everyone (graceful, W7) and wait; returns the exit codes."""
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in live:
            try:
                codes.append(proc.wait(timeout))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.deaths[proc.pid] = ("killed", time.time())
                codes.append(-9)
        for proc in live:
            self.deaths.setdefault(proc.pid, ("exited", time.time()))
        return codes

    def stop(self) -> None:
        """Teardown: kill whatever still runs."""
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
                self.deaths.setdefault(proc.pid, ("killed", time.time()))

    def runs(self) -> list[Run]:
        return read_ledger(self.dir, self.deaths)

    def stderr_tail(self, lines: int = 20) -> str:
        out = []
        for path in sorted(self.dir.glob("worker-*.stderr")):
            out.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(out[-lines * 2 :])


# -- driving a scenario -----------------------------------------------------------------------------


async def enqueue_work(
    url: str, count: int, *, ms: int = 10, prefix: str = "c", type: str = "chaos:work"
) -> list[str]:
    """Enqueue ``count`` tasks with known ids (kept 1 h after completion), in bulk."""
    app = durq.App(url)
    ids = [f"{prefix}{i:06d}" for i in range(count)]
    try:
        for chunk in range(0, count, 1000):
            requests = [
                EnqueueRequest(type, {"ms": ms}, queue=QUEUE, task_id=t, retention=3600)
                for t in ids[chunk : chunk + 1000]
            ]
            outcomes = await app.enqueue_many(requests)
            assert all(o.created for o in outcomes)
    finally:
        await app.close()
    return ids


async def final_states(url: str, queue: str = QUEUE) -> dict[str, int]:
    """Task counts by state, as the broker reports them (retries through a restart)."""
    broker = open_broker(url)
    try:
        for _ in range(100):
            try:
                await broker.connect()
                stats = await broker.admin.queue_stats(queue)
                return {s.value: n for s, n in stats.sizes.items() if n}
            except durq.BrokerUnavailableError:
                await asyncio.sleep(0.2)
        raise TimeoutError("broker unreachable")
    finally:
        await broker.close()


async def wait_done(
    url: str,
    count: int,
    *,
    timeout: float,
    queue: str = QUEUE,
    every: float = 0.5,
) -> float:
    """Until ``count`` tasks of ``queue`` are completed; returns the seconds it took."""
    start = time.monotonic()
    while True:
        try:
            states = await final_states(url, queue)
        except TimeoutError:
            states = {}
        if states.get("completed", 0) >= count:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"not done after {timeout}s: {states}")
        await asyncio.sleep(every)


async def storm(
    cluster: Cluster,
    url: str,
    count: int,
    *,
    kill_every: float,
    timeout: float,
    during: dict[float, object] | None = None,
) -> tuple[float, list[tuple[float, float]]]:
    """Kill a random worker every ``kill_every`` seconds (and restart it) until ``count`` tasks
    are completed. ``during`` maps seconds-into-the-run to callables run once (server crash).
    Returns the seconds it took and, for each of those callables that ran, when it began and
    ended (wall clock: the ledger's time)."""
    done = asyncio.create_task(wait_done(url, count, timeout=timeout))
    start = time.monotonic()
    actions = dict(sorted((during or {}).items()))
    performed: list[tuple[float, float]] = []
    try:
        while not done.done():
            await asyncio.wait({done}, timeout=kill_every)
            if done.done():
                break
            cluster.respawn_exited()
            cluster.kill_random_and_restart()
            elapsed = time.monotonic() - start
            for at in [a for a in actions if a <= elapsed]:
                action = actions.pop(at)
                began = time.time()
                await asyncio.to_thread(action)  # type: ignore[arg-type]
                performed.append((began, time.time()))
        return done.result(), performed
    finally:
        if not done.done():
            done.cancel()


# -- throw-away servers ---------------------------------------------------------------------------


def _pg_bin() -> Path | None:
    root = Path("/usr/lib/postgresql")
    if not root.exists():
        return None
    versions = sorted(root.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0)
    for version in reversed(versions):
        if (version / "bin" / "initdb").exists():
            return version / "bin"
    return None


class ThrowawayPostgres:
    """A private PostgreSQL cluster in a temp dir on its own port; ``restart_immediate`` is a
    crash (no checkpoint, recovery from WAL on start). Runs as ``postgres`` when we are root."""

    def __init__(self) -> None:
        bin_dir = _pg_bin()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL server binaries are not installed")
        self.bin = bin_dir
        # Not under pytest's tmp_path: the postgres user must be able to reach it.
        self.base = Path(tempfile.mkdtemp(prefix="durq-chaos-pg-"))
        self.dir = self.base / "pgdata"
        self.port = free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.base, "postgres")
        self._run(
            "initdb",
            "-D",
            str(self.dir),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        with open(self.dir / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                "unix_socket_directories = ''\nsynchronous_commit = on\nfsync = on\n"
                "max_connections = 200\nshared_buffers = 64MB\n"
            )
        self.start()

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *argv: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bin / tool), *argv],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
        )

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.dir), "-l", str(self.dir / "log"), "-w", "start")
        wait_port(self.port)

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.dir), "-m", mode, "-w", "stop")

    def restart_immediate(self, down_for: float = 1.0) -> None:
        self.stop("immediate")
        time.sleep(down_for)
        self.start()

    def close(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.base, ignore_errors=True)
