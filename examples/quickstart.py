"""The README's 30-second tutorial.

    durq worker examples.quickstart:app &
    durq enqueue email:send --payload '{"to": "a@b.c"}' --task-id welcome-1 --app examples.quickstart:app
    durq task get welcome-1 --queue default

``--app`` gives the enqueued task the options its ``@app.task`` declares (here: retention,
so the completed task and its result stay inspectable for an hour).
"""

from __future__ import annotations

import time
from typing import Any

import durq

app = durq.App()  # broker: argument, else DURQ_BROKER_URL, else sqlite:///durq.sqlite3


@app.task("email:send", max_retry=5, timeout=30, retention="1h")
async def send_email(payload: dict[str, Any], ctx: durq.TaskContext) -> dict[str, Any]:
    """An async handler: runs on the worker's event loop."""
    print(f"sending to {payload['to']} (attempt {ctx.attempt})")
    return {"sent": True}


@app.task("report:build", queue="low", retention="1h")
def build_report(payload: dict[str, Any]) -> dict[str, Any]:
    """A sync handler: runs in a thread, so it never blocks the event loop."""
    time.sleep(0.1)  # crunch numbers here
    return {"rows": payload.get("rows", 0)}
