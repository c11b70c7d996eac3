"""A small service for docs/testing.md: a FastAPI and a Flask front end that enqueue, a task
that polls a partner until its quote is ready, a continuation, and a daily report."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI
from flask import Flask, request
from pydantic import BaseModel

import durq
from durq.web.asgi import durq_lifespan, get_durq

app = durq.App()  # DURQ_BROKER_URL in production; the tests point it at memory://
SENT: list[dict[str, Any]] = []  # what quote:notify "mailed" (a real service would send it)


class Partner:
    """Stands for the partner's quote API: a quote is ready after ``polls`` questions."""

    def __init__(self, polls: int = 2) -> None:
        self.polls = polls
        self.asked = 0

    def quote(self, ref: str) -> float | None:
        self.asked += 1
        return None if self.asked <= self.polls else 99.5


partner = Partner()


@app.task("quote:poll", max_retry=10, retry_delay=lambda retried, exc: 300)
async def poll_quote(payload: dict[str, Any]) -> dict[str, Any]:
    price = partner.quote(payload["ref"])
    if price is None:
        raise durq.NotReady("the partner is still pricing")  # retried in 5 minutes
    return {"ref": payload["ref"], "price": price}


@app.task("quote:notify")
async def notify(payload: dict[str, Any]) -> None:
    # A continuation: runs once quote:poll completed, with its result.
    SENT.append({"to": payload["payload"]["email"], "price": payload["result"]["price"]})


@app.periodic("0 6 * * *", type="report:daily", tz="UTC")
async def daily_report(ctx: durq.TaskContext) -> dict[str, int]:
    return {"quotes_sent": len(SENT)}


class QuoteRequest(BaseModel):
    ref: str
    email: str


# As docs/web.md shows: the worker runs inside the web process, handlers get the app.
api = FastAPI(lifespan=durq_lifespan(app, worker=True))


@api.post("/quotes", status_code=202)
async def ask_quote(body: QuoteRequest, client: durq.App = Depends(get_durq)) -> dict[str, str]:
    info = await client.enqueue(
        "quote:poll", {"ref": body.ref, "email": body.email}, then="quote:notify"
    )
    return {"task_id": info.id}


web = Flask(__name__)


@web.post("/quotes")
def ask_quote_wsgi() -> tuple[dict[str, str], int]:
    body = request.get_json()
    info = app.enqueue_sync(
        "quote:poll", {"ref": body["ref"], "email": body["email"]}, then="quote:notify"
    )
    return {"task_id": info.id}, 202
