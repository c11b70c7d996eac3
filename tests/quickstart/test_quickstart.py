"""The README's quickstart app, run by the testing kit: both handlers, their options honoured."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from examples import quickstart

import durq
import durq.testing
from durq.states import TaskState


@pytest.fixture
def durq_app() -> Iterator[durq.App]:
    with durq.testing.in_memory(quickstart.app) as app:
        yield app


async def test_both_handlers_run_and_keep_their_results_for_an_hour(
    durq_app: durq.App, durq_worker: durq.testing.TestWorker, capsys: pytest.CaptureFixture[str]
) -> None:
    mail = await quickstart.send_email.enqueue({"to": "a@b.c"}, task_id="welcome-1")
    report = await quickstart.build_report.enqueue({"rows": 7})
    assert report.queue == "low"

    ran = await durq_worker.drain()
    assert sorted(ran.outcomes) == [("email:send", "completed"), ("report:build", "completed")]
    assert "sending to a@b.c (attempt 1)" in capsys.readouterr().out

    # retention="1h": the results stay readable for an hour, then the janitor removes them.
    stored = await durq_app.inspector.get_task_info("default", mail.id)
    assert stored.state is TaskState.COMPLETED and stored.result == {"sent": True}
    assert (await durq_worker.get(report)).result == {"rows": 7}
    durq_worker.clock.advance("1h")
    await durq_worker.drain()
    assert await durq_worker.tasks() == []


async def test_a_task_id_is_taken_while_the_task_exists(
    durq_worker: durq.testing.TestWorker,
) -> None:
    await quickstart.send_email.enqueue({"to": "a@b.c"}, task_id="welcome-1")
    with pytest.raises(durq.TaskIDConflictError):
        await quickstart.send_email.enqueue({"to": "a@b.c"}, task_id="welcome-1")
