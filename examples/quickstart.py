"""The README's 30-second tutorial.

durq worker examples.quickstart:app                      # one shell
durq enqueue email:send --payload '{"to": "a@b.c"}'       # another shell
durq task ls --queue default --state completed
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import durq

app = durq.App()  # broker: DURQ_BROKER_URL, else sqlite:///durq.sqlite3


@dataclass
class SendEmail:
    """The payload of ``email:send``, validated when the task is enqueued."""

    to: str
    subject: str = "hello"


@app.task("email:send", max_retry=5, timeout=30, retention="1h")
async def send_email(payload: SendEmail, ctx: durq.TaskContext) -> dict[str, str]:
    """An async handler: runs on the worker's event loop."""
    await asyncio.sleep(0.05)  # talk to the mail provider here
    return {"sent_to": payload.to, "attempt": str(ctx.attempt)}


@app.task("report:build", queue="low", retention="1h")
def build_report(payload: dict[str, int]) -> dict[str, int]:
    """A sync handler: runs in a thread, so it never blocks the loop."""
    time.sleep(0.1)  # crunch numbers here
    return {"rows": payload.get("rows", 0)}
