"""How ``durq dash`` serves the dashboard: uvicorn, with timeouts on slow or idle clients and
forwarded headers honoured only from the proxies you name.

Request bodies are bounded (size, and time after the headers) by the dashboard app itself
(:mod:`durq.dashboard.bodies`), so that holds under any server, not only this one."""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

#: Seconds a connection may take to send a request's headers (or stay silent before it).
HEADER_TIMEOUT = 10.0
#: Seconds an idle keep-alive connection stays open between requests.
KEEP_ALIVE_TIMEOUT = 5


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing connections that do not complete a request's headers
    within ``header_timeout`` (uvicorn itself waits forever for partial headers)."""

    header_timeout = HEADER_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            self._arm()  # a request has started but its headers are not complete yet
        elif self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._expired)

    def _expired(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def server_config(
    asgi: Any,
    *,
    host: str,
    port: int,
    log_level: str = "info",
    forwarded_allow_ips: str | None = None,
    header_timeout: float = HEADER_TIMEOUT,
    keep_alive_timeout: int = KEEP_ALIVE_TIMEOUT,
) -> uvicorn.Config:
    """The uvicorn configuration of ``durq dash``: no ``Server`` header, timeouts on slow
    and idle clients, and ``X-Forwarded-For``/``X-Forwarded-Proto`` read only from the
    comma-separated ``forwarded_allow_ips`` (none by default)."""
    protocol = type("DashProtocol", (HeaderTimeoutProtocol,), {"header_timeout": header_timeout})
    return uvicorn.Config(
        asgi,
        host=host,
        port=port,
        log_level=log_level.lower(),
        lifespan="on",
        server_header=False,
        http=protocol,
        timeout_keep_alive=keep_alive_timeout,
        proxy_headers=bool(forwarded_allow_ips),
        forwarded_allow_ips=forwarded_allow_ips or None,
    )
