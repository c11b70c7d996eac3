"""Serve an ASGI app with uvicorn on a free loopback port, in a thread, for real-browser and
real-HTTP tests."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class LiveServer:
    def __init__(self, asgi: Any) -> None:
        config = uvicorn.Config(
            asgi, host="127.0.0.1", port=0, lifespan="on", log_level="warning", access_log=False
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="live-dashboard", daemon=True)
        self.url = ""

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
