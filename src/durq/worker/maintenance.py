"""The broker-side housekeeping services: promoter, rescuer and janitor."""

from __future__ import annotations

import logging

from durq import lifecycle
from durq.brokers.contract import Broker
from durq.brokers.params import ArchivedRetention
from durq.states import TaskState
from durq.worker.service import PeriodicService

log = logging.getLogger("durq.worker")


class Promoter(PeriodicService):
    """Moves due scheduled and retry tasks to pending (E2)."""

    name = "promoter"

    def __init__(self, broker: Broker, interval: float) -> None:
        super().__init__(interval)
        self.broker = broker

    async def tick(self) -> None:
        await self.broker.promote_due()


class Rescuer(PeriodicService):
    """Recovers tasks whose worker died: by expired lease, never by elapsed time (W1).

    It always runs; a task lost ``max_lost`` times is archived as a poison pill."""

    name = "rescuer"

    def __init__(self, broker: Broker, interval: float, max_lost: int) -> None:
        super().__init__(interval)
        self.broker = broker
        self.max_lost = max_lost

    async def tick(self) -> None:
        for task in await lifecycle.rescue_expired(self.broker, self.max_lost):
            extra = {
                "task_id": task.id,
                "task_type": task.type,
                "queue": task.queue,
                "attempt": task.retried,
            }
            if task.state is TaskState.ARCHIVED:
                log.error(
                    "task archived: id=%s type=%s queue=%s attempts=%d last_error=%r",
                    task.id,
                    task.type,
                    task.queue,
                    task.retried,
                    task.last_error,
                    extra=extra,
                )
            else:
                log.warning("task %s rescued after its lease expired", task.id, extra=extra)


#: Keep every archived task (a janitor built without the app's policy).
KEEP_ARCHIVED = ArchivedRetention(None)


class Janitor(PeriodicService):
    """Deletes completed tasks whose retention has passed, and archived tasks past their
    queue's archived retention (``archived``; default none deleted), in bounded batches."""

    name = "janitor"
    batch = 1000

    def __init__(
        self, broker: Broker, interval: float, archived: ArchivedRetention = KEEP_ARCHIVED
    ) -> None:
        super().__init__(interval)
        self.broker = broker
        self.archived = archived

    async def tick(self) -> None:
        while await self.broker.delete_expired(self.batch) >= self.batch:
            pass
        if self.archived.keeps_all:
            return
        while await self.broker.delete_archived(self.archived, self.batch) >= self.batch:
            pass
