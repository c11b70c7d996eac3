"""A real webhook receiver on loopback for the delivery tests (no mocks of HTTP)."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: A Standard Webhooks secret: ``whsec_`` and the base64 of the key.
SECRET = "whsec_" + base64.b64encode(b"durq-test-webhook-key-0123456789").decode()
#: The receiver listens on loopback: deliveries there need the allow-list.
LOOPBACK = "127.0.0.1/32"


@dataclass
class Receiver:
    """Answers 500 to the first ``fail`` requests, then ``status`` (with ``location`` as its
    Location header when set); records every request."""

    fail: int = 0
    status: int = 200
    location: str | None = None
    requests: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)
    url: str = ""
    port: int = 0
    got: threading.Event = field(default_factory=threading.Event)


@contextmanager
def serve_receiver() -> Iterator[Receiver]:
    """Run a :class:`Receiver` on an ephemeral loopback port for the duration."""
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.requests.append((body, dict(self.headers.items())))
            failing = len(state.requests) <= state.fail
            self.send_response(500 if failing else state.status)
            if state.location is not None and not failing:
                self.send_header("Location", state.location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            if not failing and state.status < 300:
                state.got.set()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.port = server.server_address[1]
    state.url = f"http://127.0.0.1:{state.port}/hooks/durq"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


async def wait_event(event: threading.Event, timeout: float = 15.0) -> None:
    """Wait (without blocking the loop) until the receiver accepted a delivery."""
    deadline = time.monotonic() + timeout
    while not event.is_set():
        assert time.monotonic() < deadline, "no successful delivery in time"
        await asyncio.sleep(0.02)
