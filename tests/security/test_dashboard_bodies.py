"""Request bodies through a real server: bounded in size before and after authentication,
bounded in time, and never kept open by a client that trickles what nobody reads."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlencode

import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durq
from durq.dashboard import DashboardSettings, create_dashboard
from durq.dashboard.server import server_config

from .test_dashboard_hardening import BEARER, TOKEN, serve

FORM = b"Content-Type: application/x-www-form-urlencoded\r\n"


def connect(port: int, head: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(head)
    return sock


def answer_of(sock: socket.socket, limit: float = 30.0) -> tuple[int, bytes, bool]:
    """The status and body of the server's answer, and whether it then closed the
    connection (within ``limit`` seconds, generous: only a hung connection fails)."""
    sock.settimeout(limit)
    data, closed = b"", False
    try:
        while chunk := sock.recv(65536):
            data += chunk
        closed = True
    except ConnectionResetError:
        closed = True  # closed with our unread bytes in its buffer: a reset, not a FIN
    except TimeoutError:
        pass
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, body, closed


def trickle(sock: socket.socket, seconds: float = 40.0) -> threading.Thread:
    """Send one byte every 0.2 s until the server closes (or ``seconds`` pass)."""

    def run() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                sock.sendall(b"a")
            except OSError:
                return
            time.sleep(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def dash_config(asgi: object) -> uvicorn.Config:
    return server_config(asgi, host="127.0.0.1", port=0, log_level="warning")


def plain_uvicorn(asgi: object) -> uvicorn.Config:
    # Any server: uvicorn's own defaults, without durq dash's protocol.
    return uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="warning")


BODIES = {
    "content-length": b"Content-Length: 100000000\r\n\r\n" + b"token=x&" * 128,
    "chunked": b"Transfer-Encoding: chunked\r\n\r\n" + (b"1000\r\n" + b"a=b&" * 1024 + b"\r\n") * 8,
    "many fields": b"Content-Length: 40000\r\n\r\n" + b"a=b&" * 10000,
}


@pytest.mark.parametrize("body", list(BODIES))
def test_an_oversized_login_body_gets_413_and_is_not_read(app: durq.App, body: str) -> None:
    with serve(dash_config(create_dashboard(app, token=TOKEN))) as port:
        # The Content-Length case never sends what it announces: the answer comes anyway.
        sock = connect(port, b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\n" + FORM + BODIES[body])
        status, answer, closed = answer_of(sock)
        sock.close()
    assert status == 413, answer
    assert json.loads(answer)["error"]["code"] == "body_too_large"
    assert closed


@pytest.mark.parametrize("config", [dash_config, plain_uvicorn])
def test_a_trickled_body_gets_408_and_the_connection_closes(
    app: durq.App, config: Callable[[object], uvicorn.Config]
) -> None:
    settings = DashboardSettings(body_timeout=1.0)
    with serve(config(create_dashboard(app, token=TOKEN, settings=settings))) as port:
        sock = connect(
            port,
            b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\n" + FORM + b"Content-Length: 900\r\n\r\n",
        )
        sender = trickle(sock)
        status, answer, closed = answer_of(sock)
        sock.close()
        sender.join()
    assert status == 408, answer
    assert json.loads(answer)["error"]["code"] == "body_timeout"
    assert closed


def test_a_body_nobody_reads_does_not_keep_the_connection(app: durq.App) -> None:
    """Refused before its body is read (no credentials): the answer closes the connection,
    so trickling the rest holds nothing."""
    with serve(plain_uvicorn(create_dashboard(app, token=TOKEN))) as port:
        sock = connect(
            port,
            b"POST /api/queues/default/pause HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: 900\r\n\r\n",
        )
        sender = trickle(sock)
        status, _, closed = answer_of(sock)
        sock.close()
        sender.join()
    assert status == 401 and closed


def test_authenticated_bodies_have_a_larger_limit_too(app: durq.App) -> None:
    ids = [f"task-{i:03d}-" + "x" * 180 for i in range(500)]  # the largest selection
    with serve(dash_config(create_dashboard(app, token=TOKEN))) as port:
        url = f"http://127.0.0.1:{port}/api/queues/default/tasks:bulk"
        r = httpx.post(url, json={"action": "delete", "ids": ids}, headers=BEARER, timeout=30)
        assert len(r.request.content) > 16 * 1024
        assert r.status_code != 413, r.text
        r = httpx.post(url, content=b" " * (2 * 1024 * 1024), headers=BEARER, timeout=30)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "body_too_large"
        # Without credentials the API never reads a body at all.
        r = httpx.post(url, json={"action": "delete", "ids": ids}, timeout=30)
        assert r.status_code == 401


# -- hostile login bodies, generated -----------------------------------------------------------


def login_body(kind: str, fields: int, size: int, text: str, csrf: str | None) -> tuple[bytes, str]:
    """A login request's body and content type: ``fields`` fields of ``size`` characters made
    of ``text``, optionally with the right CSRF token."""
    value = (text * (size // max(len(text), 1) + 1))[:size]
    pairs = [(f"f{i}", value) for i in range(fields)] + [("token", value)]
    if csrf is not None:
        pairs.append(("csrf_token", csrf))
    if kind == "urlencoded":
        return urlencode(pairs).encode(), "application/x-www-form-urlencoded"
    if kind == "multipart":
        boundary = "durqfuzzboundary"
        parts = [
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
            for k, v in pairs
        ]
        body = ("".join(parts) + f"--{boundary}--\r\n").encode("utf-8", "surrogatepass")
        return body, f"multipart/form-data; boundary={boundary}"
    return json.dumps(dict(pairs)).encode("utf-8", "surrogatepass"), "application/json"


@pytest.fixture
def live_login(app: durq.App) -> Iterator[tuple[str, str, str]]:
    """The dashboard on a real server (no lock-out: the fuzzer sends wrong tokens on
    purpose), with a browser's CSRF cookie and the login form's token."""
    settings = DashboardSettings(auth_failure_limit=10**9)
    with serve(dash_config(create_dashboard(app, token=TOKEN, settings=settings))) as port:
        url = f"http://127.0.0.1:{port}"
        page = httpx.get(f"{url}/login")
        token = page.text.split('name="csrf_token" value="')[1].split('"')[0]
        yield url, page.cookies["durq_csrf"], token


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kind=st.sampled_from(["urlencoded", "multipart", "json"]),
    fields=st.one_of(st.integers(0, 20), st.integers(900, 3000)),
    size=st.one_of(st.integers(0, 64), st.integers(4000, 40000)),
    text=st.text(min_size=1, max_size=8),
    with_csrf=st.booleans(),
    chunk=st.one_of(st.none(), st.integers(256, 65536)),
)
def test_hostile_login_bodies_get_a_4xx_and_413_past_the_limit(
    live_login: tuple[str, str, str],
    kind: str,
    fields: int,
    size: int,
    text: str,
    with_csrf: bool,
    chunk: int | None,
) -> None:
    """Oversized, many-field, chunked, multipart or JSON: past 16 KiB a form gets 413
    whatever the framing; below, a refusal (bad form, CSRF, wrong token), never a 5xx. A
    JSON body is no form: the login never reads it."""
    url, cookie, csrf = live_login
    body, content_type = login_body(kind, fields, size, text, csrf if with_csrf else None)
    content: bytes | Iterator[bytes] = body
    if chunk is not None:  # no Content-Length: Transfer-Encoding: chunked
        content = (body[i : i + chunk] for i in range(0, len(body), chunk))
    r = httpx.post(
        f"{url}/login",
        content=content,
        headers={"Content-Type": content_type},
        cookies={"durq_csrf": cookie},
        timeout=30,
    )
    if kind == "json":  # not a form: never read, refused by the CSRF check
        assert r.status_code == 403, (len(body), r.status_code)
    elif len(body) > 16 * 1024:
        assert r.status_code == 413, (len(body), r.status_code)
    else:
        assert r.status_code in (400, 401, 403), (len(body), r.status_code, r.text[:200])
    assert r.headers["content-security-policy"]


async def test_an_http2_body_without_length_headers_is_bounded_too(app: durq.App) -> None:
    """HTTP/2 frames a body without Content-Length or Transfer-Encoding: the limit counts
    what arrives, and the answer carries no Connection header (HTTP/2 forbids it)."""
    guard = create_dashboard(app, token=TOKEN)
    chunks = [b"a=" + b"b" * 4094] + [b"b" * 4096] * 7  # one 32 KiB field in 4 KiB frames
    sent: list[dict] = []

    async def receive() -> dict:
        if chunks:
            return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "http_version": "2",
        "method": "POST",
        "scheme": "https",
        "path": "/login",
        "raw_path": b"/login",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/x-www-form-urlencoded"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8181),
    }
    await guard(scope, receive, send)
    start = sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 413, sent[1:]
    assert b"connection" not in {k.lower() for k, _ in start["headers"]}
    assert chunks  # the rest was never read
