"""Webhooks attacked: hostile signature headers are a verification error, never a crash;
the signature binds the delivery id and refuses future timestamps; Standard Webhooks
libraries verify durq's requests and durq verifies theirs; deliveries never reach the
machine's own network (SSRF) unless allowed, after DNS resolution by a resolver the test
controls; errors are one neutral class and credentials are refused, never stored."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import standardwebhooks
from webhook_receiver import SECRET, serve_receiver, wait_event

import durq
from durq import webhooks
from durq.errors import ConfigurationError, ValidationError
from durq.states import TaskState
from durq.webhooks import WebhookRefusedError, WebhookVerificationError, sign, verify

NOW = 1_800_000_000
BODY = b'{"event":"task.completed","result":{"n":1}}'
FAST = {"poll_interval": 0.05, "promote_interval": 0.05, "shutdown_timeout": 5.0}


class Resolver:
    """The DNS of these tests: a fixed table, and a record of every question."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "unknown host")
        return self.table[host]


# -- verification never crashes ---------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"webhook-signature": "v1,é"},
        {"webhook-signature": "v1=é"},
        {"webhook-signature": "é"},
        {"webhook-signature": "v1,@@@"},
        {"webhook-signature": "v1"},
        {"webhook-timestamp": "²³"},
        {"webhook-timestamp": "9" * 40},
        {"webhook-timestamp": "-5"},
        {"webhook-id": ""},
    ],
)
def test_hostile_signature_headers_are_a_verification_error(change: dict[str, str]) -> None:
    headers = {**sign(BODY, SECRET, NOW, "msg_1"), **change}
    with pytest.raises(WebhookVerificationError):
        verify(BODY, headers, SECRET, now=NOW)


@pytest.mark.parametrize("body", ["\ud800", '{"a":"\udcff"}', "\udfff\ud800"])
def test_a_text_body_with_a_lone_surrogate_is_a_verification_error(body: str) -> None:
    """No request body decodes to such text: the documented error, never UnicodeEncodeError."""
    headers = sign(b"{}", SECRET, NOW, "msg_1")
    with pytest.raises(WebhookVerificationError, match="not UTF-8"):
        verify(body, headers, SECRET, now=NOW)


def test_the_signature_binds_the_delivery_id_and_refuses_the_future() -> None:
    headers = sign(BODY, SECRET, NOW, "webhook:completed:t1")
    assert verify(BODY, headers, SECRET, now=NOW)["result"] == {"n": 1}
    # A captured request replayed under a fresh delivery id (to pass deduplication) fails.
    with pytest.raises(WebhookVerificationError, match="does not match"):
        verify(BODY, {**headers, "webhook-id": "webhook:completed:t2"}, SECRET, now=NOW)
    # A timestamp from the future (a request pre-signed to replay later) fails past the skew.
    assert verify(BODY, headers, SECRET, now=NOW - webhooks.FUTURE_SKEW)
    with pytest.raises(WebhookVerificationError, match="in the future"):
        verify(BODY, headers, SECRET, now=NOW - webhooks.FUTURE_SKEW - 1)


# -- Standard Webhooks, both directions ---------------------------------------------------------


@pytest.mark.parametrize("secret", [SECRET, "a plain secret, not base64 é"])
def test_standard_webhooks_library_verifies_durq_and_durq_verifies_it(secret: str) -> None:
    import time

    receiver_key: str | bytes = secret if secret.startswith("whsec_") else secret.encode()
    library = standardwebhooks.Webhook(receiver_key)
    now = time.time()
    ours = sign(BODY, secret, now, "webhook:completed:abc")
    assert library.verify(BODY, ours) == {"event": "task.completed", "result": {"n": 1}}
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        library.verify(BODY.replace(b"1", b"2"), ours)

    from datetime import UTC, datetime

    moment = datetime.fromtimestamp(now, UTC)
    theirs = {
        "webhook-id": "msg_2",
        "webhook-timestamp": str(int(now)),
        "webhook-signature": library.sign("msg_2", moment, BODY.decode()),
    }
    assert verify(BODY, theirs, secret)["result"] == {"n": 1}
    with pytest.raises(WebhookVerificationError):
        verify(BODY, theirs, "whsec_" + base64.b64encode(b"another key").decode())


