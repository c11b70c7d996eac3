"""Flask: ``init_app`` attaches the durq client (``get_durq()`` finds it) and can run a
worker thread in the web process; production runs ``durq worker`` beside the web server."""

from typing import Any

from flask import Flask, request

import durq
from durq.web.wsgi import enqueue_response, get_durq, init_app

tasks = durq.App()  # DURQ_BROKER_URL, else the embedded SQLite default


@tasks.task("report:build", retention="1h")
def build_report(payload: dict[str, Any]) -> dict[str, Any]:
    return {"rows": payload["rows"] * 2}


def create_app(*, worker: bool = False) -> Flask:
    flask_app = Flask(__name__)
    init_app(flask_app, tasks, worker=worker)

    @flask_app.post("/reports")
    def report() -> Any:
        rows = int((request.get_json(silent=True) or {}).get("rows", 0))
        return enqueue_response(get_durq(), build_report, {"rows": rows})

    return flask_app
