"""Redis Cluster on the same transport: one :class:`~durq.brokers.redis.wire.Wire` per node,
each command routed to the master that serves its key's hash slot.

* The slot map comes from ``CLUSTER SLOTS`` of any reachable node (the URL's seeds first,
  then every node seen since), and is read again after a ``MOVED`` reply or a lost node.
* A ``MOVED`` reply is re-sent to the node it names; ``ASK`` (a slot being migrated) goes to
  the named node once, preceded by ``ASKING``; ``TRYAGAIN`` and ``CLUSTERDOWN`` (a failover
  in progress) and a refused or dropped connection are retried with a backoff until the
  retry budget (``cluster_retry`` seconds, default 10) runs out, then fail as usual.
* ``EVALSHA`` refused with ``NOSCRIPT`` (each node has its own script cache; a promoted
  replica may not have a script yet) loads the script on that node and is re-sent.
* Commands of one call are grouped by node and written to every node at once; the replies
  come back in the callers' order. ``MULTI`` … ``EXEC`` goes to one node as a unit.
* With ``wait_replicas=N`` a batch with a confirmed script (task writes: enqueue, outcomes,
  inspector moves) is followed by ``WAIT N <wait_timeout ms>`` on its node: the write is
  acknowledged once N replicas have it, else the call fails (:class:`ReplicationError`).

Wake-ups use the classic ``PUBLISH`` of the scripts: a cluster forwards it to every node,
so one subscription on any node hears every queue (see docs/brokers/redis.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from redis import exceptions as rex

from durq.brokers.redis.wire import (
    Command,
    Endpoint,
    Subscriber,
    Wire,
    error,
    is_error,
    loaded,
    scripts_to_load,
)

#: Hash slots of a Redis Cluster.
SLOTS = 16384
#: Seconds a call keeps retrying through a topology change or a failover.
DEFAULT_RETRY = 10.0
#: Milliseconds ``WAIT`` waits for the replicas of ``wait_replicas``.
DEFAULT_WAIT_TIMEOUT_MS = 1000
#: Backoff between retries (seconds).
_BACKOFF = (0.05, 0.5)

Address = tuple[str, int]


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_TABLE = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the hash of Redis Cluster key slots."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _TABLE[((crc >> 8) ^ byte) & 0xFF]
    return crc


def key_slot(key: str | bytes) -> int:
    """The hash slot of ``key``: of its hash tag (the text between the first ``{`` and the
    next ``}``) when that is not empty, as Redis computes it."""
    raw = key.encode() if isinstance(key, str) else key
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            return _tag_slot(raw[start + 1 : end])
    return crc16(raw) % SLOTS


@lru_cache(maxsize=4096)
def _tag_slot(tag: bytes) -> int:
    # Queue keys share a few hash tags (the queue names): CRC16 in Python once per queue.
    return crc16(tag) % SLOTS


#: Commands without a key: any master answers them.
_KEYLESS = frozenset(
    {"INFO", "TIME", "PING", "CONFIG", "SCRIPT", "CLUSTER", "PUBLISH", "WAIT", "ECHO", "DBSIZE"}
)


def command_slot(command: Command) -> int | None:
    """The hash slot a command must go to; ``None`` for a command without a key."""
    name = str(command[0]).upper()
    if name in ("EVALSHA", "EVAL"):
        return key_slot(str(command[3])) if int(command[2]) else None
    if name in _KEYLESS or len(command) < 2:
        return None
    key = command[1]
    return key_slot(key if isinstance(key, (str, bytes)) else str(key))


class ReplicationError(rex.RedisError):
    """A write was done on its master but fewer replicas than ``wait_replicas`` confirmed it
    within ``wait_timeout``: a failover now could lose it."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterOptions:
    """The cluster's URL options."""

    #: Seconds a call keeps retrying through a failover or a slot move.
    retry: float = DEFAULT_RETRY
    #: Replicas that must confirm each write (``WAIT``); 0: asynchronous replication.
    wait_replicas: int = 0
    #: Milliseconds ``WAIT`` waits for them.
    wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS


def _redirect(reply: Any) -> tuple[str, str] | None:
    """``(code, text)`` of a cluster redirection or transient error reply, else ``None``."""
    if not is_error(reply):
        return None
    text = str(reply)
    code = text.split(" ", 1)[0]
    if code in ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"):
        return code, text
    return None


def _address(text: str) -> Address:
    """``host:port`` of a MOVED/ASK reply (``MOVED 3999 127.0.0.1:6381``)."""
    host, _, port = text.rsplit(" ", 1)[1].rpartition(":")
    return host, int(port)


