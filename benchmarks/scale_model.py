"""A scale model on paper, from per-task costs measured on this machine.

Measures, on a private PostgreSQL cluster (``initdb`` in a temporary directory, with
``pg_stat_statements``), a private ``redis-server`` and a private Redis Cluster (3 masters,
3 replicas, the test suite's) — so no other client adds noise — what one task costs the
broker, with the real CLI: a ``durq worker`` process (``--processes 1``, the default
concurrency) drains N no-op tasks that a producer process enqueued one by one
(``app.enqueue``, ``--producers`` concurrent callers, as a web app does); on the cluster the
tasks are spread over one queue per master.

* broker CPU per task: PostgreSQL, the CPU time of every process of the cluster (the
  backends, the WAL writer, autovacuum…, from ``/proc/<pid>/stat``; the monitoring backend
  excluded); Redis, ``INFO cpu`` (``used_cpu_sys + used_cpu_user``), summed over the masters
  of a cluster (the replicas' shown apart);
* statements per task (``pg_stat_statements`` calls) or commands per task (``INFO
  commandstats``; commands run inside scripts are counted by Redis too, so script calls are
  shown apart), and request segments per task (TCP data segments the server received, from
  ``ss -ti``: a pipelined batch is one);
* bytes per task on the wire, both directions (``ss -ti`` bytes of the server's sockets; on a
  cluster this includes the replication stream to the replicas);
* worker CPU per task (``/proc/<pid>/stat`` of the worker process);
* the idle cost of one worker process per second (heartbeat, maintenance, polling), and the
  server's own background work, which is taken out of every figure;
* PostgreSQL: WAL bytes and dead tuples per task (``pg_stat_wal``, ``pg_stat_user_tables``);
  Redis: memory per pending task (``INFO memory``, ``used_memory_dataset``).

The monitor is left out: a Unix socket (PostgreSQL, Redis) or connections skipped by address
(cluster), tagged statements, its commands not counted. Then the model (assumptions in
docs/deployment.md, and printed) estimates the throughput and broker load of 10 and 100
worker machines on one PostgreSQL, one Redis and a 3- and 6-master Redis Cluster, and names
the first bottleneck of each.

    .venv/bin/python benchmarks/scale_model.py [--tasks 3000] [--producers 10] [--idle 10]
        [--only postgresql|redis|redis-cluster] [--json] [--from-json saved.json]
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
KINDS = ("postgresql", "redis", "redis-cluster")
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


def tcp_server_sockets(
    ports: list[int], skip: frozenset[str] = frozenset()
) -> dict[str, tuple[int, int, int]]:
    """The server side of each TCP connection to ``ports``: bytes in, bytes out, data
    segments in (requests; a pipelined batch counts once). ``skip``: client addresses left
    out (the monitor's)."""
    match = " or ".join(f"sport = :{port}" for port in ports)
    text = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( {match} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    out: dict[str, tuple[int, int, int]] = {}
    key = ""
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            parts = line.split()
            key = "" if parts[-1] in skip else f"{parts[-2]}>{parts[-1]}"
            continue
        if not key:
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


#: Commands only the monitor sends; left out of durq's counts.
MONITOR_COMMANDS = ("cmdstat_info", "cmdstat_zcard", "cmdstat_ping", "cmdstat_client")
SCRIPT_COMMANDS = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall")


class RedisNodes:
    """What the model reads from Redis servers, summed over ``self.masters`` (clients)."""

    masters: list[Any]
    replicas: list[Any]
    ports: list[int]
    skip: frozenset[str] = frozenset()
    url = ""
    version = ""

    @staticmethod
    def _cpu(client: Any) -> float:
        info = client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def cpu(self) -> float:
        return sum(self._cpu(c) for c in self.masters)

    def replica_cpu(self) -> float:
        return sum(self._cpu(c) for c in self.replicas)

    def commands(self) -> tuple[int, int]:
        """Commands durq sent (the monitor's own left out) and script calls among them."""
        calls = scripts = 0
        for client in self.masters:
            stats = client.info("commandstats")
            calls += sum(
                int(v["calls"]) for k, v in stats.items() if not k.startswith(MONITOR_COMMANDS)
            )
            scripts += sum(int(stats.get(k, {}).get("calls", 0)) for k in SCRIPT_COMMANDS)
        return calls, scripts

    def memory(self) -> float:
        return sum(float(c.info("memory")["used_memory_dataset"]) for c in self.masters)

    def client_for(self, key: str) -> Any:
        return self.masters[0]

    def pending(self, prefix: str, queues: list[str]) -> int:
        return sum(
            int(self.client_for(f"{{{q}}}").zcard(f"{prefix}:{{{q}}}:{state}"))
            for q in queues
            for state in ("pending", "active", "scheduled", "retry")
        )

    def connections(self, name: str) -> int:
        return sum(1 for c in self.masters for x in c.client_list() if x["name"] == name)


class PrivateRedis(RedisNodes):
    """A throw-away redis-server (no persistence); TCP for durq, a Unix socket for us."""

    def __init__(self) -> None:
        import redis

        self.base = Path(tempfile.mkdtemp(prefix="durq-scale-redis-"))
        self.port = free_port()
        sock = self.base / "redis.sock"
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--unixsocket", str(sock), "--dir", str(self.base)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
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
        self.masters, self.replicas, self.ports = [self.client], [], [self.port]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.version = f"Redis {self.client.info('server')['redis_version']}"

    def close(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)


class PrivateCluster(RedisNodes):
    """The test suite's throw-away Redis Cluster: 3 masters, 3 replicas, asynchronous
    replication. The monitor talks TCP to each node; its connections are left out of the
    byte counts by address."""

    def __init__(self) -> None:
        import redis

        sys.path.insert(0, str(HERE.parent / "tests"))
        from servers import RedisCluster  # the suite's cluster, as benchmarks/redis_cluster.py

        self.base = Path(tempfile.mkdtemp(prefix="durq-scale-cluster-"))
        self.cluster = RedisCluster(self.base)
        self.slots = self.cluster.masters()
        master_ports = sorted(self.slots)
        self.by_port = {p: redis.Redis(port=p, socket_timeout=10) for p in self.cluster.ports}
        self.masters = [self.by_port[p] for p in master_ports]
        self.replicas = [c for p, c in self.by_port.items() if p not in self.slots]
        self.ports = master_ports
        self.skip = frozenset(str(c.client_info()["addr"]) for c in self.by_port.values())
        self.url = self.cluster.url()
        info = self.masters[0].info("server")
        self.version = f"Redis {info['redis_version']} Cluster, {len(master_ports)} masters"

    def client_for(self, key: str) -> Any:
        from durq.brokers.redis.cluster import key_slot

        slot = key_slot(key)
        port = next(p for p, r in self.slots.items() if any(a <= slot <= b for a, b in r))
        return self.by_port[port]

    def queue_names(self, count: int) -> list[str]:
        """``count`` queue names spread evenly over the masters."""
        on: dict[int, list[str]] = {p: [] for p in self.slots}
        i = 0
        while sum(map(len, on.values())) < count:
            name, i = f"scale{i}", i + 1
            port = next(p for p, c in self.by_port.items() if c is self.client_for(f"{{{name}}}"))
            if len(on[port]) < -(-count // len(on)):
                on[port].append(name)
        return sorted(n for names in on.values() for n in names)

    def close(self) -> None:
        self.cluster.close()
        shutil.rmtree(self.base, ignore_errors=True)


Server = PrivatePostgres | PrivateRedis | PrivateCluster


class Peak:
    """The worker process's server connections: sampled every 0.1 s on PostgreSQL (the
    monitor's backend is not in the CPU figures there); read once at the end on Redis, where
    every read would add to the server's CPU (and the count does not move with load)."""

    def __init__(self, server: Server) -> None:
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
        return self.server.connections(WORKER)

    def _run(self) -> None:
        while isinstance(self.server, PrivatePostgres) and not self._stop.wait(0.1):
            self.peak = max(self.peak, self.count())

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.count())


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
    server: Server
    queues = [QUEUE]
    if kind == "postgresql":
        server = PrivatePostgres()
        server.open()
        name = "durq"
        url = f"{server.url}?schema={name}"
    else:
        server = PrivateRedis() if kind == "redis" else PrivateCluster()
        if isinstance(server, PrivateCluster):
            queues = server.queue_names(len(server.ports))  # one queue per master
        name = f"scale{uuid.uuid4().hex[:6]}"
        url = f"{server.url}?prefix={name}"
    try:
        subprocess.run([durq_cli(), "migrate", "--broker", url], check=True, capture_output=True)

        def snap(worker: int) -> Snapshot:
            if isinstance(server, PrivatePostgres):
                calls, scripts, extra = server.calls(), 0, server.wal()
                sockets = tcp_server_sockets([server.port])
            else:
                (calls, scripts) = server.commands()
                extra = {"memory": server.memory(), "replica_cpu": server.replica_cpu()}
                sockets = tcp_server_sockets(server.ports, server.skip)
            return Snapshot(
                time.monotonic(),
                server.cpu(),
                calls,
                scripts,
                sockets,
                proc_cpu(worker) if worker else 0.0,
                extra,
            )

        def left() -> int:
            if isinstance(server, PrivatePostgres):
                return server.pending(name)
            return server.pending(name, queues)

        result: dict[str, Any] = {"broker": kind, "tasks": tasks, "producers": producers}
        result["queues"] = len(queues)
        if isinstance(server, PrivatePostgres):
            result["server"] = "PostgreSQL " + server.q("SHOW server_version")[0][0].split()[0]
        else:
            result["server"] = server.version
        # 0. the server alone: its own background work, taken out of every phase below.
        quiet = snap(0)
        time.sleep(idle)
        baseline = delta(quiet, snap(0))
        # 1. the producer: N tasks one by one, from another process, then it waits for us.
        before = snap(0)
        with running(
            [sys.executable, __file__, "produce", url, str(tasks), str(producers), *queues],
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
        for queue in queues:
            subprocess.run(
                [durq_cli(), "queue", "pause", queue, "--broker", url],
                check=True,
                capture_output=True,
            )
        named = f"{url}&{'application_name' if kind == 'postgresql' else 'client_name'}={WORKER}"
        argv = [durq_cli(), "worker", "scale_model:app", "--broker", named, "--log-level"]
        argv += ["WARNING", "--queues", ",".join(queues)]
        with running(argv) as worker, Peak(server) as connections:
            time.sleep(5.0)  # started, registered, first ticks done
            a = snap(worker.pid)
            time.sleep(idle)
            b = snap(worker.pid)
            idle_cost = delta(a, b)
            connections.idle = connections.count()
            c = snap(worker.pid)  # before: the worker starts the moment the queue unpauses
            for queue in queues:
                subprocess.run(
                    [durq_cli(), "queue", "unpause", queue, "--broker", url],
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


def produce(url: str, tasks: int, producers: int, queues: list[str]) -> None:
    """The producer process: enqueue ``tasks`` one by one from ``producers`` coroutines,
    round robin over ``queues``."""

    async def run() -> float:
        application = App(url)
        application.task("scale:noop", queue=QUEUE, max_retry=0)(noop)
        await application.broker()
        todo = iter(range(tasks))
        start = time.perf_counter()

        async def caller() -> None:
            for i in todo:
                await application.enqueue("scale:noop", {}, queue=queues[i % len(queues)])

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
        # A cluster's per-task cost is the one measured on 3 masters (summed over them), for 6
        # masters too; without that run, one Redis's.
        if nodes > 1 and "redis-cluster" in measured:
            kind = "redis-cluster"
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
                "measured_on": m["server"],
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
            f"\n{kind} ({m['server']}, {m.get('queues', 1)} queue(s)): {m['tasks']} tasks; enqueue {m['enqueue_rate']:.0f}/s "
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
        if kind == "redis-cluster":
            keys.append(("replicas' CPU (µs)", "replica_cpu", 1e6))
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
        produce(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--producers", type=int, default=10)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--only", choices=KINDS)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--from-json", help="model a run saved with --json instead of measuring")
    args = parser.parse_args()
    if args.from_json:
        measured = json.loads(Path(args.from_json).read_text())["measured"]
    else:
        kinds = [args.only] if args.only else list(KINDS)
        measured = {k: measure(k, args.tasks, args.producers, args.idle) for k in kinds}
    rows = model(measured)
    if args.json:
        print(json.dumps({"measured": measured, "model": rows}, indent=2))
    else:
        report(measured, rows)


if __name__ == "__main__":
    main()
