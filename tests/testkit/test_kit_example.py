"""The testing kit's promise, as written for users: retries an hour apart, no real sleeping."""

from __future__ import annotations

import pytest

import durq
import durq.testing
from durq.states import TaskState


# A real sleep through the hour of the schedule would trip this guard.
@pytest.mark.timeout(10)
async def test_polling_task_with_retries_moved_by_the_clock() -> None:
    # fmt: off
    # -- verbatim, as the kit describes it ------------------------------------------------------
    app = durq.App("memory://")
    @app.task("t:poll", max_retry=5, retry_delay=lambda n, e: 60)
    async def poll(payload, ctx):
        if ctx.retried < 2:
            raise durq.NotReady("partner still working")
        return {"ok": True}
    async with durq.testing.worker(app) as w:
        info = await app.enqueue("t:poll", {}, process_in=3600)
        await w.drain()                       # not due yet: nothing runs
        w.clock.advance(3600); await w.drain()  # first attempt: NotReady  # noqa: E702
        w.clock.advance(60); await w.drain()  # noqa: E702
        w.clock.advance(60); await w.drain()  # completed  # noqa: E702
        t = await app.inspector.get_task_info(info.queue, info.id)
    # -------------------------------------------------------------------------------------------
    # fmt: on
    assert t.state is TaskState.COMPLETED
    assert t.retried == 2 and t.result == {"ok": True}
    assert t.last_error == "partner still working"
    assert t.enqueued_at is not None and t.completed_at is not None
    assert (t.completed_at - t.enqueued_at).total_seconds() == 3600 + 60 + 60
