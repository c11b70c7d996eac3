"""FastAPI: the durq client opened by the lifespan, handed to handlers as a dependency; the
worker runs inside the web process here (drop ``worker=`` and run ``durq worker`` to split)."""

from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

import durq
from durq.web.asgi import durq_lifespan, enqueue_response, get_durq

tasks = durq.App()  # DURQ_BROKER_URL, else the embedded SQLite default


@tasks.task("email:send", retention="1h")
async def send_email(payload: dict[str, Any]) -> dict[str, Any]:
    return {"sent_to": payload["to"]}


api = FastAPI(lifespan=durq_lifespan(tasks, worker={"concurrency": 4}))


@api.post("/emails")
async def send(body: dict[str, Any], app: durq.App = Depends(get_durq)) -> JSONResponse:
    # 202 queued, 200 already_accepted (same task id), 503 when the broker is down.
    return await enqueue_response(app, send_email, {"to": body["to"]}, task_id=body.get("id"))
