"""Acknowledges completed tasks in batches without delaying a lone one.

The first ack goes out at once; acks that arrive while it is in flight ride together in the
next ``complete_many`` round trip. Under load that is one round trip for many tasks; when idle
it is exactly one call per task, as before."""

from __future__ import annotations

import asyncio

from durq.brokers.base import Broker, CompleteParams
from durq.errors import BrokerError


class Acker:
    def __init__(self, broker: Broker, max_batch: int = 500) -> None:
        self.broker = broker
        self.max_batch = max_batch
        self._waiting: list[tuple[CompleteParams, asyncio.Future[bool]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def complete(self, params: CompleteParams) -> bool:
        """Complete one task; ``False`` if its lease is no longer held."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((params, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="durq-acker")
        # Shielded: a cancelled caller must not cancel the batch other tasks ride in.
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        while self._waiting:
            batch = self._waiting[: self.max_batch]
            del self._waiting[: self.max_batch]
            try:
                held = await self.broker.complete_many([params for params, _ in batch])
                if len(held) != len(batch):  # a broker bug must not leave callers waiting
                    raise BrokerError(
                        f"complete_many answered {len(held)} results for {len(batch)} tasks",
                        operation="acker.complete_many",
                    )
            except Exception as exc:  # each caller decides whether to retry
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), ok in zip(batch, held, strict=True):
                if not future.done():
                    future.set_result(ok)
