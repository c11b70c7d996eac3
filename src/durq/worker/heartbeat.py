"""One heartbeat for all leases of the process (W1): extends them, learns which were lost
or asked to cancel (W12), and refreshes the worker's row for the inspector (I5)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from durq.brokers.contract import Broker
from durq.brokers.views import WorkerInfo
from durq.worker.executor import CANCELLED, LOST, Executor
from durq.worker.service import PeriodicService

log = logging.getLogger("durq.worker")


class Heartbeat(PeriodicService):
    name = "heartbeat"

    def __init__(
        self,
        broker: Broker,
        executor: Executor,
        *,
        interval: float,
        lease_seconds: float,
        worker_info: Callable[[], WorkerInfo],
    ) -> None:
        super().__init__(interval)
        self.broker = broker
        self.executor = executor
        self.lease_seconds = lease_seconds
        self.worker_info = worker_info

    async def tick(self) -> None:
        leases = self.executor.leases()
        if leases:
            report = await self.broker.extend_leases(leases, self.lease_seconds)
            # The report names task ids: act only on the attempts whose leases were sent.
            # One that ended meanwhile may have been retried and claimed again by this worker.
            sent = {ref.token for ref in leases}
            for task_id in report.lost:
                if self.executor.cancel(task_id, LOST, tokens=sent):
                    log.warning("lease of task %s was lost; cancelling its handler", task_id)
            for task_id in report.cancel:
                if self.executor.cancel(task_id, CANCELLED, tokens=sent):
                    log.info("task %s: cancellation requested", task_id)
        await self.broker.register_worker(self.worker_info())
