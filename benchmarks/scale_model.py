"""A scale model on paper, from per-task costs measured on this machine.

Measures, on a private PostgreSQL cluster (``initdb`` in a temporary directory, with
``pg_stat_statements``) and a private ``redis-server`` — so no other client adds noise — what
one task costs the broker, with the real CLI: a ``durq worker`` process (``--processes 1``,
the default concurrency) drains N no-op tasks that a producer process enqueued one by one
(``app.enqueue``, ``--producers`` concurrent callers, as a web app does):

* broker CPU per task: PostgreSQL, the CPU time of every process of the cluster (the
  backends, the WAL writer, autovacuum…, from ``/proc/<pid>/stat``; the monitoring backend
  excluded); Redis, ``INFO cpu`` (``used_cpu_sys + used_cpu_user``);
* statements per task (``pg_stat_statements`` calls) or commands per task (``INFO
  commandstats``; commands run inside scripts are counted by Redis too, so script calls are
  shown apart), and request segments per task (TCP data segments the server received, from
  ``ss -ti``: a pipelined batch is one);
* bytes per task on the wire, both directions (``ss -ti`` bytes of the server's sockets);
* worker CPU per task (``/proc/<pid>/stat`` of the worker process);
* the idle cost of one worker process per second (heartbeat, maintenance, polling);
* PostgreSQL: WAL bytes and dead tuples per task (``pg_stat_wal``, ``pg_stat_user_tables``);
  Redis: memory per pending task (``INFO memory``).

The monitor talks over a Unix socket (outside the TCP counts) and its statements are tagged
and left out. Then the model (assumptions in docs/deployment.md, and printed) estimates the
throughput and broker load of 10 and 100 worker machines on one PostgreSQL, one Redis and a
3- and 6-master Redis Cluster, and names the first bottleneck of each.

    .venv/bin/python benchmarks/scale_model.py [--tasks 3000] [--producers 10] [--idle 10]
        [--only postgresql|redis] [--json] [--from-json saved.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from durq import App

HERE = Path(__file__).resolve().parent
QUEUE = "scale"
#: The worker's connection name (application_name, client_name): what :class:`Peak` counts.
WORKER = "durq-scale-worker"
TICK = os.sysconf("SC_CLK_TCK")

#: The app the worker runs (``durq worker scale_model:app`` from this folder).
app = App("memory://scale")


@app.task("scale:noop", queue=QUEUE, max_retry=0)
async def noop(payload: dict[str, Any]) -> None:
    """Does nothing: the model measures the queue, not the handler."""


# -- measuring ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proc_cpu(pid: int, children: bool = False) -> float:
    """CPU seconds of ``pid`` (user + system; with its reaped children's if asked)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def child_pids(parent: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(FileNotFoundError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    out.append(int(entry.name))
    return out


def tcp_server_sockets(port: int) -> dict[str, tuple[int, int, int]]:
    """The server side of each TCP connection to ``port``: bytes in, bytes out, data
    segments in (requests; a pipelined batch counts once)."""
    text = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    out: dict[str, tuple[int, int, int]] = {}
    key = ""
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            parts = line.split()
            key = f"{parts[-2]}>{parts[-1]}"
            continue
        values = dict(p.split(":", 1) for p in line.split() if ":" in p)
        out[key] = (
            int(values.get("bytes_received", 0)),
            int(values.get("bytes_sent", 0)),
            int(values.get("data_segs_in", 0)),
        )
    return out


@dataclass
class Snapshot:
    at: float
    broker_cpu: float
    calls: int
    scripts: int
    sockets: dict[str, tuple[int, int, int]]
    worker_cpu: float
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class Delta:
    seconds: float
    broker_cpu: float
    calls: int
    scripts: int
    bytes: int
    segments: int
    worker_cpu: float
    extra: dict[str, float]


def delta(a: Snapshot, b: Snapshot) -> Delta:
    moved = [0, 0, 0]
    for key, now in b.sockets.items():
        before = a.sockets.get(key, (0, 0, 0))
        for i in range(3):
            moved[i] += now[i] - before[i]
    return Delta(
        seconds=b.at - a.at,
        broker_cpu=b.broker_cpu - a.broker_cpu,
        calls=b.calls - a.calls,
        scripts=b.scripts - a.scripts,
        bytes=moved[0] + moved[1],
        segments=moved[2],
        worker_cpu=b.worker_cpu - a.worker_cpu,
        extra={k: b.extra.get(k, 0.0) - a.extra.get(k, 0.0) for k in b.extra},
    )


class PrivatePostgres:
    """A throw-away cluster with pg_stat_statements; TCP for durq, a Unix socket for us."""

    MONITOR = "/* durq-scale-monitor */ "

    def __init__(self) -> None:
        root = Path("/usr/lib/postgresql")
        versions = sorted((p for p in root.iterdir() if (p / "bin/initdb").exists()), key=str)
        self.bin = versions[-1] / "bin"
        self.base = Path(tempfile.mkdtemp(prefix="durq-scale-pg-"))
        self.dir, self.port = self.base / "data", free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.base, "postgres")
        self._run("initdb", "-D", str(self.dir), "-U", "postgres", "--auth=trust", "--no-sync")
        with open(self.dir / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.base}'\n"
                "shared_preload_libraries = 'pg_stat_statements'\n"
                "pg_stat_statements.track = all\nmax_connections = 200\n"
            )
        self._run("pg_ctl", "-D", str(self.dir), "-l", str(self.base / "log"), "-w", "start")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.postmaster = int((self.dir / "postmaster.pid").read_text().split()[0])
        self.conn: Any = None
        self.monitor_pid = 0

    def _run(self, tool: str, *argv: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bin / tool), *argv], check=True, capture_output=True
        )

    def open(self) -> None:
        import psycopg

        self.conn = psycopg.connect(
            host=str(self.base), port=self.port, user="postgres", dbname="postgres", autocommit=True
        )
        self.q("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.monitor_pid = int(self.q("SELECT pg_backend_pid()")[0][0])

    def q(self, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(self.MONITOR + text, params)
        return cur.fetchall() if cur.description else []

    def cpu(self) -> float:
        pids = [p for p in child_pids(self.postmaster) if p != self.monitor_pid]
        return proc_cpu(self.postmaster, children=True) + sum(proc_cpu(p) for p in pids)

    def calls(self) -> int:
        rows = self.q(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query NOT LIKE %s",
            (self.MONITOR.strip() + "%",),
        )
        return int(rows[0][0])

    def wal(self) -> dict[str, float]:
        row = self.q("SELECT wal_records, wal_bytes, wal_sync FROM pg_stat_wal")[0]
        return {
            "wal_records": float(row[0]),
            "wal_bytes": float(row[1]),
            "wal_syncs": float(row[2]),
        }

    def tasks_table(self, schema: str) -> dict[str, int]:
        self.q("SELECT pg_stat_force_next_flush()")
        rows = self.q(
            "SELECT n_live_tup, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, "
            "autovacuum_count FROM pg_stat_user_tables WHERE schemaname = %s AND relname = "
            "'tasks'",
            (schema,),
        )
        keys = ("live", "dead", "inserted", "updated", "hot_updated", "deleted", "autovacuums")
        return dict(zip(keys, map(int, rows[0]), strict=True)) if rows else {}

    def pending(self, schema: str) -> int:
        from psycopg import sql

        text = sql.SQL("SELECT count(*) FROM {}.tasks").format(sql.Identifier(schema))
        cur = self.conn.execute(sql.SQL(self.MONITOR) + text)
        return int(cur.fetchone()[0])

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.dir), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.base, ignore_errors=True)


