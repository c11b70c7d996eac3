"""A lean, pipelined Redis connection for the broker's script calls.

redis-py's asyncio client spends about 100 µs of Python per command (pool checkout, retry
wrapper, health check, an ``asyncio.timeout`` per read, stream reader); a script call on a
local server takes a fraction of that. This connection is one socket per broker object and
event loop, written to by every caller at once: each command is packed with hiredis and
written straight to the transport, its reply future queued; replies come back in order and
are parsed by hiredis in ``data_received``. Concurrent callers therefore share round trips
(automatic pipelining) and a call costs a few microseconds of Python.

Semantics kept from the redis-py path it replaces:

* connect timeout and socket timeout (a command without a reply in ``socket_timeout`` closes
  the connection and fails every waiting call with a timeout, so replies never shift);
* a call that meets a refused or dropped connection is retried twice with a 50-500 ms
  backoff (the server may have run a script whose reply was lost: see docs/brokers/redis.md);
* AUTH (password or ACL user), SELECT and CLIENT SETNAME (``client_name``) on connect; error
  replies become redis-py's exception classes, which :meth:`~durq.brokers.redis.storage.RedisStorage.op` maps onto durq's errors.

Every URL uses it: TCP, Unix sockets and TLS (``rediss://``, through an
:class:`ssl.SSLContext` built by redis-py's own rules from the URL's ``ssl_*`` options), with a
password, an ACL user or a redis-py credential provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import hiredis
import redis.asyncio as aioredis
from redis import exceptions as rex
from redis.asyncio.connection import RedisSSLContext
from redis.credentials import CredentialProvider

#: Retries of a call that met a refused or dropped connection, and their backoff (seconds).
RETRIES = 2
_BACKOFF = (0.05, 0.5)

Command = tuple[str | bytes | int | float, ...]

#: hiredis packs a command tuple into RESP (floats as ``repr``: full precision); its stub
#: types the argument as a one-element tuple, hence the cast.
_pack = cast(Callable[[Command], bytes], hiredis.pack_command)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how to connect: taken from the redis-py client built from the URL."""

    host: str | None
    port: int
    path: str | None
    db: int
    username: str | None
    password: str | None
    connect_timeout: float
    socket_timeout: float
    #: TLS (``rediss://``): the context to wrap the socket in.
    tls: ssl.SSLContext | None = None
    #: Asked for username and password at every connect, instead of the two fields above.
    credentials: CredentialProvider | None = None
    #: ``CLIENT SETNAME`` at every connect (the URL's ``client_name``), shown by CLIENT LIST.
    client_name: str | None = None


def endpoint_of(pool: aioredis.ConnectionPool) -> Endpoint:
    """The endpoint described by a redis-py connection pool built from a URL (nothing is
    connected): host or socket path, TLS options, credentials, database, timeouts."""
    kwargs: dict[str, Any] = pool.connection_kwargs
    tls: ssl.SSLContext | None = None
    if issubclass(pool.connection_class, aioredis.UnixDomainSocketConnection):
        host, path = None, str(kwargs["path"])
    else:
        host, path = str(kwargs.get("host", "localhost")), None
    if issubclass(pool.connection_class, aioredis.SSLConnection):
        # redis-py's defaults for rediss:// (certificate required, host name checked).
        options: dict[str, Any] = {"cert_reqs": "required", "check_hostname": True}
        options.update({k[4:]: v for k, v in kwargs.items() if k.startswith("ssl_")})
        tls = RedisSSLContext(**options).get()
    socket_timeout = kwargs.get("socket_timeout") or 5.0
    return Endpoint(
        host=host,
        port=int(kwargs.get("port", 6379)),
        path=path,
        db=int(kwargs.get("db", 0) or 0),
        username=kwargs.get("username"),
        password=kwargs.get("password"),
        connect_timeout=float(kwargs.get("socket_connect_timeout") or socket_timeout),
        socket_timeout=float(socket_timeout),
        tls=tls,
        credentials=kwargs.get("credential_provider"),
        client_name=kwargs.get("client_name") or None,
    )


class _ReplyError(Exception):
    """What hiredis returns for an error reply; turned into redis-py's class by :func:`error`."""