async def test_a_real_delivery_verifies_with_the_standard_webhooks_library(
    app: durq.App,
) -> None:
    resolver = Resolver({"partner.test": ["127.0.0.1"]})
    with serve_receiver() as receiver:
        webhooks.install(app, SECRET, allow=["127.0.0.1/32"], resolver=resolver)
        url = f"http://partner.test:{receiver.port}/hooks"
        info = await app.enqueue("report:build", {}, webhook=url)
        await app.inspector.archive_task("default", info.id)
        async with app.worker(**FAST):
            await wait_event(receiver.got)
    body, headers = receiver.requests[0]
    event = standardwebhooks.Webhook(SECRET).verify(body, headers)
    assert event["event"] == "task.archived" and event["task"]["id"] == info.id
    assert headers["webhook-id"] == webhooks.delivery_task_id(info.id, "archived")
    # The connection went to the checked address; the Host header still names the host.
    assert headers["Host"] == f"partner.test:{receiver.port}"
    assert resolver.asked == ["partner.test"]


# -- SSRF ------------------------------------------------------------------------------------


REFUSED_LITERALS = [
    "http://169.254.169.254/latest/meta-data/",
    "http://127.0.0.1:6379/",
    "http://[::1]/",
    "http://0.0.0.0/",
    "http://2130706433/",
    "http://0x7f.1/",
    "http://017700000001/",
    "http://10.0.0.7/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",
    "http://[::ffff:127.0.0.1]/",
    "http://[fe80::1]/",
    "http://224.0.0.1/",
    # IPv6 addresses that carry an IPv4 address of the own network.
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[64:ff9b::7f00:1]:6379/",
    "http://[64:ff9b:1::a00:7]/",
    "http://[2002:7f00:1::]/",
    "http://[::7f00:1]/",
    "http://[::ffff:0:7f00:1]/",
    "http://[::ffff:7f00:1]/",
    "http://[2001:0:5db8:ac10:0:0:80ff:fffe]/",
]
CREDENTIALS = ["http://user:hunter2@partner.example/x", "https://token@partner.example/x"]


@pytest.mark.parametrize("url", REFUSED_LITERALS)
async def test_enqueue_refuses_addresses_of_the_own_network(
    app: durq.App,
    url: str,
) -> None:
    with pytest.raises(WebhookRefusedError, match="not allowed"):
        await app.enqueue("report:build", {}, webhook=url)
    assert sum(q.size for q in await app.inspector.list_queues()) == 0
    # The allow-list opens them, for deliveries inside your own network.
    webhooks.install(app, None, allow=["0.0.0.0/0", "::/0"])
    await app.enqueue("report:build", {}, webhook=url)


@pytest.mark.parametrize("url", CREDENTIALS)
async def test_enqueue_refuses_credentials_and_never_echoes_them(
    app: durq.App,
    url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ValidationError, match="credentials") as refused:
        await app.enqueue("report:build", {}, webhook=url)
    with pytest.raises(ValidationError):
        await app.enqueue("report:build", {}, headers={webhooks.HEADER_URL: url})
    assert "hunter2" not in str(refused.value) and "token@" not in str(refused.value)
    assert "hunter2" not in caplog.text and "token@" not in caplog.text


@contextmanager
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A raw TCP socket on loopback that records whatever connects (a Redis port, say)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.settimeout(0.1)
    seen: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    seen.append(conn.recv(4096))
                    conn.sendall(b"-ERR unknown command\r\n")
                except OSError:
                    seen.append(b"")

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1], seen
    finally:
        stop.set()
        thread.join(2)
        sock.close()


