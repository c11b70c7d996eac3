"""Load test of the main job (``make loadtest``): a burst of orders against the reference
service, the way web traffic arrives.

For each broker (SQLite, PostgreSQL, Redis) and each mode, the service runs in its own
processes and a real HTTP client sends N ``POST /orders`` with distinct Idempotency-Keys and
bodies at concurrency C, then polls ``GET /orders/{id}`` until every order is final:

* ``split``: the API (uvicorn, ``INSURANCE_MONOLITH=0``) and a worker
  (``python -m examples.insurance.worker``) in two processes, the partner simulator in a third;
* ``monolith``: ``durq demo`` (API, worker and partner simulator in one process).

The burst client is ``wrk`` (C, Debian's package; ``make loadtest`` installs it when it is
missing) driven by ``loadtest.lua``: it costs a fraction of a millisecond of CPU per request,
so the machine's cores go to the service. Without ``wrk`` the burst falls back to httpx
(async, in this process; 6-10 ms of CPU per request, as much as the service itself), and the
results say so. Polling and the checks are Python (httpx) in both cases.

Reported per run: orders/s of the burst, 202 latency p50/p95/p99, errors by class (HTTP
status or transport error), seconds until every order was final, and the exactly-once check:
every order COVERED or FAILED, its coverage task completed or archived accordingly, one
coverage request per order at the partner and one distinct policy per COVERED order.

Storage is isolated per run: a temporary SQLite file, a fresh PostgreSQL schema
(``DURQ_LOADTEST_PG``, default ``postgresql://postgres@127.0.0.1:5432/test``) or a Redis key
prefix (``DURQ_LOADTEST_REDIS``, default ``redis://127.0.0.1:6379/0``), removed afterwards.

    python benchmarks/loadtest.py -n 1000 -c 50 --brokers sqlite,postgresql,redis \\
        --modes split,monolith --markdown docs-table.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Where the PostgreSQL and Redis runs keep their schemas and key prefixes (``--pg``,
#: ``--redis``, or these variables).
PG_DSN = os.environ.get("DURQ_LOADTEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("DURQ_LOADTEST_REDIS", "redis://127.0.0.1:6379/0")
BROKERS = ("sqlite", "postgresql", "redis")
MODES = ("split", "monolith")
TOKEN = "loadtest-token"
ITEMS = {"items": [{"sku": "A-1", "qty": 2}]}
#: The partner simulator of every run: answers at once, "pending" once, then confirmed.
SIM_CONFIG = {"latency": 0.0, "pending_polls": 1}

console = Console(stderr=True)


# -- the service under test --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Storage:
    """Where one run keeps its tasks and orders, and how to remove them."""

    broker: str
    broker_url: str
    env: dict[str, str]
    cleanup: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def fresh(cls, broker: str, directory: Path) -> Storage:
        tag = secrets.token_hex(4)
        if broker == "sqlite":
            url = f"sqlite:///{directory / 'durq.sqlite3'}"
            return cls(broker, url, {})
        if broker == "postgresql":
            schema, orders = f"durq_load_{tag}", f"orders_load_{tag}"
            url = f"{PG_DSN}?schema={schema}"
            env = {"INSURANCE_DATABASE_SCHEMA": orders}
            return cls(broker, url, env, [("pg", schema), ("pg", orders)])
        prefix = f"durqload{tag}"
        url = f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={prefix}"
        env = {"INSURANCE_DATABASE_URL": f"sqlite:///{directory / 'orders.sqlite3'}"}
        return cls(broker, url, env, [("redis", prefix)])

    def drop(self) -> None:
        for kind, name in self.cleanup:
            if kind == "pg":
                import psycopg
                from psycopg import sql

                with psycopg.connect(PG_DSN, autocommit=True) as conn:
                    drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                    conn.execute(drop.format(sql.Identifier(name)))
            else:
                import redis

                client = redis.Redis.from_url(REDIS_URL)
                try:
                    for keys in _chunks(list(client.scan_iter(match=f"{name}:*", count=1000))):
                        client.delete(*keys)
                finally:
                    client.close()


def _chunks(items: list[Any], size: int = 500) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class Service:
    """The reference service in its own processes; ``url`` of the API, ``sim_url`` of the
    partner simulator."""

    def __init__(
        self,
        mode: str,
        storage: Storage,
        directory: Path,
        concurrency: int,
        api_processes: int = 1,
    ) -> None:
        self.mode = mode
        self.api_processes = api_processes
        self.storage = storage
        self.directory = directory
        self.procs: list[subprocess.Popen[bytes]] = []
        #: pid of each process by role (api, worker, sim; demo is all three).
        self.roles: dict[str, int] = {}
        self.api_pid = 0
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DURQ_BROKER_URL": storage.broker_url,
            "INSURANCE_TOKENS": f"{TOKEN}=loadtest",
            "INSURANCE_CONCURRENCY": str(concurrency),
            **storage.env,
        }
        self.url = ""
        self.sim_url = ""
        self.token = TOKEN

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        with open(self.directory / f"{name}.log", "wb") as log:  # the child keeps its copy
            proc = subprocess.Popen(
                command, cwd=self.directory, env=self.env, stdout=log, stderr=log
            )
        self.procs.append(proc)
        self.roles[name] = proc.pid
        return proc

    def start(self) -> None:
        if self.mode == "monolith":
            self._start_demo()
        else:
            self._start_split()
        wait_http(f"{self.url}/health", procs=self.procs)
        httpx.put(f"{self.sim_url}/_sim/config", json=SIM_CONFIG).raise_for_status()

    def _start_demo(self) -> None:
        port = free_port()
        durq = str(Path(sys.executable).with_name("durq"))
        proc = self._spawn(
            "demo", [durq, "demo", "--broker", self.storage.broker_url, "--port", str(port)]
        )
        self.api_pid = proc.pid
        banner = wait_file(self.directory / "demo.log", re.compile(rb"^Ctrl-C", re.M), proc)
        self.url = f"http://127.0.0.1:{port}"
        self.sim_url = _group(rb"^partner simulator: (\S+)", banner)
        self.token = _group(rb"^token: (\S+)", banner)

    def _start_split(self) -> None:
        sim_port, api_port = free_port(), free_port()
        self.sim_url = f"http://127.0.0.1:{sim_port}"
        self.url = f"http://127.0.0.1:{api_port}"
        self.env["INSURANCE_PARTNER_URL"] = self.sim_url
        self.env["INSURANCE_MONOLITH"] = "0"
        uvicorn = [sys.executable, "-m", "uvicorn", "--factory", "--no-access-log"]
        uvicorn += ["--log-level", "warning", "--host", "127.0.0.1"]
        self._spawn(
            "sim", [*uvicorn, "--port", str(sim_port), "examples.insurance.partner_sim:create_app"]
        )
        wait_http(f"{self.sim_url}/openapi.json", procs=self.procs)
        subprocess.run(
            [
                str(Path(sys.executable).with_name("durq")),
                "migrate",
                "--broker",
                self.storage.broker_url,
            ],
            check=True,
            env=self.env,
            capture_output=True,
        )
        processes = ["--workers", str(self.api_processes)] if self.api_processes > 1 else []
        api = self._spawn(
            "api",
            [*uvicorn, *processes, "--port", str(api_port), "examples.insurance.api:create_app"],
        )
        self.api_pid = api.pid
        self._spawn("worker", [sys.executable, "-m", "examples.insurance.worker"])

    def sim_stats(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.sim_url}/_sim/stats").json())

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if self.mode == "monolith" else signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _group(pattern: bytes, text: bytes) -> str:
    match = re.search(pattern, text, re.M)
    if match is None:
        raise RuntimeError(f"{pattern!r} not found in the demo's banner")
    return match.group(1).decode()


def wait_http(url: str, *, procs: list[subprocess.Popen[bytes]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a process of the service exited while starting ({url})")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer 200 within {timeout}s")


def wait_file(path: Path, pattern: re.Pattern[bytes], proc: subprocess.Popen[bytes]) -> bytes:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = path.read_bytes() if path.exists() else b""
        if pattern.search(text):
            return text
        if proc.poll() is not None:
            raise RuntimeError(f"the demo exited: {text.decode(errors='replace')[-2000:]}")
        time.sleep(0.1)
    raise TimeoutError(f"no banner in {path}")


# -- the client ----------------------------------------------------------------------------------


@dataclass
class Result:
    broker: str
    mode: str
    orders: int
    concurrency: int
    #: The burst client: "wrk", or "httpx" when wrk is not installed; "open loop R/s".
    client: str = ""
    #: The offered rate of the open-loop client (orders/s); ``None``: as fast as answered.
    rate: float | None = None
    seconds: float = 0.0
    orders_per_s: float = 0.0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    #: CPU milliseconds per order during the burst, by process (and the HTTP client).
    cpu_ms: dict[str, float] = field(default_factory=dict)
    #: CPU milliseconds per order of the worker (the demo in monolith mode) from the start of
    #: the burst until every order was final: what one order costs it in all.
    worker_cpu_ms: float = 0.0
    #: The API process during the burst: % of the time on a CPU, % waiting runnable for one
    #: (a starved process waits; a busy event loop runs).
    api_sched: tuple[int, int] = (0, 0)
    final_after_s: float | None = None
    covered: int = 0
    failed: int = 0
    check: str = ""


def cpu_seconds(service: Service, client: int | None = None) -> dict[str, float]:
    """CPU time (user + system) used so far by each process of the service and by the client
    (the ``client`` process, else this one)."""
    used = {"client": time.process_time() if client is None else process_cpu(client)}
    for role, pid in service.roles.items():
        used[role] = process_cpu(pid)
    return used


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a running process and its running children (uvicorn's
    ``--workers``), 0 once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return own + sum(process_cpu(child) for child in children(pid))


def children(pid: int) -> list[int]:
    """The pids of a process's children (from every thread's ``children`` list)."""
    found: list[int] = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(c) for c in listing.read_text().split()]
        except OSError:
            continue
    return found


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def burst(service: Service, result: Result, progress: Progress) -> dict[str, str]:
    """POST the orders (at ``result.rate``, else as fast as wrk or httpx go); returns
    order_id -> Location of the accepted ones."""
    before, started = scheduled(service.api_pid), time.perf_counter()
    if result.rate:
        result.client = f"open loop {result.rate:g}/s"
        accepted = await open_loop_burst(service, result, progress)
    elif (wrk := shutil.which("wrk")) is not None and result.client != "httpx":
        result.client = "wrk"
        accepted = await wrk_burst(wrk, service, result, progress)
    else:
        result.client = "httpx"
        accepted = await httpx_burst(service, result, progress)
    after, elapsed = scheduled(service.api_pid), time.perf_counter() - started
    ran, waited = ((b - a) / 1e9 / elapsed for a, b in zip(before, after, strict=True))
    result.api_sched = (round(100 * ran), round(100 * waited))
    return accepted


def scheduled(pid: int) -> tuple[int, int]:
    """Nanoseconds a process (every thread, and its children) has run on a CPU, and waited
    runnable for one (``/proc/<pid>/task/*/schedstat``; zeros where not available)."""
    ran = waited = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            fields = stat.read_text().split()
        except OSError:
            continue
        ran, waited = ran + int(fields[0]), waited + int(fields[1])
    for child in children(pid):
        more = scheduled(child)
        ran, waited = ran + more[0], waited + more[1]
    return ran, waited


#: wrk's threads: one is enough for thousands of requests per second, and leaves the cores
#: to the service.
WRK_THREADS = 1


async def wrk_burst(
    wrk: str, service: Service, result: Result, progress: Progress
) -> dict[str, str]:
    """The burst from wrk (``loadtest.lua``): one line per answer on its stderr, the latency
    percentiles and socket errors on its stdout once it is stopped (SIGINT)."""
    n, c = result.orders, result.concurrency
    threads = max(1, min(WRK_THREADS, c))
    task = progress.add_task(f"{result.broker}/{result.mode}: POST /orders (wrk)", total=n)
    env = {
        **os.environ,
        "LOADTEST_ORDERS": str(n),
        "LOADTEST_THREADS": str(threads),
        "LOADTEST_RUN": f"lt-{secrets.token_hex(3)}",
        "LOADTEST_TOKEN": service.token,
    }
    command = [wrk, "-t", str(threads), "-c", str(c), "-d", "3600s", "--timeout", "60s"]
    command += ["-s", str(HERE / "loadtest.lua"), service.url]
    errors: Counter[str] = Counter()
    accepted: dict[str, str] = {}
    cpu_before = cpu_seconds(service)
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    cpu_before["client"] = 0.0
    finished = 0
    # A request lost with its connection is never answered: stop when nothing moves for a while.
    stall = 60.0
    while finished < threads:
        try:
            line = await asyncio.wait_for(proc.stderr.readline(), stall)
        except TimeoutError:
            break
        if not line:
            break
        kind, _, rest = line.decode().strip().partition(" ")
        if kind == "R":
            status, _, order_id = rest.partition(" ")
            if status == "202" and order_id.startswith("ord_"):
                accepted[order_id] = f"/orders/{order_id}"
            else:
                errors[f"HTTP {status}"] += 1
            progress.advance(task)
        elif kind == "D":
            finished += 1
    result.seconds = time.perf_counter() - started
    cpu_after = cpu_seconds(service, proc.pid)
    if proc.returncode is None:
        proc.send_signal(signal.SIGINT)
    out, rest = await proc.communicate()
    for line in out.decode().splitlines():
        kind, *values = line.split()
        if kind == "L":
            result.p50_ms, result.p95_ms, result.p99_ms = (int(v) / 1000 for v in values[:3])
        elif kind == "E":
            for name, count in zip(("connect", "read", "write", "timeout"), values, strict=True):
                if int(count):
                    errors[f"wrk {name} error"] += int(count)
    if finished < threads and not errors:
        errors["wrk stopped early"] += 1
        console.print(f"[dim]wrk:[/] {(out + rest).decode(errors='replace')[-1500:]}")
    result.cpu_ms = {
        role: round((cpu_after[role] - cpu_before[role]) * 1000 / n, 2) for role in cpu_before
    }
    result.orders_per_s = n / result.seconds
    result.errors = dict(errors)
    return accepted


async def open_loop_burst(service: Service, result: Result, progress: Progress) -> dict[str, str]:
    """The orders at a fixed offered rate, whatever the answers' pace (an open loop, as
    independent users arrive): order i is due at ``i / rate`` s and goes out on the first
    free one of C keep-alive connections, so at most C are in flight. Its latency counts
    from when it was due, so time spent waiting for a free connection, when the service
    falls behind, is counted (no coordinated omission). Raw HTTP/1.1 on asyncio streams:
    about a tenth of httpx's CPU per request."""
    n, c, rate = result.orders, result.concurrency, float(result.rate or 0)
    task = progress.add_task(f"{result.broker}/{result.mode}: POST /orders at {rate:g}/s", total=n)
    parts = urlsplit(service.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    run = f"lt-{secrets.token_hex(3)}"
    head = (
        f"POST /orders HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {service.token}\r\nContent-Type: application/json\r\n"
    )
    errors: Counter[str] = Counter()
    accepted: dict[str, str] = {}
    latencies: list[float] = []
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(c):
        idle.put_nowait(Connection(host, port))
    pending: set[asyncio.Task[None]] = set()

    async def send(i: int, due: float) -> None:
        body = ORDER_BODY % (i % 97, i % 9 + 1)
        request = (
            f"{head}Idempotency-Key: {run}-{i}\r\nContent-Length: {len(body)}\r\n\r\n{body}"
        ).encode()
        conn = await idle.get()
        try:
            status, answer = await conn.exchange(request)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            errors[type(exc).__name__] += 1
            conn.close()
        else:
            match = ORDER_ID.search(answer)
            if status == 202 and match is not None:
                latencies.append(time.perf_counter() - due)
                order_id = match.group(1).decode()
                accepted[order_id] = f"/orders/{order_id}"
            else:
                errors[f"HTTP {status}"] += 1
        finally:
            idle.put_nowait(conn)
            progress.advance(task)

    cpu_before = cpu_seconds(service)
    started = time.perf_counter()
    for i in range(n):
        due = started + i / rate
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        job = asyncio.create_task(send(i, due))
        pending.add(job)
        job.add_done_callback(pending.discard)
    while pending:
        await asyncio.gather(*pending)
    result.seconds = time.perf_counter() - started
    cpu_after = cpu_seconds(service)
    while not idle.empty():
        idle.get_nowait().close()
    record(result, cpu_before, cpu_after, latencies, errors)
    return accepted


def record(
    result: Result,
    cpu_before: dict[str, float],
    cpu_after: dict[str, float],
    latencies: list[float],
    errors: Counter[str],
) -> None:
    """The figures of a burst measured in this process (``result.seconds`` is set)."""
    n = result.orders
    result.cpu_ms = {
        role: round((cpu_after[role] - cpu_before[role]) * 1000 / n, 2) for role in cpu_before
    }
    result.orders_per_s = n / result.seconds
    result.p50_ms, result.p95_ms, result.p99_ms = (
        percentile(latencies, q) * 1000 for q in (50, 95, 99)
    )
    result.errors = dict(errors)


#: The order bodies of the open-loop client, as ``loadtest.lua`` makes them (quantities
#: within the simulated warehouses' stock).
ORDER_BODY = '{"items":[{"sku":"A-%d","qty":%d}]}'
ORDER_ID = re.compile(rb'"order_id":"(ord_[0-9a-f]+)"')


class Connection:
    """One keep-alive HTTP/1.1 connection of the open-loop client, (re)opened on use."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        """Send ``request``; the answer's status and body."""
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"connection" and value.strip().lower() == b"close":
                self.writer.close()  # after this answer; reopened on the next use
        body = await self.reader.readexactly(length)
        if self.writer.is_closing():
            self.reader = self.writer = None
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def httpx_burst(service: Service, result: Result, progress: Progress) -> dict[str, str]:
    """The burst from httpx in this process (when wrk is not installed)."""
    n, c = result.orders, result.concurrency
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    accepted: dict[str, str] = {}
    task = progress.add_task(f"{result.broker}/{result.mode}: POST /orders", total=n)
    keys: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        keys.put_nowait(i)
    run = secrets.token_hex(3)
    headers = {"Authorization": f"Bearer {service.token}"}
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    async with httpx.AsyncClient(
        base_url=service.url, headers=headers, limits=limits, timeout=30
    ) as client:

        async def sender() -> None:
            while not keys.empty():
                i = keys.get_nowait()
                started = time.perf_counter()
                try:
                    r = await client.post(
                        "/orders", json=ITEMS, headers={"Idempotency-Key": f"lt-{run}-{i}"}
                    )
                except httpx.TransportError as exc:
                    errors[type(exc).__name__] += 1
                else:
                    if r.status_code == 202:
                        latencies.append(time.perf_counter() - started)
                        accepted[r.json()["order_id"]] = r.headers["Location"]
                    else:
                        errors[f"HTTP {r.status_code}"] += 1
                progress.advance(task)

        cpu_before = cpu_seconds(service)
        started = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(c)))
        result.seconds = time.perf_counter() - started
        cpu_after = cpu_seconds(service)
    record(result, cpu_before, cpu_after, latencies, errors)
    return accepted


async def until_final(
    service: Service,
    result: Result,
    accepted: dict[str, str],
    started: float,
    progress: Progress,
    timeout: float,
) -> dict[str, dict[str, Any]]:
    """Poll the orders until every one is COVERED or FAILED (or ``timeout``)."""
    final: dict[str, dict[str, Any]] = {}
    task = progress.add_task(f"{result.broker}/{result.mode}: orders final", total=len(accepted))
    gate = asyncio.Semaphore(result.concurrency)
    headers = {"Authorization": f"Bearer {service.token}"}
    async with httpx.AsyncClient(base_url=service.url, headers=headers, timeout=30) as client:

        async def look(order_id: str, location: str) -> None:
            async with gate:
                try:
                    r = await client.get(location)
                except httpx.TransportError:
                    return
            if r.status_code == 200 and r.json()["status"] in ("COVERED", "FAILED"):
                final[order_id] = r.json()
                progress.advance(task)

        deadline = time.monotonic() + timeout
        while len(final) < len(accepted) and time.monotonic() < deadline:
            await asyncio.gather(*(look(o, loc) for o, loc in accepted.items() if o not in final))
            if len(final) < len(accepted):
                await asyncio.sleep(0.5)
    if len(final) == len(accepted):
        result.final_after_s = time.perf_counter() - started
    return final


async def check_once(
    service: Service, result: Result, accepted: dict[str, str], final: dict[str, dict[str, Any]]
) -> None:
    """Every order final exactly once: its task in the matching end state, one coverage
    request per order at the partner, one distinct policy per COVERED order."""
    import durq

    problems: list[str] = []
    result.covered = sum(o["status"] == "COVERED" for o in final.values())
    result.failed = sum(o["status"] == "FAILED" for o in final.values())
    if len(final) < len(accepted):
        problems.append(f"{len(accepted) - len(final)} not final")
    policies = [o["policy_number"] for o in final.values() if o["status"] == "COVERED"]
    if len(set(policies)) != len(policies) or None in policies:
        problems.append("policies not one per COVERED order")
    want = {"COVERED": "completed", "FAILED": "archived"}
    app = durq.App(service.storage.broker_url)
    try:
        gate = asyncio.Semaphore(20)

        async def state(order: dict[str, Any]) -> str:
            async with gate:
                info = await app.inspector.get_task_info("insurance", order["task_id"])
                return info.state.value

        states = await asyncio.gather(*(state(o) for o in final.values()))
    finally:
        await app.close()
    wrong = sum(want[o["status"]] != s for o, s in zip(final.values(), states, strict=True))
    if wrong:
        problems.append(f"{wrong} tasks not in their order's end state")
    requests = service.sim_stats()["requests"]
    if requests != len(accepted):
        problems.append(f"{requests} coverage requests for {len(accepted)} orders")
    result.check = "ok" if not problems else "; ".join(problems)


def client_loop() -> Any:
    """uvloop's event loop for the clients when it is installed (a third of asyncio's CPU
    per request), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_one(broker: str, mode: str, args: argparse.Namespace) -> Result:
    result = Result(broker, mode, args.orders, args.concurrency, rate=args.rate)
    if args.client == "httpx":
        result.client = "httpx"
    with tempfile.TemporaryDirectory(prefix=f"durq-load-{broker}-{mode}-") as tmp:
        directory = Path(tmp)
        storage = Storage.fresh(broker, directory)
        service = Service(mode, storage, directory, args.worker_concurrency, args.api_processes)
        try:
            service.start()
            profilers = {
                role: start_profiler(pid, directory / f"{role}.profile", args)
                for role, pid in service.roles.items()
                if args.profile and role in ("api", "worker", "demo")
            }
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress:

                async def drive() -> None:
                    started = time.perf_counter()
                    worker = service.roles.get("worker", service.api_pid)
                    cpu_before = process_cpu(worker)
                    accepted = await burst(service, result, progress)
                    for role, profiler in profilers.items():
                        stop_profiler(profiler, f"{broker}-{mode}-{role}", args)
                    final = await until_final(
                        service, result, accepted, started, progress, args.final_timeout
                    )
                    spent = process_cpu(worker) - cpu_before
                    result.worker_cpu_ms = round(spent * 1000 / max(1, len(accepted)), 2)
                    await check_once(service, result, accepted, final)

                with asyncio.Runner(loop_factory=client_loop()) as runner:
                    runner.run(drive())
        except Exception as exc:
            result.check = f"run failed: {exc}"
            for log in sorted(directory.glob("*.log")):
                console.print(f"[dim]{log.name}:[/] {log.read_text(errors='replace')[-1500:]}")
        finally:
            service.stop()
            storage.drop()
            if result.errors:  # what the service said about them
                for log in sorted(directory.glob("*.log")):
                    for line in problem_lines(log):
                        console.print(f"[dim]{log.name}:[/] {line}")
    return result


def problem_lines(log: Path, limit: int = 40) -> list[str]:
    """The ERROR and traceback lines of a service log."""
    marks = ("ERROR", "Traceback", "Error:", "Exception", "Invalid HTTP")
    lines = log.read_text(errors="replace").splitlines()
    return [line for line in lines if any(m in line for m in marks)][:limit]


# -- profiling (py-spy) -----------------------------------------------------------------------

#: py-spy as installed into this virtual environment (``pip install py-spy``).
PY_SPY = Path(sys.executable).with_name("py-spy")


def start_profiler(pid: int, out: Path, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    spy = [
        str(PY_SPY),
        "record",
        "--pid",
        str(pid),
        "--format",
        "raw",
    ]
    spy += ["--output", str(out), "--rate", "1000", "--nonblocking", "--subprocesses"]
    return subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(proc: subprocess.Popen[bytes], name: str, args: argparse.Namespace) -> None:
    """py-spy writes its collapsed stacks on SIGINT; keep them next to the results
    (``<broker>-<mode>-<role>.txt``)."""
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    target = Path(args.profile) / f"{name}.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    source = Path(proc.args[proc.args.index("--output") + 1])  # type: ignore[index,union-attr]
    if source.exists():
        target.write_bytes(source.read_bytes())


# -- report ------------------------------------------------------------------------------------


def machine() -> str:
    from run import machine_line  # benchmarks/run.py, next to this script

    return machine_line()


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f}"


def cpu_text(cpu: dict[str, float]) -> str:
    return ", ".join(f"{role} {ms:.1f}" for role, ms in cpu.items())


def errors_text(errors: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) or "0"


def markdown(results: list[Result], args: argparse.Namespace, before: str, after: str) -> str:
    lines = [
        f"{args.orders} orders at concurrency {args.concurrency}"
        + (f", offered at {args.rate:g}/s" if args.rate else "")
        + (f", {args.api_processes} API processes" if args.api_processes > 1 else "")
        + f", worker concurrency {args.worker_concurrency}; {machine()}; {before} before, "
        f"{after} after.",
        "",
        "| broker | mode | client | orders/s | 202 p50 / p95 / p99 ms | errors | all final after "
        "| COVERED / FAILED | exactly once | CPU ms per order during the burst "
        "| worker CPU ms per order, all told | API on a CPU / waiting for one |",
        "|---|---|---|---:|---:|---|---:|---:|---|---|---:|---:|",
    ]
    for r in results:
        final = f"{r.final_after_s:.1f} s" if r.final_after_s is not None else "not all"
        lines.append(
            f"| {r.broker} | {r.mode} | {r.client} | {r.orders_per_s:,.0f} | "
            f"{r.p50_ms:.1f} / {r.p95_ms:.1f} / {r.p99_ms:.1f} | {errors_text(r.errors)} | "
            f"{final} | {r.covered} / {r.failed} | {r.check} | {cpu_text(r.cpu_ms)} | "
            f"{r.worker_cpu_ms:.1f} | {r.api_sched[0]} % / {r.api_sched[1]} % |"
        )
    return "\n".join(lines) + "\n"


def show(results: list[Result]) -> None:
    table = Table(title="load test")
    for column in (
        "broker",
        "mode",
        "client",
        "orders/s",
        "p50",
        "p95",
        "p99",
        "errors",
        "final after",
        "check",
    ):
        table.add_column(column)
    for r in results:
        table.add_row(
            r.broker,
            r.mode,
            r.client,
            f"{r.orders_per_s:,.0f}",
            f"{r.p50_ms:.1f}",
            f"{r.p95_ms:.1f}",
            f"{r.p99_ms:.1f}",
            errors_text(r.errors),
            f"{r.final_after_s:.1f}" if r.final_after_s is not None else "-",
            r.check,
        )
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    global PG_DSN, REDIS_URL
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", "--orders", type=int, default=1000)
    parser.add_argument(
        "-c", "--concurrency", type=int, default=50, help="concurrent HTTP requests"
    )
    parser.add_argument("--worker-concurrency", type=int, default=50)
    parser.add_argument(
        "--client",
        choices=("wrk", "httpx"),
        default="wrk",
        help="the burst client (wrk falls back to httpx when it is not installed)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        help="offer the orders at this many per second (an open loop, at most -c in flight) "
        "instead of as fast as they are answered",
    )
    parser.add_argument(
        "--api-processes",
        type=int,
        default=1,
        help="split mode: uvicorn processes serving the API (its --workers)",
    )
    parser.add_argument("--pg", default=PG_DSN, help="PostgreSQL database of the runs")
    parser.add_argument("--redis", default=REDIS_URL, help="Redis database of the runs")
    parser.add_argument("--brokers", default=",".join(BROKERS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--final-timeout", type=float, default=600)
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--markdown", help="write the table to this Markdown file")
    parser.add_argument(
        "--profile",
        help="py-spy the API and worker processes during the burst; stacks to this directory",
    )
    args = parser.parse_args(argv)
    PG_DSN, REDIS_URL = args.pg, args.redis
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for name in [*brokers, *modes]:
        if name not in (*BROKERS, *MODES):
            parser.error(f"unknown broker or mode {name!r}")
    if args.profile and not PY_SPY.exists():
        parser.error("--profile needs py-spy beside this Python: pip install py-spy")
    before = load()
    results = []
    for broker in brokers:
        for mode in modes:
            result = run_one(broker, mode, args)
            console.print(
                f"{broker}/{mode}: {result.orders_per_s:,.0f} orders/s, p99 {result.p99_ms:.1f} ms, "
                f"errors {errors_text(result.errors)}, {result.check}"
            )
            results.append(result)
    after = load()
    show(results)
    text = markdown(results, args, before, after)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        payload = {
            "machine": machine(),
            "load_before": before,
            "load_after": after,
            "results": [asdict(r) for r in results],
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    ok = all(r.check == "ok" and not r.errors for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
