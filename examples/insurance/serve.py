"""Serving helpers: uvicorn on a pre-bound loopback socket (no port race), in a background
thread (tests) or on the current loop with our own signal handling (the demo)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket; port 0 picks a free one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signals to its owner (several servers share a process)."""

    def install_signal_handlers(self) -> None:  # older uvicorn
        return None

    def capture_signals(self) -> Any:  # newer uvicorn
        import contextlib

        return contextlib.nullcontext()


def make_server(app: Any, *, log_level: str = "warning") -> QuietServer:
    config = uvicorn.Config(app, log_level=log_level, lifespan="on", access_log=False)
    return QuietServer(config)


class BackgroundServer:
    """An ASGI app served by uvicorn on a free loopback port, in its own thread and loop."""

    def __init__(
        self,
        app: Any,
        *,
        port: int = 0,
        sock: socket.socket | None = None,
        log_level: str = "warning",
    ) -> None:
        # A socket bound beforehand gives the URL before the app exists (its callback URL).
        self.sock = sock or bind(port=port)
        self.port: int = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(app, log_level=log_level)
        self._thread = threading.Thread(target=self._run, name=f"uvicorn-{self.port}", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve(sockets=[self.sock]))
        except BaseException as exc:  # surfaced by start()
            self.error = exc

    def start(self, timeout: float = 20.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server failed to start: {self.error!r}")
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful: stop taking requests, run the lifespan shutdown (the worker drains)."""
        self.server.should_exit = True
        self._thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