async def run_deliveries(app: durq.App, urls: list[str]) -> list[durq.TaskInfo]:
    """Enqueue and archive one task per URL, let a worker try each delivery once, and
    return the delivery tasks."""
    ids = []
    for url in urls:
        info = await app.enqueue("report:build", {}, webhook=url)
        await app.inspector.archive_task("default", info.id)
        ids.append(webhooks.delivery_task_id(info.id, "archived"))
    async with app.worker(**FAST):
        for _ in range(400):
            tasks = [await app.inspector.get_task_info("default", i) for i in ids]
            if all(t.retried >= 1 or t.state is TaskState.ARCHIVED for t in tasks):
                return tasks
            await asyncio.sleep(0.02)
    raise AssertionError("deliveries were not attempted")


async def test_deliveries_refuse_names_that_resolve_to_the_own_network(
    app: durq.App,
) -> None:
    """The policy runs after DNS: names are accepted at enqueue (no DNS there), and the
    delivery is refused when any address the name resolves to is not public."""
    with listener() as (port, seen):
        resolver = Resolver(
            {
                "metadata.google.internal": ["169.254.169.254"],
                "redis.test": ["127.0.0.1"],
                "rebind.test": ["93.184.216.34", "127.0.0.1"],
                "inside.test": ["10.1.2.3"],
                "mapped.test": ["::ffff:127.0.0.1"],
                # DNS64 on an IPv6-only subnet: only a private A record, synthesised.
                "dns64.test": ["64:ff9b::7f00:1"],
                "metadata64.test": ["64:ff9b::a9fe:a9fe"],
                "sixtofour.test": ["2002:7f00:1::1"],
                "translated.test": ["::ffff:0:7f00:1"],
            }
        )
        webhooks.install(app, SECRET, max_retry=3, resolver=resolver)
        urls = [f"http://{host}:{port}/" for host in resolver.table]
        tasks = await run_deliveries(app, urls)
    assert seen == []  # nothing ever connected to the loopback port
    assert sorted(resolver.asked) == sorted(resolver.table)
    for task in tasks:
        assert task.state is TaskState.ARCHIVED, task  # a policy answer is final
        assert "not allowed" in (task.last_error or "")


async def test_failures_are_one_neutral_class_whatever_the_port_state(
    app: durq.App,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Closed port, a redirect, a non-HTTP service: the same recorded error, so the
    dashboard is no port scanner (inside the allow-list, where a target can be reached)."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    resolver = Resolver({"partner.test": ["127.0.0.1"]})
    caplog.set_level(logging.WARNING)
    with (
        serve_receiver() as redirecting,
        serve_receiver() as elsewhere,
        listener() as (redis_port, seen),
    ):
        # A redirect to a receiver that answers 2xx: followed, the delivery would succeed.
        redirecting.status = 307
        redirecting.location = elsewhere.url
        webhooks.install(app, SECRET, max_retry=3, allow=["127.0.0.0/8"], resolver=resolver)
        urls = [
            f"http://partner.test:{closed_port}/",
            f"http://partner.test:{redirecting.port}/",
            f"http://partner.test:{redis_port}/",
        ]
        tasks = await run_deliveries(app, urls)
    assert seen and redirecting.requests  # the reachable ones were reached
    assert elsewhere.requests == []  # the redirect was not followed
    errors = {t.last_error for t in tasks}
    assert errors == {"WebhookDeliveryError: webhook delivery failed: no 2xx answer"}, errors
    # As whole words: a task id in the log is hex, and may hold "307" or the port's digits.
    logged = set(re.findall(r"\b\w+\b", caplog.text))
    assert str(closed_port) not in logged and "307" not in logged


def test_allow_list_must_name_networks() -> None:
    with pytest.raises(ConfigurationError):
        webhooks.parse_allow(["not-a-network"])
    assert webhooks.parse_allow("10.0.0.0/8, 192.168.1.20") == webhooks.parse_allow(
        ["10.0.0.0/8", "192.168.1.20/32"]
    )