class ClusterWire:
    """The pipelined connections of one broker object to a Redis Cluster; the same calls as
    :class:`~durq.brokers.redis.wire.Wire` (replies in order, error replies as values)."""

    def __init__(
        self,
        seeds: Sequence[Address],
        endpoint: Endpoint,
        *,
        scripts: Mapping[str, bytes],
        options: ClusterOptions | None = None,
        confirmed: frozenset[str] = frozenset(),
    ) -> None:
        if not seeds:
            raise ValueError("a Redis Cluster URL needs at least one host:port")
        self._seeds = list(seeds)
        self._endpoint = dataclasses.replace(endpoint, db=0, path=None)
        self._scripts = dict(scripts)
        #: SHAs of the scripts whose writes ``wait_replicas`` confirms (see storage.py).
        self._confirmed = confirmed
        self.options = options or ClusterOptions()
        self._options_wait = self.options.wait_replicas
        self._wires: dict[Address, Wire] = {}
        #: The master of each slot (``None`` until the first map is read).
        self._slots: list[Address | None] = [None] * SLOTS
        self._masters: list[Address] = []
        #: When a node last failed to answer (loop time): asked last for the map.
        self._down: dict[Address, float] = {}
        self._refreshing: asyncio.Future[None] | None = None
        self._refresh_loop: asyncio.AbstractEventLoop | None = None

    # -- topology -------------------------------------------------------------------------

    def _wire(self, address: Address) -> Wire:
        wire = self._wires.get(address)
        if wire is None:
            ep = dataclasses.replace(self._endpoint, host=address[0], port=address[1])
            wire = self._wires[address] = Wire(ep, retries=0)
        return wire

    @property
    def masters(self) -> list[Address]:
        """The masters of the last slot map read."""
        return list(self._masters)

    async def refresh(self) -> None:
        """Read the slot map again (one read at a time; callers meanwhile wait for it)."""
        loop = asyncio.get_running_loop()
        if self._refreshing is not None and self._refresh_loop is loop:
            await asyncio.shield(self._refreshing)
            return
        future: asyncio.Future[None] = loop.create_future()
        self._refreshing, self._refresh_loop = future, loop
        try:
            await self._read_map()
            future.set_result(None)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters get it through the shield
            raise
        finally:
            self._refreshing = None

    async def _read_map(self) -> None:
        # Known masters first (the usual case: one moved slot), then the seeds, then every
        # other node ever seen (replicas promoted since the URL was written).
        candidates = self._candidates()
        last: Exception | None = None
        for address in candidates:
            try:
                reply = await self._wire(address).call(("CLUSTER", "SLOTS"))
            except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
                self._down[address] = asyncio.get_running_loop().time()
                last = exc
                continue
            self._down.pop(address, None)
            if is_error(reply):
                last = error(reply)
                continue
            slots: list[Address | None] = [None] * SLOTS
            masters: dict[Address, None] = {}
            for row in reply:
                start, end, master = int(row[0]), int(row[1]), row[2]
                host = master[0].decode() if master[0] else address[0]
                node = (address[0] if host in ("", "?") else host, int(master[1]))
                masters[node] = None
                for node_address in row[3:]:
                    replica_host = node_address[0].decode() or address[0]
                    self._wire((replica_host, int(node_address[1])))  # known for later
                slots[start : end + 1] = [node] * (end - start + 1)
            if not masters:
                last = rex.ConnectionError(f"{address[0]}:{address[1]} serves no slot yet")
                continue
            self._slots, self._masters = slots, list(masters)
            if address not in masters:
                # A seed that is a replica answered: no connection kept to it (the budget
                # is one per master).
                self._wire(address).close()
            return
        raise rex.ConnectionError(f"no node of the Redis Cluster answers: {last}")

    def _candidates(self) -> list[Address]:
        """Nodes to ask for the map: known masters, the URL's nodes, every node seen; those
        that failed last go last (a dead host may take the connect timeout to refuse)."""
        nodes = list(dict.fromkeys([*self._masters, *self._seeds, *self._wires]))
        return sorted(nodes, key=lambda a: self._down.get(a, 0.0))

    async def _node_for(self, slot: int | None) -> Address:
        if not self._masters:
            await self.refresh()
        if slot is None:
            return self._masters[0]
        node = self._slots[slot]
        if node is None:
            await self.refresh()
            node = self._slots[slot]
            if node is None:
                raise rex.ConnectionError(f"no node of the Redis Cluster serves slot {slot}")
        return node

    # -- calls ----------------------------------------------------------------------------

    @staticmethod
    def _units(commands: Sequence[Command]) -> list[tuple[list[int], int | None]]:
        """Commands as units that go to one node together: one command, or MULTI … EXEC
        (routed by its first command with a key); each with its slot."""
        units: list[tuple[list[int], int | None]] = []
        i = 0
        while i < len(commands):
            if str(commands[i][0]).upper() == "MULTI":
                j = i
                slot = None
                while j + 1 < len(commands) and str(commands[j][0]).upper() != "EXEC":
                    j += 1
                    if slot is None:
                        slot = command_slot(commands[j])
                units.append((list(range(i, j + 1)), slot))
                i = j + 1
            else:
                units.append(([i], command_slot(commands[i])))
                i += 1
        return units

    async def call(self, command: Command) -> Any:
        """One command; its reply (error replies come back as values)."""
        node = self._slots[slot] if (slot := command_slot(command)) is not None else None
        if node is not None and (self._options_wait == 0 or command[0] != "EVALSHA"):
            # The common case, without grouping: one command to the master of a known slot.
            try:
                reply = await self._wire(node).call(command)
            except (rex.ConnectionError, OSError):
                pass  # the general path retries it within the budget
            else:
                if _redirect(reply) is None and not (
                    is_error(reply) and str(reply).startswith("NOSCRIPT")
                ):
                    return reply
        return (await self.call_many([command]))[0]

    async def call_many(self, commands: Sequence[Command]) -> list[Any]:
        """Several commands, each on the master of its slot (one write per node, all nodes at
        once); their replies in order. Redirections and failovers are retried within the
        budget; error replies come back as values."""
        if not commands:
            return []
        loop = asyncio.get_running_loop()
        results: list[Any] = [None] * len(commands)
        todo: list[tuple[list[int], int | None, Address | None]] = [
            (indexes, slot, None) for indexes, slot in self._units(commands)
        ]
        deadline: float | None = None
        delay = _BACKOFF[0]
        while True:
            by_node: dict[Address, list[tuple[list[int], int | None, bool]]] = {}
            for indexes, slot, ask in todo:
                node = ask or await self._node_for(slot)
                by_node.setdefault(node, []).append((indexes, slot, ask is not None))
            nodes = list(by_node)
            outcomes: list[list[list[Any]] | BaseException]
            if len(nodes) == 1:  # no task per node when one node has them all
                try:
                    outcomes = [await self._send(nodes[0], commands, by_node[nodes[0]])]
                except Exception as exc:
                    outcomes = [exc]
            else:
                outcomes = await asyncio.gather(
                    *[self._send(node, commands, by_node[node]) for node in nodes],
                    return_exceptions=True,
                )
            again: list[tuple[list[int], int | None, Address | None]] = []
            refresh = False
            failure: BaseException | None = None
            for node, outcome in zip(nodes, outcomes, strict=True):
                units = by_node[node]
                if isinstance(outcome, BaseException):
                    if not isinstance(outcome, (rex.ConnectionError, OSError)):
                        raise outcome
                    # The node is gone (a failover?) or refused: read the map, retry.
                    failure, refresh = outcome, True
                    self._down[node] = loop.time()
                    again += [(indexes, slot, None) for indexes, slot, _ in units]
                    continue
                for (indexes, slot, _), replies in zip(units, outcome, strict=True):
                    redirect = next((r for r in map(_redirect, replies) if r is not None), None)
                    if redirect is None:
                        for i, reply in zip(indexes, replies, strict=True):
                            results[i] = reply
                        continue
                    code, text = redirect
                    if code == "ASK":
                        again.append((indexes, slot, _address(text)))
                        continue
                    if code == "MOVED":
                        moved_slot = int(text.split(" ")[1])
                        self._slots[moved_slot] = _address(text)
                        refresh = True  # other slots may have moved too
                    failure = rex.ConnectionError(text)
                    # Error replies are kept: they are the answer if the budget runs out.
                    for i, reply in zip(indexes, replies, strict=True):
                        results[i] = reply
                    again.append((indexes, slot, None))
            if not again:
                return results
            now = loop.time()
            if deadline is None:
                deadline = now + self.options.retry
            if now >= deadline:
                if failure is not None and all(results[i] is None for u in again for i in u[0]):
                    raise failure
                return results
            if refresh:
                # A slot map read that fails (every node down for a moment) is retried too.
                with contextlib.suppress(rex.ConnectionError, rex.TimeoutError, OSError):
                    await self.refresh()
            if any(ask is None for _, _, ask in again):
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(_BACKOFF[1], delay * 2)
            todo = again

    async def _send(
        self, node: Address, commands: Sequence[Command], units: list[tuple[list[int], Any, bool]]
    ) -> list[list[Any]]:
        """Write ``units`` to ``node`` in one batch; each unit's replies (ASKING's dropped).
        Scripts the node does not know are loaded there and their calls sent again."""
        batch: list[Command] = []
        writes = False
        for indexes, _, asking in units:
            if asking:
                batch.append(("ASKING",))
            for i in indexes:
                command = commands[i]
                batch.append(command)
                writes = writes or (command[0] == "EVALSHA" and command[1] in self._confirmed)
        wait = self.options.wait_replicas if writes else 0
        if wait:
            batch.append(("WAIT", wait, self.options.wait_timeout_ms))
        # Scripts this node may not hold are loaded ahead in the same write: a NOSCRIPT
        # refusal in a batch would run the calls after it before the refused one is sent
        # again (a claim before the completions it carries).
        wire = self._wire(node)
        loads: list[Command] = []
        if len(batch) > 1:
            shas = (str(c[1]) for c in batch if c[0] == "EVALSHA")
            used = ((sha, self._scripts[sha]) for sha in shas if sha in self._scripts)
            loads = scripts_to_load(used, wire.scripts)
        batch[:0] = loads
        replies = await wire.call_many(batch)
        loaded(wire, loads, replies)
        if wait:
            acked = replies.pop()
            if is_error(acked) or int(acked) < wait:
                raise ReplicationError(
                    f"{node[0]}:{node[1]} wrote it, but {acked} of {wait} replicas confirmed "
                    f"it within {self.options.wait_timeout_ms} ms"
                )
        out: list[list[Any]] = []
        pos = 0
        for indexes, _, asking in units:
            if asking:
                pos += 1
            unit_replies = replies[pos : pos + len(indexes)]
            pos += len(indexes)
            out.append(unit_replies)
        await self._reload_scripts(wire, commands, units, out)
        return out

    async def _reload_scripts(
        self,
        wire: Wire,
        commands: Sequence[Command],
        units: list[tuple[list[int], Any, bool]],
        out: list[list[Any]],
    ) -> None:
        """Load the scripts a node refused with NOSCRIPT there and re-send those calls (they
        did nothing)."""
        missing: list[tuple[int, int]] = []  # (unit, position in unit)
        for u, unit_replies in enumerate(out):
            for p, reply in enumerate(unit_replies):
                if is_error(reply) and str(reply).startswith("NOSCRIPT"):
                    missing.append((u, p))
        if not missing:
            return
        shas = {str(commands[units[u][0][p]][1]) for u, p in missing}
        for sha in shas:
            source = self._scripts.get(sha)
            if source is not None:
                reply = await wire.call(("SCRIPT", "LOAD", source))
                if is_error(reply):
                    raise error(reply)
                wire.scripts.add(sha)
        batch: list[Command] = []
        where: list[int] = []  # the index in ``batch`` of each re-sent call
        for u, p in missing:
            if units[u][2]:
                batch.append(("ASKING",))
            where.append(len(batch))
            batch.append(commands[units[u][0][p]])
        again = await wire.call_many(batch)
        for (u, p), at in zip(missing, where, strict=True):
            out[u][p] = again[at]

    async def scan(self, match: str) -> list[bytes]:
        """Every key matching ``match`` on every master (SCAN is per node on a cluster)."""
        await self.refresh()
        keys: list[bytes] = []
        for address in self._masters:
            cursor: Any = b"0"
            while True:
                reply = await self._wire(address).call(
                    ("SCAN", cursor, "MATCH", match, "COUNT", 1000)
                )
                if is_error(reply):
                    raise error(reply)
                cursor, found = reply
                keys += found
                if cursor in (b"0", 0, "0"):
                    break
        return keys

    # -- subscriptions and closing --------------------------------------------------------

    async def subscriber(self, on_message: Callable[[bytes], None]) -> Subscriber:
        """A SUBSCRIBE connection to any reachable node: a cluster forwards every PUBLISH to
        every node, so one subscription hears every queue."""
        with contextlib.suppress(rex.ConnectionError, rex.TimeoutError, OSError):
            await self.refresh()
        last: Exception | None = None
        for address in self._candidates():
            try:
                return await self._wire(address).subscriber(on_message)
            except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
                last = exc
        raise rex.ConnectionError(f"no node of the Redis Cluster answers: {last}")

    def close(self) -> None:
        """Close every node's connection."""
        for wire in self._wires.values():
            wire.close()