class PrivateRedis:
    """A throw-away redis-server (no persistence); TCP for durq, a Unix socket for us."""

    def __init__(self) -> None:
        import redis

        self.base = Path(tempfile.mkdtemp(prefix="durq-scale-redis-"))
        self.port = free_port()
        sock = self.base / "redis.sock"
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--unixsocket",
                str(sock),
                "--dir",
                str(self.base),
            ],
            stdout=subprocess.DEVNULL,
        )
        self.client = redis.Redis(unix_socket_path=str(sock))
        deadline = time.monotonic() + 20
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.version = str(self.client.info("server")["redis_version"])

    def cpu(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def commands(self) -> tuple[int, int]:
        """Commands durq sent (the monitor's own left out) and script calls among them."""
        stats = self.client.info("commandstats")
        ours = ("cmdstat_info", "cmdstat_zcard", "cmdstat_ping", "cmdstat_memory")
        calls = sum(int(v["calls"]) for k, v in stats.items() if k not in ours)
        scripts = sum(
            int(stats.get(k, {}).get("calls", 0))
            for k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall")
        )
        return calls, scripts

    def memory(self) -> float:
        return float(self.client.info("memory")["used_memory"])

    def pending(self, prefix: str) -> int:
        return sum(
            int(self.client.zcard(f"{prefix}:{{{QUEUE}}}:{state}"))
            for state in ("pending", "active", "scheduled", "retry")
        )

    def close(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)


class Peak:
    """Samples the worker process's server connections every 0.1 s."""

    def __init__(self, server: PrivatePostgres | PrivateRedis) -> None:
        self.server = server
        self.peak = self.idle = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def count(self) -> int:
        if isinstance(self.server, PrivatePostgres):
            rows = self.server.q(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (WORKER,)
            )
            return int(rows[0][0])
        return sum(1 for c in self.server.client.client_list() if c["name"] == WORKER)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self.count())

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- the run -------------------------------------------------------------------------------


