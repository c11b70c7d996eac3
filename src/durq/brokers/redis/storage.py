"""Connection handling shared by the hot path and the inspector: URL parsing, the client,
script calls by SHA, and the mapping of redis-py errors onto durq's typed errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis import exceptions as rex

from durq import ranges
from durq.brokers.params import EnqueueParams, MemberOutcome
from durq.brokers.redis.cluster import (
    DEFAULT_RETRY,
    DEFAULT_WAIT_TIMEOUT_MS,
    ClusterOptions,
    ClusterWire,
    key_slot,
)
from durq.brokers.redis.errors import map_error
from durq.brokers.redis.keys import DEFAULT_PREFIX, Keys, QueueKeys, queue_of_channel
from durq.brokers.redis.lua import LuaScript, load_scripts
from durq.brokers.redis.wire import (
    Command,
    Wire,
    endpoint_of,
    error,
    is_error,
    loaded,
    scripts_to_load,
)
from durq.brokers.views import MINUTE_COUNTS_KEEP
from durq.clock import SYSTEM_CLOCK, Clock, server_clock_for
from durq.errors import (
    BrokerError,
    BrokerUnavailableError,
    ConfigurationError,
    SchemaError,
)
from durq.states import TaskState
from durq.task import TaskInfo, limits_to_json
from durq.urls import check_port, redact, unsplit

#: The oldest server the scripts run on (ZADD GT/LT, GETDEL, ZRANGE options...).
MIN_REDIS_VERSION = (6, 2)
#: Storage layout version kept in ``P:schema``.
SCHEMA_VERSION = "1"
#: Seconds: an unreachable server fails a call within about this long, never hangs.
CONNECT_TIMEOUT = 3.0
SOCKET_TIMEOUT = 5.0
#: The longest BLPOP of an idle worker (seconds); a longer wait for work is several.
LONGEST_BLOCK = 30.0
#: Daily counters are kept this long (seconds of server time).
DAY_TTL = 90 * 86400
#: Per-minute counters: a day's hash is kept this long after its last write (the keep, and
#: the day the hash spans).
MINUTE_TTL = int(MINUTE_COUNTS_KEEP) + 86400

Scalar = str | bytes | int | float
#: One script call: the script's name, its ``KEYS`` and its ``ARGV``.
ScriptCall = tuple[str, Sequence[str], Sequence[Scalar]]


class RedisStorage:
    """The client, the pipelined connection, the key names and the scripts of one broker;
    :class:`~durq.brokers.redis.broker.RedisBroker` and
    :class:`~durq.brokers.redis.admin.RedisAdmin` both work on one of these."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock = SYSTEM_CLOCK,
        connect_timeout: float = CONNECT_TIMEOUT,
        socket_timeout: float = SOCKET_TIMEOUT,
    ) -> None:
        self.url = url
        self._clock: Clock = clock
        #: Set when the real clock is used: times then come from the server's TIME (W1).
        self._server_clock = server_clock_for(clock)
        self.keys = Keys(prefix)
        self.scripts: dict[str, LuaScript] = load_scripts()
        node_url, seeds, options = _cluster_url(url)
        try:
            # redis-py reads the URL (host, socket, TLS options, credentials, timeouts) into
            # a pool that is never connected: every command goes over wire.py's connection,
            # which retries a refused or dropped connection twice, then raises (promptly).
            self.pool: aioredis.ConnectionPool = aioredis.ConnectionPool.from_url(
                node_url, socket_connect_timeout=connect_timeout, socket_timeout=socket_timeout
            )
        except ValueError as exc:
            raise ConfigurationError(f"invalid Redis URL {redact(url)!r}: {exc}") from exc
        #: A Redis Cluster (``redis+cluster://``): one connection per node, commands routed
        #: by hash slot, cross-slot work split per slot (see docs/brokers/redis.md).
        self.cluster = seeds is not None
        self.wire: Wire | ClusterWire
        if seeds is not None:
            self.wire = ClusterWire(
                seeds,
                endpoint_of(self.pool),
                scripts={s.sha: s.source for s in self.scripts.values()},
                options=options,
                confirmed=frozenset(
                    s.sha for name, s in self.scripts.items() if name not in _UNCONFIRMED
                ),
            )
        else:
            self.wire = Wire(endpoint_of(self.pool))
        #: An idle worker's connection to block on (see :class:`~durq.brokers.redis.wakeup.
        #: Blocker`), opened on first use. No retries: a blocked call is not sent again. Its
        #: replies may take a whole block longer than the socket timeout.
        self.blocking_wire: Wire | None = None
        if seeds is None:
            endpoint = endpoint_of(self.pool)
            self.blocking_wire = Wire(
                replace(endpoint, socket_timeout=endpoint.socket_timeout + LONGEST_BLOCK),
                retries=0,
            )
        self.ready = False
        self.known_queues: set[str] = set()

    @staticmethod
    def split_url(url: str) -> tuple[str, str]:
        """``redis://host:port/db?prefix=durq`` (also ``rediss://``, ``unix://``) as the URL
        of the connection and durq's key prefix; ConfigurationError for anything else."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix", *CLUSTER_SCHEMES):
            raise ConfigurationError(f"not a Redis URL: {redact(url)!r}")
        if parts.scheme in CLUSTER_SCHEMES and parts.path.strip("/") not in ("", "0"):
            raise ConfigurationError(
                f"invalid Redis Cluster URL {redact(url)!r}: a cluster has only database 0"
            )
        if parts.scheme != "unix" and parts.path.strip("/") and not parts.path.strip("/").isdigit():
            raise ConfigurationError(
                f"invalid Redis URL {redact(url)!r}: the path must be a database number"
            )
        if parts.scheme in ("redis", "rediss"):
            check_port(parts)
        query = parse_qsl(parts.query, keep_blank_values=True)
        prefix = DEFAULT_PREFIX
        rest: list[tuple[str, str]] = []
        for key, value in query:
            if key == "prefix":
                prefix = value
            else:
                if key in _TIMEOUTS:  # read by durq's own connections, not only redis-py
                    ranges.seconds(key, value, high=3600, positive=True)
                rest.append((key, value))
        return unsplit(parts._replace(query=urlencode(rest))), prefix

    @property
    def clock(self) -> Clock:
        """The clock this broker stamps times with (the server's, once measured)."""
        return self._clock

    # -- connection -----------------------------------------------------------------------

    async def connect(self) -> None:
        """Check the server once: reachable, a Redis, new enough, our layout version."""
        if self.ready:
            return
        async with self.op("connect"):
            try:
                info = _info(await self.command("INFO", "server"))
            except rex.ConnectionError as exc:
                if "lost" not in str(exc):
                    raise
                # A server that hangs up on the first command is often not a Redis at all.
                raise BrokerUnavailableError(
                    f"Redis at {redact(self.url)} closed the connection on the first "
                    "command: is it down, or is this not a Redis server?",
                    operation="redis.connect",
                ) from exc
            version = str(info.get("redis_version", "0"))
            if _version(version) < MIN_REDIS_VERSION:
                raise SchemaError(
                    f"Redis {version} at {redact(self.url)} is too old: durq needs Redis "
                    f"{'.'.join(map(str, MIN_REDIS_VERSION))} or newer",
                    operation="redis.connect",
                )
            raw: Any = await self.command("GET", self.keys.schema)
            schema = None if raw is None else bytes(raw).decode()
            if schema is not None and schema != SCHEMA_VERSION:
                raise SchemaError(
                    f"keys under prefix {self.keys.prefix!r} use layout {schema}, "
                    f"this durq uses {SCHEMA_VERSION}",
                    operation="redis.connect",
                )
        await self.sync_clock()
        self.ready = True

    def now_arg(self) -> Scalar:
        """A script's ``now`` argument: ``""`` lets the script read the server's ``TIME``;
        an injected test clock is passed as is."""
        return "" if self._server_clock is not None else self._clock.now()

    async def sync_clock(self) -> None:
        """Measure the offset of the server's ``TIME`` (at connect, then about once a minute)."""
        server = self._server_clock
        if server is None or not server.due:
            return

        async def read() -> float:
            async with self.op("time"):
                seconds, micros = await self.command("TIME")
            return float(seconds) + float(micros) / 1e6

        await server.sync(read)
        self._clock = server

    async def ensure(self) -> None:
        if not self.ready:
            await self.connect()

    async def migrate(self) -> list[str]:
        """Redis needs no schema; this records the layout version under the prefix."""
        await self.connect()
        async with self.op("migrate"):
            created = await self.command("SET", self.keys.schema, SCHEMA_VERSION, "NX")
        return [f"redis-layout-{SCHEMA_VERSION}"] if created else []

    async def pending_migrations(self) -> list[str]:
        """:meth:`migrate`'s record, when missing (a different layout fails to connect)."""
        await self.connect()
        async with self.op("migrate"):
            recorded = await self.command("EXISTS", self.keys.schema)
        return [] if recorded else [f"redis-layout-{SCHEMA_VERSION}"]

    async def ping(self) -> None:
        """One cheap round trip."""
        async with self.op("ping"):
            await self.command("PING")

    async def durability_warnings(self) -> list[str]:
        """Server settings that can lose acknowledged tasks (docs/guarantees.md): no AOF,
        ``appendfsync no``, or an evicting ``maxmemory-policy``. The worker logs them once at
        start. Empty when the server is durable, or when it refuses ``CONFIG GET`` (managed
        services often do)."""
        try:
            async with self.op("config_get"):
                flat = await self.commands(
                    [("CONFIG", "GET", "maxmemory-policy"), ("CONFIG", "GET", "append*")]
                )
        except BrokerError:
            return []
        config = {
            _text(reply[i]): _text(reply[i + 1]) for reply in flat for i in range(0, len(reply), 2)
        }
        problems = []
        policy = config.get("maxmemory-policy")
        if policy is not None and policy != "noeviction":
            problems.append(
                f"maxmemory-policy is {policy!r}: under memory pressure Redis deletes task "
                "keys silently (set noeviction)"
            )
        if config.get("appendonly") == "no":
            problems.append(
                "appendonly is 'no': a restart loses every task since the last snapshot "
                "(set appendonly yes with appendfsync everysec or always)"
            )
        elif config.get("appendfsync") == "no":
            problems.append(
                "appendfsync is 'no': a crash can lose many seconds of writes "
                "(set everysec or always)"
            )
        return problems

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        self.ready = False
        self.wire.close()
        if self.blocking_wire is not None:
            self.blocking_wire.close()

    # -- calls ----------------------------------------------------------------------------

    async def command(self, *args: Scalar) -> Any:
        """One command over the connection; an error reply raises (redis-py's classes)."""
        reply = await self.wire.call(args)
        if is_error(reply):
            raise error(reply)
        return reply

    async def commands(self, commands: Sequence[tuple[Scalar, ...]]) -> list[Any]:
        """Several commands in one round trip (MULTI/EXEC among them when atomic)."""
        replies = await self.wire.call_many(commands)
        for reply in replies:
            if is_error(reply):
                raise error(reply)
        return replies

    async def atomic(self, commands: Sequence[tuple[Scalar, ...]]) -> list[Any]:
        """``commands`` in one MULTI/EXEC on a single node. On a cluster, one MULTI/EXEC per
        hash slot, in the order of each slot's first command: the queue's own key first, so
        what the scripts read changes before the listings do."""
        if not self.cluster:
            replies = await self.commands([("MULTI",), *commands, ("EXEC",)])
            return list(replies[-1])
        groups: dict[int | None, list[tuple[Scalar, ...]]] = {}
        for command in commands:
            slot = None if command[0] == "PUBLISH" else key_slot(str(command[1]))
            groups.setdefault(slot, []).append(command)
        out: list[Any] = []
        for slot, group in groups.items():
            if slot is None:  # PUBLISH has no key: any node, after the writes before it
                out += await self.commands(group)
            else:
                out += (await self.commands([("MULTI",), *group, ("EXEC",)]))[-1]
        return out

    async def get_many(self, keys: Sequence[str]) -> list[Any]:
        """``GET`` of each key: one MGET on a single node, a pipeline of GETs (routed per
        slot) on a cluster."""
        if not keys:
            return []
        if self.cluster:
            return await self.commands([("GET", key) for key in keys])
        return list(await self.command("MGET", *keys))

    def mapped(self, exc: Exception, op: str) -> Exception:
        """The durq error for a failure of broker call ``op`` (``exc`` itself when it is
        already durq's or not a driver/socket error)."""
        return map_error(exc, f"redis.{op}", redact(self.url))

    @asynccontextmanager
    async def op(self, op: str) -> AsyncIterator[None]:
        """Map redis-py and socket errors of one broker call onto durq's errors."""
        try:
            yield
        except Exception as exc:
            mapped = self.mapped(exc, op)
            if mapped is exc:
                raise
            raise mapped from exc

    def evalsha(self, name: str, keys: Sequence[str], args: Sequence[Scalar]) -> Command:
        """The ``EVALSHA`` command of one script call."""
        return ("EVALSHA", self.scripts[name].sha, len(keys), *keys, *args)

    async def eval(self, name: str, keys: Sequence[str], args: Sequence[Scalar]) -> Any:
        """Run one script by SHA, loading it first if the server does not know it (NOSCRIPT:
        a restart without persistence of the script cache, SCRIPT FLUSH, a failover)."""
        script = self.scripts[name]
        command = self.evalsha(name, keys, args)
        reply = await self.wire.call(command)
        if is_error(reply):
            exc = error(reply)
            if not isinstance(exc, rex.NoScriptError):
                raise exc
            await self._load_script(script)
            reply = await self.wire.call(command)
            if is_error(reply):
                raise error(reply)
        return reply

    async def _load_script(self, script: LuaScript) -> None:
        reply = await self.wire.call(("SCRIPT", "LOAD", script.source))
        if is_error(reply):
            raise error(reply)
        if isinstance(self.wire, Wire):
            self.wire.scripts.add(script.sha)

    async def eval_many(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Scalar]]]
    ) -> list[Any]:
        """Run several scripts in one round trip (a pipeline without MULTI: each script is
        atomic on its own). Calls refused with NOSCRIPT did nothing, so they are re-run once
        after loading their scripts."""
        scripts = self.scripts
        commands = [self.evalsha(name, keys, args) for name, keys, args in calls]
        if isinstance(self.wire, Wire) and len(calls) > 1:  # a cluster loads them per node
            used = (scripts[name] for name, _, _ in calls)
            loads = scripts_to_load(((s.sha, s.source) for s in used), self.wire.scripts)
            results = await self.wire.call_many([*loads, *commands])
            loaded(self.wire, loads, results)
        else:
            results = await self.wire.call_many(commands)
        missing: list[int] = []
        for i, reply in enumerate(results):
            if is_error(reply):
                exc = error(reply)
                if not isinstance(exc, rex.NoScriptError):
                    raise exc
                missing.append(i)
        if missing:
            for name in {calls[i][0] for i in missing}:
                await self._load_script(scripts[name])
            again = await self.wire.call_many([commands[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                if is_error(reply):
                    raise error(reply)
                results[i] = reply
        return results

    # -- task writes shared by the hot path and the inspector ------------------------

    def enqueue_fields(
        self, p: EnqueueParams, k: QueueKeys, now: float
    ) -> tuple[list[Scalar], TaskState]:
        """The 15 per-task arguments of enqueue.lua / enqueue_many.lua, and the state the
        task starts in (``now``: this process's estimate of the broker's clock). The script
        returns no row: :meth:`created` builds the task's TaskInfo from the params."""
        npa = p.scheduled_until(now)
        state = TaskState.PENDING if npa is None else TaskState.SCHEDULED
        unique = p.unique_key or ""
        headers = p.headers
        fields: list[Scalar] = [
            p.id,
            p.type,
            p.payload,
            p.max_retry,
            "" if p.timeout is None else float(p.timeout),
            "" if p.deadline is None else float(p.deadline),
            "" if p.process_at is None else float(p.process_at),
            state.value,
            float(p.retention),
            unique,
            float(p.unique_ttl or 0.0) if unique else "",
            json.dumps(headers) if headers else "",
            float(p.process_in) if p.process_in else "",
            int(p.priority),
            limits_to_json(p.limits) or "",
        ]
        return fields, state

    @staticmethod
    def created(p: EnqueueParams, state: TaskState, now_s: bytes) -> TaskInfo:
        """The TaskInfo of the task a script created from ``p`` in ``state``; its times are
        those of the clock the script read (its reply: the server's unless a test injected
        one). Built once, after the reply (not before the call and again after it)."""
        return p.created(state, float(now_s))

    def enqueue_call(self, p: EnqueueParams, now: float) -> tuple[ScriptCall, TaskState]:
        """One enqueue.lua call (also the layout of a follow-up in complete/archive), and
        the state the task starts in."""
        k = self.keys.queue(p.queue)
        fields, state = self.enqueue_fields(p, k, now)
        call: ScriptCall = (
            "enqueue",
            [k.task(p.id), k.pending, k.scheduled, k.completed, k.unique, k.seq],
            [self.now_arg(), k.notify, *fields],
        )
        return call, state

    def plain_call(self, p: EnqueueParams) -> ScriptCall | None:
        """The enqueue_plain.lua call of a plain task (due now, priority 0, no unique key,
        headers, limits, deadline or dependencies), which stores what enqueue.lua would;
        ``None`` for any other task. The task starts pending."""
        if (
            p.unique_key
            or p.limits
            or p.headers
            or p.process_in
            or p.process_at is not None
            or p.deadline is not None
            or p.priority
            or p.after
        ):
            return None
        k = self.keys.queue(p.queue)
        return (
            "enqueue_plain",
            [k.task(p.id), k.pending, k.seq],
            [
                self.now_arg(),
                k.notify,
                p.id,
                p.type,
                p.payload,
                p.max_retry,
                "" if p.timeout is None else float(p.timeout),
                float(p.retention) if p.retention > 0 else "",
            ],
        )

    def with_follow_ups(
        self, call: ScriptCall, follow_ups: Sequence[EnqueueParams], now: float
    ) -> ScriptCall:
        """Append each follow-up's enqueue keys and arguments to a complete/archive call: the
        script creates them in the same atomic step."""
        if not follow_ups:
            return call
        name, keys, args = call
        keys, args = list(keys), list(args)
        slot = key_slot(keys[0]) if self.cluster else None
        for p in follow_ups:
            (_, more_keys, more_args), _ = self.enqueue_call(p, now)
            if slot is not None and key_slot(more_keys[0]) != slot:
                # Another slot: the script keeps it in its own queue's outbox (see
                # _lib.lua), and drain_outboxes creates it right after.
                more_keys = [self.keys.queue(_queue_of_key(keys[0])).outbox] * 6
            keys.extend(more_keys)
            args.extend(more_args)
        return name, keys, args

    def outbox_queues(self, source: str, follow_ups: Sequence[EnqueueParams]) -> list[str]:
        """``[source]`` if a follow-up of a task of ``source`` goes through its outbox (a
        cluster, another hash slot), else ``[]``."""
        if not self.cluster:
            return []
        slot = key_slot(self.keys.queue(source).base)
        if any(key_slot(self.keys.queue(p.queue).base) != slot for p in follow_ups):
            return [source]
        return []

    async def drain_outboxes(self, queues: Sequence[str]) -> int:
        """Create the follow-ups kept in the outboxes of ``queues`` (cluster only): each runs
        as enqueue.lua in its own slot, then leaves the outbox. Idempotent: a follow-up that
        exists already (a drain that stopped between the two steps) counts as created."""
        created = 0
        outboxes = [self.keys.queue(q).outbox for q in dict.fromkeys(queues)]
        replies = await self.commands([("HGETALL", key) for key in outboxes])
        for outbox, flat in zip(outboxes, replies, strict=True):
            for field, value in zip(flat[::2], flat[1::2], strict=True):
                args = _netstrings(bytes(value))
                target = queue_of_channel(args[1].decode())
                tk = self.keys.queue(target)
                await self.remember_queues([target])
                await self.eval(
                    "enqueue",
                    [tk.task(args[2].decode()), tk.pending, tk.scheduled, tk.completed,
                     tk.unique, tk.seq],
                    args,
                )  # fmt: skip
                # Same id, same arguments: a second run meets its own task and skips it.
                await self.command("HDEL", outbox, field)
                created += 1
        return created

    @staticmethod
    def member_args(outcome: MemberOutcome | None) -> list[Scalar]:
        """The last two arguments of complete/archive/admin_move: a group member's final
        state and entry ("" and "" for a task that is no member)."""
        if outcome is None:
            return ["", ""]
        return [outcome.state, outcome.entry]

    async def remember_queues(self, queues: Sequence[str]) -> None:
        """Add queues to the known set (once per queue per broker object)."""
        new = [q for q in dict.fromkeys(queues) if q not in self.known_queues]
        if new:
            for q in new:
                self.keys.queue(q)  # validates the name before it is stored
            await self.command("SADD", self.keys.queues, *new)
            self.known_queues.update(new)

    async def all_queues(self) -> list[str]:
        members: Any = await self.command("SMEMBERS", self.keys.queues)
        return sorted(bytes(m).decode() for m in members)


#: Scripts ``wait_replicas`` does not wait for: a claim, lease extension or promotion lost in
#: a failover only makes a task claimable again, while failing it for want of a replica
#: would strand the tasks it moved (active, until their lease expires).
_UNCONFIRMED = frozenset(
    {"claim", "extend", "expired", "promote", "janitor", "janitor_archived", "janitor_workflow"}
)
#: ``redis+cluster://host:port[,host:port...]/?prefix=...`` and its TLS form.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
#: Query parameters of a cluster URL that are durq's, not redis-py's.
_CLUSTER_OPTIONS = ("cluster_retry", "wait_replicas", "wait_timeout")
#: redis-py's URL timeouts (seconds), which durq's own connections read too.
_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")


def _cluster_url(url: str) -> tuple[str, list[tuple[str, int]] | None, ClusterOptions]:
    """For a cluster URL: the URL of one node as redis-py reads it (credentials, TLS and
    socket options), the seed nodes, and the cluster options. Any other URL comes back as it
    is, without seeds."""
    parts = urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        return url, None, ClusterOptions()
    userinfo, _, hosts = parts.netloc.rpartition("@")
    seeds: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(
                f"invalid Redis Cluster URL {redact(url)!r}: list nodes as host:port[,host:port]"
            )
        seeds.append((host.strip("[]"), int(port)))
    rest: list[tuple[str, str]] = []
    options: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in _CLUSTER_OPTIONS:
            options[key] = value
        else:
            rest.append((key, value))
    try:
        cluster = ClusterOptions(
            retry=ranges.seconds("cluster_retry", options.get("cluster_retry", DEFAULT_RETRY)),
            wait_replicas=ranges.integer("wait_replicas", options.get("wait_replicas", 0), 0, 64),
            wait_timeout_ms=ranges.integer(
                "wait_timeout", options.get("wait_timeout", DEFAULT_WAIT_TIMEOUT_MS), 0, 3_600_000
            ),
        )
    except ConfigurationError as exc:
        raise ConfigurationError(f"invalid Redis Cluster URL {redact(url)!r}: {exc}") from None
    scheme = "rediss" if parts.scheme == "rediss+cluster" else "redis"
    netloc = f"{userinfo}@{hosts.split(',')[0]}" if userinfo else hosts.split(",")[0]
    node = urlunsplit((scheme, netloc, "/0", urlencode(rest), ""))
    return node, seeds, cluster


def _queue_of_key(key: str) -> str:
    """The queue of a queue key (``P:{Q}:...``)."""
    return key[key.index("{") + 1 : key.index("}")]


def _netstrings(data: bytes) -> list[bytes]:
    """The values of ``<length>:<bytes>`` items one after another (an outbox entry)."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        colon = data.index(b":", pos)
        length = int(data[pos:colon])
        out.append(data[colon + 1 : colon + 1 + length])
        pos = colon + 1 + length
    return out


def _version(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def _info(raw: bytes) -> dict[str, str]:
    """An ``INFO`` reply as ``{field: value}``."""
    return dict(
        line.split(":", 1) for line in raw.decode().splitlines() if ":" in line and line[0] != "#"
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
