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


class TlsRedis:
    """A redis-server of a test's own that speaks only TLS (``--port 0``), with certificates
    made by ``openssl`` for 127.0.0.1 and signed by a CA of its own."""

    def __init__(self, data_dir: Path) -> None:
        binary, openssl = shutil.which("redis-server"), shutil.which("openssl")
        if binary is None or openssl is None:
            raise RuntimeError("redis-server and openssl are needed")
        self.dir = data_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        d = str(self.dir)

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
        (self.dir / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
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

    return redis.asyncio.Redis(connection_pool=broker._s.pool)