def durq_cli() -> str:
    return str(Path(sys.executable).with_name("durq"))


def wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def running(argv: list[str], **kwargs: Any) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(argv, cwd=HERE, text=True, **kwargs)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def measure(kind: str, tasks: int, producers: int, idle: float) -> dict[str, Any]:
    server: PrivatePostgres | PrivateRedis
    if kind == "postgresql":
        server = PrivatePostgres()
        server.open()
        name = "durq"
        url = f"{server.url}?schema={name}"
    else:
        server = PrivateRedis()
        name = f"scale{uuid.uuid4().hex[:6]}"
        url = f"{server.url}?prefix={name}"
    try:
        subprocess.run([durq_cli(), "migrate", "--broker", url], check=True, capture_output=True)

        def snap(worker: int) -> Snapshot:
            if isinstance(server, PrivatePostgres):
                calls, scripts, extra = server.calls(), 0, server.wal()
            else:
                (calls, scripts), extra = server.commands(), {"memory": server.memory()}
            return Snapshot(
                time.monotonic(),
                server.cpu(),
                calls,
                scripts,
                tcp_server_sockets(server.port),
                proc_cpu(worker) if worker else 0.0,
                extra,
            )

        def left() -> int:
            return server.pending(name)

        result: dict[str, Any] = {"broker": kind, "tasks": tasks, "producers": producers}
        if isinstance(server, PrivateRedis):
            result["server"] = f"Redis {server.version}"
        else:
            result["server"] = server.q("SHOW server_version")[0][0]
        # 0. the server alone: its own background work, taken out of every phase below.
        quiet = snap(0)
        time.sleep(idle)
        baseline = delta(quiet, snap(0))
        # 1. the producer: N tasks one by one, from another process, then it waits for us.
        before = snap(0)
        with running(
            [sys.executable, __file__, "produce", url, str(tasks), str(producers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        ) as producer:
            assert producer.stdout is not None and producer.stdin is not None
            line = producer.stdout.readline()
            after = snap(0)
            producer.stdin.close()
        enqueue = minus_idle(delta(before, after), baseline)
        result["enqueue_rate"] = json.loads(line)["rate"]
        result["memory_per_pending_task"] = (
            enqueue.extra["memory"] / tasks if "memory" in enqueue.extra else None
        )
        # 2. one worker process: idle first (queue paused), then it drains the queue.
        subprocess.run(
            [durq_cli(), "queue", "pause", QUEUE, "--broker", url], check=True, capture_output=True
        )
        named = f"{url}&{'application_name' if kind == 'postgresql' else 'client_name'}={WORKER}"
        argv = [
            durq_cli(),
            "worker",
            "scale_model:app",
            "--broker",
            named,
            "--log-level",
            "WARNING",
        ]
        with running(argv) as worker, Peak(server) as connections:
            time.sleep(5.0)  # started, registered, first ticks done
            a = snap(worker.pid)
            time.sleep(idle)
            b = snap(worker.pid)
            idle_cost = delta(a, b)
            connections.idle = connections.count()
            c = snap(worker.pid)  # before: the worker starts the moment the queue unpauses
            subprocess.run(
                [durq_cli(), "queue", "unpause", QUEUE, "--broker", url],
                check=True,
                capture_output=True,
            )
            wait(lambda: left() == 0, 600, "the worker to drain the queue")
            d = snap(worker.pid)
        # The worker's own ticks (heartbeat, maintenance, polls) ran meanwhile: take them out,
        # so "process" is what the tasks cost.
        process = minus_idle(delta(c, d), idle_cost)
        result["worker_tasks_per_cpu_second"] = tasks / process.worker_cpu
        if isinstance(server, PrivatePostgres):
            time.sleep(1.0)
            result["tasks_table"] = server.tasks_table(name)
        result["connections_per_worker_process"] = {
            "idle": connections.idle,
            "peak": connections.peak,
        }
        result["idle_per_worker_second"] = per(minus_idle(idle_cost, baseline), idle_cost.seconds)
        result["enqueue_per_task"] = per(enqueue, tasks)
        result["process_per_task"] = per(process, tasks)
        return result
    finally:
        server.close()


def minus_idle(d: Delta, idle: Delta) -> Delta:
    """``d`` less what ``idle`` costs for as long as ``d`` lasted."""
    k = d.seconds / idle.seconds
    return Delta(
        seconds=d.seconds,
        broker_cpu=d.broker_cpu - k * idle.broker_cpu,
        calls=round(d.calls - k * idle.calls),
        scripts=round(d.scripts - k * idle.scripts),
        bytes=round(d.bytes - k * idle.bytes),
        segments=round(d.segments - k * idle.segments),
        worker_cpu=d.worker_cpu - k * idle.worker_cpu,
        extra={key: v - k * idle.extra.get(key, 0.0) for key, v in d.extra.items()},
    )


def per(d: Delta, n: float) -> dict[str, float]:
    out = {k: v / n for k, v in asdict(d).items() if k not in ("extra", "seconds")}
    out.update({k: v / n for k, v in d.extra.items()})
    out["seconds"] = d.seconds
    return out


def produce(url: str, tasks: int, producers: int) -> None:
    """The producer process: enqueue ``tasks`` one by one from ``producers`` coroutines."""

    async def run() -> float:
        application = App(url)
        application.task("scale:noop", queue=QUEUE, max_retry=0)(noop)
        await application.broker()
        todo = iter(range(tasks))
        start = time.perf_counter()

        async def caller() -> None:
            for _ in todo:
                await application.enqueue("scale:noop", {}, queue=QUEUE)

        await asyncio.gather(*(caller() for _ in range(producers)))
        rate = tasks / (time.perf_counter() - start)
        await asyncio.sleep(0.5)  # the last wake-ups go out
        print(json.dumps({"rate": rate}), flush=True)
        # Stay connected until the parent has counted (a closed socket leaves ss's list).
        await asyncio.to_thread(sys.stdin.read)
        await application.close()
        return rate

    asyncio.run(run())


# -- the model -----------------------------------------------------------------------------

#: The model's assumptions (also in docs/deployment.md).
MACHINE_CORES = 2  # a worker machine: like this one, `durq worker --processes auto`
PG_CORES = 8  # the PostgreSQL server's cores
REDIS_CORES = 1  # Redis runs commands on one thread
TARGET = 0.7  # plan for 70 % of a resource
NETWORK = 1.25e9  # bytes/s: a 10 Gbit/s link to each broker node
PG_MAX_CONNECTIONS = 100  # PostgreSQL's default max_connections


def model(measured: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Throughput and broker load of 10 and 100 worker machines on each setup."""
    from durq.brokers.postgres.storage import DEFAULT_POOL_MAX

    rows = []
    for setup, kind, nodes in (
        ("one PostgreSQL", "postgresql", 1),
        ("one Redis", "redis", 1),
        ("Redis Cluster, 3 masters", "redis", 3),
        ("Redis Cluster, 6 masters", "redis", 6),
    ):
        m = measured.get(kind)
        if m is None:
            continue
        enq, proc, idle = m["enqueue_per_task"], m["process_per_task"], m["idle_per_worker_second"]
        cpu_task = enq["broker_cpu"] + proc["broker_cpu"]
        bytes_task = enq["bytes"] + proc["bytes"]
        for machines in (10, 100):
            processes = machines * MACHINE_CORES
            # What the workers could do if the broker were free: every worker core busy.
            workers = processes / proc["worker_cpu"]
            cores = PG_CORES if kind == "postgresql" else REDIS_CORES * nodes
            # Idle workers cost the broker too (heartbeats, maintenance, bounded waits).
            idle_cpu = processes * idle["broker_cpu"]
            limits = {
                "workers' CPU": workers,
                "broker CPU": max(0.0, cores * TARGET - idle_cpu) / cpu_task,
                "broker network": NETWORK * TARGET * nodes / bytes_task,
            }
            throughput = min(limits.values())
            first = min(limits, key=lambda k: limits[k])
            row: dict[str, Any] = {
                "setup": setup,
                "machines": machines,
                "worker_processes": processes,
                "throughput": throughput,
                "limits": limits,
                "first_bottleneck": first,
                "broker_cpu_cores": idle_cpu + throughput * cpu_task,
                "idle_broker_cpu_cores": idle_cpu,
                "broker_network_bytes": throughput * bytes_task,
                "requests_per_second": throughput * (enq["segments"] + proc["segments"])
                + processes * idle["segments"],
            }
            if kind == "postgresql":
                low = processes * m["connections_per_worker_process"]["idle"]
                high = processes * (DEFAULT_POOL_MAX + 1)  # every pool full, and a listener
                row["connections"] = (low, high)
                if low > PG_MAX_CONNECTIONS:
                    row["first_bottleneck"] = f"connections ({low} idle), then {first}"
                elif high > PG_MAX_CONNECTIONS:
                    row["first_bottleneck"] = f"{first}; connections under load (up to {high})"
                row["wal_bytes_per_second"] = throughput * (enq["wal_bytes"] + proc["wal_bytes"])
                row["wal_syncs_per_second"] = throughput * (enq["wal_syncs"] + proc["wal_syncs"])
            elif nodes > 1:
                row["first_bottleneck"] += " (if the load spreads over queues on every master)"
            rows.append(row)
    return rows


def report(measured: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    for kind, m in measured.items():
        enq, proc, idle = m["enqueue_per_task"], m["process_per_task"], m["idle_per_worker_second"]
        print(
            f"\n{kind} ({m['server']}): {m['tasks']} tasks; enqueue {m['enqueue_rate']:.0f}/s "
            f"({m['producers']} callers); a worker process: {m['worker_tasks_per_cpu_second']:.0f} "
            "tasks per CPU second"
        )
        print(f"{'per task':<24} {'enqueue':>10} {'process':>10} {'idle worker/s':>14}")
        keys = [
            ("broker CPU (µs)", "broker_cpu", 1e6),
            ("statements/commands", "calls", 1),
            ("  of which scripts", "scripts", 1),
            ("request segments", "segments", 1),
            ("bytes on the wire", "bytes", 1),
            ("worker CPU (µs)", "worker_cpu", 1e6),
        ]
        if kind == "postgresql":
            keys += [("WAL bytes", "wal_bytes", 1), ("WAL syncs", "wal_syncs", 1)]
        for label, key, scale in keys:
            print(
                f"{label:<24} {enq.get(key, 0) * scale:>10.1f} {proc.get(key, 0) * scale:>10.1f}"
                f" {idle.get(key, 0) * scale:>14.1f}"
            )
        if m.get("memory_per_pending_task") is not None:
            print(f"memory per pending task: {m['memory_per_pending_task']:.0f} bytes")
        if m.get("tasks_table"):
            print(f"tasks table after the run: {m['tasks_table']}")
    print(
        f"\nmodel: worker machines of {MACHINE_CORES} cores (--processes auto, no-op handlers);"
        f" PostgreSQL on {PG_CORES} cores; Redis one core per master; plan at "
        f"{TARGET:.0%}; {NETWORK * 8 / 1e9:.0f} Gbit/s per broker node"
    )
    print(
        f"{'setup':<26} {'machines':>8} {'tasks/s':>9} {'broker cores':>12} "
        f"{'MB/s':>6} {'req/s':>8}  first bottleneck"
    )
    for r in rows:
        print(
            f"{r['setup']:<26} {r['machines']:>8} {r['throughput']:>9,.0f} "
            f"{r['broker_cpu_cores']:>12.2f} {r['broker_network_bytes'] / 1e6:>6.1f} "
            f"{r['requests_per_second']:>8,.0f}  {r['first_bottleneck']}"
        )
    for r in rows:
        extra = [f"idle workers use {r['idle_broker_cpu_cores']:.2f} broker cores"]
        if "connections" in r:
            extra.append("connections {}-{}".format(*r["connections"]))
            extra.append(f"WAL {r['wal_bytes_per_second'] / 1e6:.1f} MB/s")
            extra.append(f"{r['wal_syncs_per_second']:,.0f} WAL syncs/s")
        print(f"  {r['setup']}, {r['machines']} machines: " + ", ".join(extra))
    print(
        "  A queue lives on one Redis Cluster master (its keys share one slot): one busy queue "
        "gets one master's throughput, as on one Redis."
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "produce":
        produce(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--producers", type=int, default=10)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--only", choices=["postgresql", "redis"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--from-json", help="model a run saved with --json instead of measuring")
    args = parser.parse_args()
    if args.from_json:
        measured = json.loads(Path(args.from_json).read_text())["measured"]
    else:
        kinds = [args.only] if args.only else ["postgresql", "redis"]
        measured = {k: measure(k, args.tasks, args.producers, args.idle) for k in kinds}
    rows = model(measured)
    if args.json:
        print(json.dumps({"measured": measured, "model": rows}, indent=2))
    else:
        report(measured, rows)


if __name__ == "__main__":
    main()
