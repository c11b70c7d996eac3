"""Where the real PostgreSQL and Redis are, and per-test isolation on them.

PostgreSQL and Redis suites run whenever those servers are reachable; without them they skip
with a visible reason, except under ``CI=true`` where a missing server is a failure."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

PG_DSN = os.environ.get("DURQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("DURQ_TEST_REDIS", "redis://127.0.0.1:6379/0")
IN_CI = os.environ.get("CI", "").lower() == "true"
BROKER_KINDS = ["sqlite", "postgres", "redis", "memory"]


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def require_server(kind: str) -> None:
    """Skip (or fail under CI) when the named server is not reachable."""
    url = urlsplit(PG_DSN if kind == "postgres" else REDIS_URL)  # honours the overrides
    host, port = url.hostname or "127.0.0.1", url.port or {"postgres": 5432, "redis": 6379}[kind]
    if not _reachable(host, port):
        message = f"{kind} is not reachable on {host}:{port}"
        if IN_CI:
            pytest.fail(f"{message} (required when CI=true)")
        pytest.skip(message)


def require_pgbouncer() -> None:
    """Skip (or fail under CI) when PostgreSQL or the PgBouncer binary is missing."""
    require_server("postgres")
    if not os.access(PGBOUNCER, os.X_OK):
        message = f"{PGBOUNCER} is not installed (Debian package pgbouncer)"
        if IN_CI:
            pytest.fail(f"{message} (required when CI=true)")
        pytest.skip(message)


def require_redis_cluster() -> None:
    """Skip (or fail under CI) when redis-server or redis-cli is missing."""
    missing = [b for b in ("redis-server", "redis-cli") if shutil.which(b) is None]
    if missing:
        message = f"{' and '.join(missing)} not installed (Debian package redis-server)"
        if IN_CI:
            pytest.fail(f"{message} (required when CI=true)")
        pytest.skip(message)


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def broker_url_for(kind: str, tmp_path: Path) -> str:
    """A fresh, isolated broker URL: a temp file, a PostgreSQL schema, a Redis key prefix or
    an in-memory name."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'durq.sqlite3'}"
    if kind == "memory":
        return f"memory://{unique_name('durq_test')}"
    require_server(kind)
    if kind == "postgres":
        return f"{PG_DSN}?schema={unique_name('durq_test')}"
    join = "&" if "?" in REDIS_URL else "?"
    return f"{REDIS_URL}{join}prefix={unique_name('durqtest')}"


def drop_isolated(kind: str, url: str) -> None:
    """Remove what a test left in a shared server."""
    if kind in ("postgres", "postgres-pgbouncer"):
        import psycopg
        from psycopg import sql

        schema = parse_qs(urlsplit(url).query)["schema"][0]
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    elif kind == "redis":
        import redis

        prefix = url.split("prefix=", 1)[1].split("&", 1)[0]
        client = redis.Redis.from_url(REDIS_URL)
        try:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 30.0) -> None:
    """Return once something accepts connections on ``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


class PrivateRedis:
    """A redis-server of a test's own, in ``data_dir`` on its own port; never the shared one.

    Started on construction; ``kill`` is SIGKILL (no shutdown save, like a crash)."""

    def __init__(self, data_dir: Path, *config: str, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.binary = binary
        self.dir = data_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.config = list(config)
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
        self.proc = subprocess.Popen(
            [self.binary, *args, "--save", "", *self.config],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port)
        # With AOF the server accepts connections while it loads; wait until it answers.
        import redis

        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.exceptions.BusyLoadingError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
                except redis.exceptions.AuthenticationError:
                    return  # started with --requirepass: it answers, that is enough
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def crash_and_restart(self, down_for: float = 1.0) -> None:
        self.kill()
        time.sleep(down_for)
        self.start()

    close = kill


PGBOUNCER = os.environ.get("DURQ_TEST_PGBOUNCER", "/usr/sbin/pgbouncer")


class PgBouncer:
    """A PgBouncer of the suite's own in transaction pooling mode, in front of the shared
    PostgreSQL (``PG_DSN``), on a free loopback port; ``close`` stops it."""

    def __init__(self, work_dir: Path) -> None:
        if not os.access(PGBOUNCER, os.X_OK):
            raise FileNotFoundError(f"{PGBOUNCER} is not installed (Debian package pgbouncer)")
        server = urlsplit(PG_DSN)
        self.user = server.username or "postgres"
        self.database = server.path.lstrip("/") or "test"
        self.port = free_port()
        work_dir.mkdir(parents=True, exist_ok=True)
        work_dir.chmod(0o755)  # readable after PgBouncer drops root (below)
        users = work_dir / "userlist.txt"
        users.write_text(f'"{self.user}" ""\n')
        config = work_dir / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"{self.database} = host={server.hostname or '127.0.0.1'} "
            f"port={server.port or 5432} dbname={self.database}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            "max_client_conn = 500\n"
            "default_pool_size = 20\n"
        )
        for path in (users, config):
            path.chmod(0o644)
        # PgBouncer refuses to run as root; -u drops to an unprivileged user.
        as_user = ["-u", "nobody"] if os.geteuid() == 0 else []
        self.log = work_dir / "pgbouncer.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [PGBOUNCER, *as_user, str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        try:
            wait_port(self.port, timeout=15)
        except TimeoutError:
            self.close()
            raise RuntimeError(f"PgBouncer did not start: {self.log.read_text()[-2000:]}") from None

    def url(self, schema: str) -> str:
        """A broker URL through this PgBouncer; LISTEN goes straight to PostgreSQL."""
        query = urlencode({"schema": schema, "pgbouncer": "1", "listen_url": PG_DSN})
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}?{query}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def make_certificates(directory: Path) -> Path:
    """A CA of its own (``ca.pem``) and a server certificate for 127.0.0.1 signed by it
    (``server.pem``, ``server.key``), made by ``openssl`` in ``directory``; the CA's path."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("redis-server and openssl are needed")
    directory.mkdir(parents=True, exist_ok=True)
    d = str(directory)

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=durq test CA",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    )
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
    )
    return directory / "ca.pem"


