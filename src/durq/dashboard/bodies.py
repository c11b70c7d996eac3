"""Request bodies bounded in size and in time, whatever server runs the dashboard.

Starlette caps each form field (1 MB) and their number (1,000), not a body's total, and no
ASGI server times out a body trickled after complete headers. :class:`BodyLimit` does both
at the ASGI level: a body larger than its limit gets 413 and is never read past the limit
(``Content-Length`` or chunked alike); a body that has not arrived completely within
``timeout`` seconds gets 408. Both answers, and any answer sent before the body was read,
close the connection, so a client cannot keep it by sending more."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, NoReturn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Bytes of a body anyone may send: the login form, the static files.
PUBLIC_BODY_MAX = 16 * 1024
#: Bytes of an authenticated request's body (a selection of 500 task ids is about 100 KB).
BODY_MAX = 1024 * 1024
#: Seconds a request's body may take to arrive once its headers did.
BODY_TIMEOUT = 10.0


class BodyRefused(Exception):
    """Raised into the app when its body was refused; the answer has been sent already."""


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


def _announces_body(scope: Scope) -> bool:
    """Whether an HTTP/1 request says it has a body (HTTP/2 frames it without headers)."""
    length = _header(scope, b"content-length")
    return _header(scope, b"transfer-encoding") is not None or (
        length is not None and length.strip() not in (b"", b"0")
    )


def _close_header(scope: Scope) -> list[tuple[bytes, bytes]]:
    """``Connection: close`` for HTTP/1 (HTTP/2 forbids the header: its server closes the
    stream, not the connection)."""
    return [(b"connection", b"close")] if scope.get("http_version", "1.1") < "2" else []


class BodyLimit:
    """ASGI middleware bounding each HTTP request's body to ``limit_of(scope)`` bytes and
    ``timeout`` seconds.

    ``limit_of`` is asked when the app first reads the body, so the app may decide it from
    what it learnt meanwhile (the dashboard's guard: who is authenticated). ``headers`` are
    added to the 408 and 413 answers (the dashboard's security headers)."""

    def __init__(
        self,
        inner: ASGIApp,
        limit_of: Callable[[Scope], int],
        timeout: float = BODY_TIMEOUT,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.inner = inner
        self.limit_of = limit_of
        self.timeout = timeout
        self.headers = dict(headers or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout
        complete = False
        unread_body = _announces_body(scope)
        limit: int | None = None
        received = 0
        started = refused = False

        async def refuse(status: int, code: str, message: str) -> NoReturn:
            nonlocal refused
            if not started:
                body = json.dumps({"error": {"code": code, "message": message}}).encode()
                headers = [
                    *((k.encode(), v.encode()) for k, v in self.headers.items()),
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *_close_header(scope),
                ]
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
            refused = True
            raise BodyRefused(message)

        async def bounded_receive() -> Message:
            nonlocal complete, limit, received, unread_body
            if refused:
                return {"type": "http.disconnect"}
            if complete:
                return await receive()  # past the body: e.g. waiting for a disconnect
            if limit is None:
                limit = self.limit_of(scope)
                length = _header(scope, b"content-length")
                if length is not None and length.isdigit() and int(length) > limit:
                    await refuse(413, "body_too_large", f"the body exceeds {limit} bytes")
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                message = await asyncio.wait_for(receive(), max(remaining, 0.0))
            except TimeoutError:
                await refuse(
                    408,
                    "body_timeout",
                    f"the request body did not arrive within {self.timeout:g} s",
                )
            if message["type"] != "http.request":
                complete = True
                return message
            received += len(message.get("body", b""))
            if received > limit:
                await refuse(413, "body_too_large", f"the body exceeds {limit} bytes")
            complete = not message.get("more_body", False)
            unread_body = unread_body and not complete
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the app's own answer to the refusal: ours went out already
            if message["type"] == "http.response.start":
                started = True
                if unread_body:
                    # Answered before the body was read: drop the connection after the
                    # answer rather than let the client trickle the rest into it.
                    headers = list(message.get("headers", ()))
                    message["headers"] = [*headers, *_close_header(scope)]
            await send(message)

        try:
            await self.inner(scope, bounded_receive, tracked_send)
        except BodyRefused:
            if not refused:
                raise