def error(reply: _ReplyError) -> rex.RedisError:
    """The redis-py exception for an error reply (the classes ``RedisStorage.op`` maps)."""
    text = str(reply)
    code = text.split(" ", 1)[0]
    if code == "NOSCRIPT":
        return rex.NoScriptError(text)
    if code == "LOADING":
        return rex.BusyLoadingError(text)
    if code in ("WRONGPASS", "NOAUTH") or "invalid password" in text:
        return rex.AuthenticationError(text)
    if code == "NOPERM":
        return rex.NoPermissionError(text)
    return rex.ResponseError(text)


class _Batch:
    """Collects the replies of several commands written together."""

    __slots__ = ("future", "left", "replies")

    def __init__(self, future: asyncio.Future[list[Any]], n: int) -> None:
        self.future = future
        self.left = n
        self.replies: list[Any] = []

    def add(self, reply: Any) -> bool:
        """Take one reply; ``True`` when it was the last one."""
        self.replies.append(reply)
        self.left -= 1
        if self.left:
            return False
        if not self.future.done():
            self.future.set_result(self.replies)
        return True


class _Protocol(asyncio.Protocol):
    """One socket: commands out in order, replies matched to their waiters in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, socket_timeout: float) -> None:
        self._loop = loop
        self._timeout = socket_timeout
        self._reader = hiredis.Reader(replyError=_ReplyError)
        self._waiters: deque[asyncio.Future[Any] | _Batch] = deque()
        self._sent: deque[float] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False
        #: The server's CLIENT ID of this connection, once asked (:meth:`Wire.client_id`).
        self.client_id: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports do not subclass asyncio's.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, data: bytes, waiter: asyncio.Future[Any] | _Batch) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise rex.ConnectionError("connection to Redis closed")
        self.transport.write(data)
        self._waiters.append(waiter)
        self._sent.append(self._loop.time())
        if self._timer is None:
            self._timer = self._loop.call_later(self._timeout, self._check_timeout)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiters, sent = self._waiters, self._sent
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as exc:
                self._abort(rex.InvalidResponse(f"not a Redis reply: {exc}"))
                return
            if reply is False:
                return
            if not waiters:  # an unsolicited reply: the stream cannot be trusted any more
                self._abort(rex.InvalidResponse("unexpected reply"))
                return
            waiter = waiters[0]
            if type(waiter) is _Batch:
                if not waiter.add(reply):
                    continue  # more replies of this batch to come
            elif not waiter.done():  # type: ignore[union-attr]
                waiter.set_result(reply)  # type: ignore[union-attr]
            waiters.popleft()
            sent.popleft()

    def _check_timeout(self) -> None:
        self._timer = None
        if not self._sent:
            return
        due = self._sent[0] + self._timeout
        if due <= self._loop.time():
            self._abort(rex.TimeoutError("Timeout reading from Redis"))
        else:
            self._timer = self._loop.call_at(due, self._check_timeout)

    def _abort(self, exc: Exception) -> None:
        self._fail(exc)
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiters, self._waiters = self._waiters, deque()
        self._sent.clear()
        for waiter in waiters:
            future = waiter.future if type(waiter) is _Batch else waiter
            if not future.done():  # type: ignore[union-attr]
                future.set_exception(exc)  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(rex.ConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def close(self) -> None:
        self._fail(rex.ConnectionError("connection closed by the client"))
        if self.transport is not None:
            self.transport.close()


class Wire:
    """The pipelined connection of one broker object (reconnects on demand)."""

    def __init__(self, endpoint: Endpoint, *, retries: int = RETRIES) -> None:
        self._endpoint = endpoint
        #: Retries of a refused or dropped connection (a cluster node retries none itself:
        #: the cluster client refreshes its map and retries within its own budget instead).
        self._retries = retries
        self._proto: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Lock | None = None
        #: SHAs of the scripts the server is known to hold since this connection opened
        #: (a restart empties its cache and drops the connection).
        self.scripts: set[str] = set()

    async def _connection(self) -> _Protocol:
        proto = self._proto
        loop = asyncio.get_running_loop()
        if proto is not None and not proto.closed and self._loop is loop:
            return proto
        if self._loop is not loop:
            self._connecting = None  # a lock of another (finished) loop is of no use
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            proto = self._proto
            if proto is not None and not proto.closed and self._loop is loop:
                return proto
            proto = await self._open(loop)
            self._proto, self._loop = proto, loop
            self.scripts = set()
            return proto

    async def _open(
        self, loop: asyncio.AbstractEventLoop, proto: _Protocol | None = None
    ) -> _Protocol:
        """Connect ``proto`` (a fresh command protocol by default), then AUTH and SELECT."""
        ep = self._endpoint
        if proto is None:
            proto = _Protocol(loop, ep.socket_timeout)
        try:
            if ep.path is not None:
                connect = loop.create_unix_connection(lambda: proto, ep.path)
            else:
                host = ep.host or "localhost"
                connect = loop.create_connection(
                    lambda: proto,
                    host,
                    ep.port,
                    ssl=ep.tls,
                    server_hostname=host if ep.tls is not None else None,
                )
            async with asyncio.timeout(ep.connect_timeout):
                await connect
        except TimeoutError as exc:
            raise rex.TimeoutError("Timeout connecting to Redis") from exc
        except OSError as exc:  # ssl.SSLError included: a refused certificate
            raise rex.ConnectionError(f"cannot connect to Redis: {exc}") from exc
        handshake: list[Command] = []
        username, password = ep.username, ep.password
        if ep.credentials is not None:
            got = await ep.credentials.get_credentials_async()
            username, password = (None, got[0]) if len(got) == 1 else (got[0], got[1])
        if password is not None:
            if username:
                handshake.append(("AUTH", username, password))
            else:
                handshake.append(("AUTH", password))
        if ep.db:
            handshake.append(("SELECT", ep.db))
        if ep.client_name:
            handshake.append(("CLIENT", "SETNAME", ep.client_name))
        if handshake:
            try:
                for reply in await self._send_many(proto, loop, handshake):
                    if isinstance(reply, _ReplyError):
                        raise error(reply)
            except BaseException:
                proto.close()
                raise
        return proto

    @staticmethod
    async def _send_many(
        proto: _Protocol, loop: asyncio.AbstractEventLoop, commands: Sequence[Command]
    ) -> list[Any]:
        future: asyncio.Future[list[Any]] = loop.create_future()
        proto.send(b"".join([_pack(c) for c in commands]), _Batch(future, len(commands)))
        return await future

    async def call(self, command: Command) -> Any:
        """One command; its reply (error replies come back as values: see :func:`error`)."""
        data = _pack(command)
        for attempt in range(self._retries + 1):
            try:
                proto = await self._connection()
                future: asyncio.Future[Any] = proto._loop.create_future()
                proto.send(data, future)
                return await future
            except rex.ConnectionError:
                if attempt == self._retries:
                    raise
                await asyncio.sleep(min(_BACKOFF[1], _BACKOFF[0] * 2**attempt))
        raise AssertionError("unreachable")

    async def call_many(self, commands: Sequence[Command]) -> list[Any]:
        """Several commands in one write; their replies in order (errors as values)."""
        if not commands:
            return []
        data = b"".join([_pack(c) for c in commands])
        for attempt in range(self._retries + 1):
            try:
                proto = await self._connection()
                future: asyncio.Future[list[Any]] = proto._loop.create_future()
                proto.send(data, _Batch(future, len(commands)))
                return await future
            except rex.ConnectionError:
                if attempt == self._retries:
                    raise
                await asyncio.sleep(min(_BACKOFF[1], _BACKOFF[0] * 2**attempt))
        raise AssertionError("unreachable")

    @property
    def socket_timeout(self) -> float:
        """Seconds a reply may take before the connection is given up."""
        return self._endpoint.socket_timeout

    @property
    def current_client_id(self) -> int | None:
        """The CLIENT ID of the open connection, if asked; ``None`` otherwise."""
        proto = self._proto
        return None if proto is None or proto.closed else proto.client_id

    async def client_id(self) -> int:
        """The server's CLIENT ID of the current connection (asked once per connection):
        ``CLIENT UNBLOCK <id>`` from another connection ends a blocking command on it."""
        proto = await self._connection()
        if proto.client_id is None:
            future: asyncio.Future[Any] = proto._loop.create_future()
            proto.send(_pack(("CLIENT", "ID")), future)
            reply = await future
            if isinstance(reply, _ReplyError):
                raise error(reply)
            proto.client_id = int(reply)
        return proto.client_id

    async def subscriber(self, on_message: Callable[[bytes], None]) -> Subscriber:
        """A new connection for SUBSCRIBE (wake-ups): ``on_message(channel)`` is called from
        the event loop for every message, without a task switch."""
        loop = asyncio.get_running_loop()
        proto = Subscriber(loop, self._endpoint.socket_timeout, on_message)
        await self._open(loop, proto)
        return proto

    def close(self) -> None:
        """Close the socket; waiting calls fail with a connection error."""
        proto, self._proto = self._proto, None
        if proto is not None:
            with contextlib.suppress(Exception):
                proto.close()


class Subscriber(_Protocol):
    """A connection in subscribed mode (RESP2): message pushes go to ``on_message``,
    subscribe confirmations and PING answers to the calls waiting for them."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        socket_timeout: float,
        on_message: Callable[[bytes], None],
    ) -> None:
        super().__init__(loop, socket_timeout)
        self._on_message = on_message
        self._subscribing = False
        #: Channels whose confirmation is awaited, each with the future of its SUBSCRIBE.
        self._confirm: dict[bytes, asyncio.Future[None]] = {}
        self._pongs: deque[asyncio.Future[None]] = deque()
        self.lost: asyncio.Future[None] = loop.create_future()

    def data_received(self, data: bytes) -> None:
        if not self._subscribing:  # the handshake's replies
            super().data_received(data)
            return
        reader = self._reader
        reader.feed(data)
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as exc:
                self._abort(rex.InvalidResponse(f"not a Redis reply: {exc}"))
                return
            if reply is False:
                return
            if not isinstance(reply, list) or not reply:
                self._abort(rex.InvalidResponse(f"unexpected reply in subscribed mode: {reply!r}"))
                return
            kind = reply[0]
            if kind == b"message":
                self._on_message(reply[1])
            elif kind == b"subscribe":
                future = self._confirm.pop(reply[1], None)
                if future is not None and not future.done():
                    future.set_result(None)
            elif kind == b"pong" and self._pongs:
                future = self._pongs.popleft()
                if not future.done():
                    future.set_result(None)

    async def subscribe(self, channels: Sequence[str]) -> None:
        """SUBSCRIBE to ``channels``; returns once the server confirmed every one."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise rex.ConnectionError("subscription connection closed")
        self._subscribing = True
        futures = []
        for channel in channels:
            future = self._confirm.get(channel.encode())
            if future is None:
                future = self._loop.create_future()
                self._confirm[channel.encode()] = future
            futures.append(future)
        self.transport.write(_pack(("SUBSCRIBE", *channels)))
        async with asyncio.timeout(self._timeout):
            for future in futures:
                await future

    def unsubscribe(self, channels: Sequence[str]) -> None:
        """UNSUBSCRIBE from ``channels`` (no wait: the confirmations are ignored)."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return
        self.transport.write(_pack(("UNSUBSCRIBE", *channels)))

    async def watch(self, ping_every: float) -> None:
        """Return when the connection is lost; PING every ``ping_every`` s so a peer that
        went silent is noticed (raises TimeoutError when a PING is not answered)."""
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(self.lost), ping_every)
                return
            except TimeoutError:
                pass
            if self.closed or self.transport is None or self.transport.is_closing():
                return
            pong: asyncio.Future[None] = self._loop.create_future()
            self._pongs.append(pong)
            self.transport.write(_pack(("PING",)))
            await asyncio.wait_for(pong, self._timeout)

    def _fail(self, exc: Exception) -> None:
        super()._fail(exc)
        for future in [*self._confirm.values(), *self._pongs]:
            if not future.done():
                future.set_exception(exc)
        self._confirm.clear()
        self._pongs.clear()
        if not self.lost.done():
            self.lost.set_result(None)


def scripts_to_load(scripts: Iterable[tuple[str, bytes]], known: set[str]) -> list[Command]:
    """``SCRIPT LOAD`` of the ``scripts`` (SHA, source) of a batch of calls that the server
    is not ``known`` to hold, to send ahead of the batch in the same write: a script refused
    with NOSCRIPT inside a batch would run after the calls that follow it (a claim before
    the completions it carries). A single call needs none: its refusal is sent again."""
    return [("SCRIPT", "LOAD", source) for sha, source in dict(scripts).items() if sha not in known]


def loaded(wire: Wire, loads: Sequence[Command], replies: list[Any]) -> None:
    """Take the replies of ``loads`` (:func:`scripts_to_load`) off the front of ``replies``
    and note the scripts on ``wire``; a refused load raises."""
    for reply in replies[: len(loads)]:
        if is_error(reply):
            raise error(reply)
        wire.scripts.add(reply.decode() if isinstance(reply, bytes) else str(reply))
    del replies[: len(loads)]


def is_error(reply: Any) -> bool:
    """Whether a reply of :meth:`Wire.call` is an error reply."""
    return isinstance(reply, _ReplyError)