class TlsRedis:
    """A redis-server of a test's own that speaks only TLS (``--port 0``), with certificates
    made by ``openssl`` for 127.0.0.1 and signed by a CA of its own."""

    def __init__(self, data_dir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server and openssl are needed")
        self.dir = data_dir
        make_certificates(self.dir)
        d = str(self.dir)
        self.ca = self.dir / "ca.pem"
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--tls-cert-file",
                "server.pem",
                "--tls-key-file",
                "server.key",
                "--tls-ca-cert-file",
                "ca.pem",
                "--tls-auth-clients",
                "no",
                "--save",
                "",
                "--dir",
                d,
            ],
            cwd=d,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port)

    @property
    def url(self) -> str:
        """``rediss://`` with the CA that signed the server's certificate."""
        return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca}"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def raw_redis(broker: Any) -> Any:
    """A redis-py client on the server of a Redis broker, to look at what it stored."""
    import redis.asyncio

    return redis.asyncio.Redis(connection_pool=broker._storage.pool)


class RedisCluster:
    """A Redis Cluster of the suite's own: 3 masters and 3 replicas on free loopback ports, in
    ``data_dir``; ``close`` kills every node. ``node_timeout`` (ms) is small so a replica
    takes over within a few seconds of its master's death."""

    def __init__(
        self, data_dir: Path, *, node_timeout: int = 1500, replicas: int = 1, tls: bool = False
    ) -> None:
        binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if binary is None or cli is None:
            raise RuntimeError("redis-server and redis-cli are needed")
        self.dir = data_dir
        self.nodes: dict[int, subprocess.Popen[bytes]] = {}
        self.binary = binary
        self.node_timeout = node_timeout
        #: TLS only (clients, cluster bus and replication), certificates signed by ``ca``.
        self.ca = make_certificates(data_dir / "tls") if tls else None
        ports = _free_ports(3 * (1 + replicas))
        try:
            for port in ports:
                self.start_node(port)
            for port in ports:
                wait_port(port)
            tls_args = ["--tls", "--cacert", str(self.ca)] if self.ca else []
            subprocess.run(
                [cli, *tls_args, "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
                 "--cluster-replicas", str(replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            self.wait_ok()
            self.wait_replicated(replicas)
        except BaseException:
            self.close()
            raise

    def start_node(self, port: int) -> None:
        node_dir = self.dir / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        listen = ["--port", str(port)]
        if self.ca is not None:
            tls = self.ca.parent
            listen = ["--port", "0", "--tls-port", str(port), "--tls-cluster", "yes",
                      "--tls-replication", "yes", "--tls-auth-clients", "no",
                      "--tls-cert-file", str(tls / "server.pem"),
                      "--tls-key-file", str(tls / "server.key"),
                      "--tls-ca-cert-file", str(self.ca)]  # fmt: skip
        self.nodes[port] = subprocess.Popen(
            [self.binary, *listen, "--bind", "127.0.0.1", "--dir", str(node_dir),
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(self.node_timeout), "--save", "",
             "--appendonly", "no", "--repl-diskless-sync-delay", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    @property
    def ports(self) -> list[int]:
        return sorted(self.nodes)

    def url(self, prefix: str | None = None) -> str:
        """``redis+cluster://`` seeded with every node (any one would do)."""
        seeds = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        if self.ca is not None:
            query = f"ssl_ca_certs={self.ca}" + (f"&prefix={prefix}" if prefix else "")
            return f"rediss+cluster://{seeds}/?{query}"
        return f"redis+cluster://{seeds}/" + (f"?prefix={prefix}" if prefix else "")

    def client(self, port: int) -> Any:
        import redis

        if self.ca is not None:
            return redis.Redis(port=port, socket_timeout=5, ssl=True, ssl_ca_certs=str(self.ca))
        return redis.Redis(port=port, socket_timeout=5)

    def masters(self) -> dict[int, list[tuple[int, int]]]:
        """Port of each live master and the slot ranges it serves."""
        for port in self.ports:
            if self.nodes[port].poll() is not None:
                continue
            try:
                slots = self.client(port).execute_command("CLUSTER", "SLOTS")
            except Exception:
                continue
            out: dict[int, list[tuple[int, int]]] = {}
            for start, end, master, *_ in slots:
                out.setdefault(int(master[1]), []).append((int(start), int(end)))
            return out
        raise RuntimeError("no node of the cluster answers")

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Return once every live node says the cluster is ok and every slot is served."""

        def ok() -> bool:
            live = [p for p in self.ports if self.nodes[p].poll() is None]
            infos = [self.client(p).execute_command("CLUSTER", "INFO") for p in live]
            served = sum(e - s + 1 for r in self.masters().values() for s, e in r)
            return all(b"cluster_state:ok" in i for i in infos) and served == 16384

        _until(ok, timeout, "the Redis Cluster did not become ok")

    def wait_failover(self, dead: int, timeout: float = 30.0) -> None:
        """Return once the live nodes serve every slot without the dead master ``dead``."""

        def taken_over() -> bool:
            live = [p for p in self.ports if self.nodes[p].poll() is None]
            for port in live:
                slots = self.client(port).execute_command("CLUSTER", "SLOTS")
                if any(int(row[2][1]) == dead for row in slots):
                    return False
            return True

        _until(taken_over, timeout, f"no replica took over from {dead}")
        self.wait_ok(timeout)

    def wait_replicated(self, replicas: int = 1, timeout: float = 30.0) -> None:
        """Return once every master has ``replicas`` replicas online (initial sync done)."""

        def synced() -> bool:
            infos = [self.client(p).info("replication") for p in self.masters()]
            return all(
                sum(1 for k, v in i.items() if k.startswith("slave") and k[5:].isdigit()
                    and v.get("state") == "online") >= replicas
                for i in infos
            )  # fmt: skip

        _until(synced, timeout, "the replicas of the Redis Cluster did not sync")

    def kill(self, port: int) -> None:
        """SIGKILL one node (a crash: what it did not replicate yet is lost)."""
        proc = self.nodes[port]
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def delete_prefix(self, prefix: str) -> None:
        """Remove the keys under ``prefix`` from every master."""
        for port in self.masters():
            client = self.client(port)
            try:
                pipe = client.pipeline(transaction=False)
                for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                    pipe.unlink(key)  # one key per command: keys of many slots
                pipe.execute()
            finally:
                client.close()

    def close(self) -> None:
        for port in list(self.nodes):
            self.kill(port)


def _until(check: Any, timeout: float, message: str) -> None:
    """Poll ``check()`` (errors count as not yet) until it is true; TimeoutError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(message)
        time.sleep(0.1)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports whose cluster bus ports (+10000) are free too."""
    out: list[int] = []
    while len(out) < n:
        port = free_port()
        if port + 10000 > 65535 or port in out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        out.append(port)
    return out
