"""Signed webhooks: deliver a task's result (or final error) by HTTP POST.

``await app.enqueue("report:build", {...}, webhook="https://partner.example/hooks/durq")``
stores the URL in the task's headers (``durq-webhook``). When the task finishes (completed,
or archived: retries used up, SkipRetry, cancelled, worker lost, archived by an operator), a
durable ``durq:webhook`` task is created *in the same atomic step* as the outcome: it is a
built-in continuation, one more entry of ``CompleteParams``/``ArchiveParams.follow_ups``
(see :mod:`durq.continuations`), composed by :func:`delivery`. Its handler POSTs a JSON event
with ``httpx``; it has its own retries and backoff, and its id derives from the original task
and the event, so there is at most one delivery per event.

Each request follows the Standard Webhooks scheme (https://www.standardwebhooks.com), so any
of its libraries verifies it: ``webhook-id`` (the delivery task's id, the same on every
retry: deduplicate on it), ``webhook-timestamp`` (epoch seconds) and
``webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`` signed with the
app's secret (``App(webhook_secret=...)`` or ``DURQ_WEBHOOK_SECRET``); the body names the
event. Receivers in Python can use :func:`verify`.

Deliveries never reach the machine's own network by default: the URL must carry no
credentials, and every address its host resolves to must be public (not loopback,
link-local, private, shared, multicast, reserved or unspecified, nor an IPv6 address that
carries such an IPv4 address: see :mod:`durq.addresses`); redirects are not followed. The
allow-list (``install(..., allow=["10.1.2.0/24"])`` or ``DURQ_WEBHOOK_ALLOW``) opens
networks for deliveries inside your own network. The connection goes to the address that
was checked, so a second DNS answer cannot swap it.

The delivery options (``install(..., queue=, max_retry=, timeout=, retention=)``) of the
enqueuing app are resolved at enqueue into the header ``durq-webhook-options``, so whoever
records the outcome (a worker, the rescuer, the inspector) creates the same delivery task.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from durq import backoff, codec, durations, names
from durq.addresses import Address, Network, address_allowed
from durq.brokers.params import EnqueueParams
from durq.errors import ConfigurationError, DurqError, SkipRetry, ValidationError
from durq.taskdef import TaskRegistry

if TYPE_CHECKING:
    from durq.clock import Clock
    from durq.task import TaskContext, TaskInfo

#: The task type that delivers webhooks.
TASK_TYPE = "durq:webhook"
#: Header of the original task that holds the URL.
HEADER_URL = "durq-webhook"
#: Header of the original task with the delivery task's options, resolved at enqueue (JSON).
HEADER_OPTIONS = "durq-webhook-options"
#: Header of the delivery task naming the task it reports on (as continuations do).
PARENT_HEADER = "durq-then-of"
#: The Standard Webhooks headers.
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_ENV = "DURQ_WEBHOOK_SECRET"  # noqa: S105 - the variable's name, not a secret
ALLOW_ENV = "DURQ_WEBHOOK_ALLOW"
#: A timestamp this far ahead of the receiver's clock is still accepted (clock skew).
FUTURE_SKEW = 30.0

log = logging.getLogger("durq.webhooks")

#: Resolves ``(host, port)`` to IP address strings; the default asks the system resolver.
Resolver = Callable[[str, int], Awaitable[list[str]]]

#: Final outcomes of a task, and the event name each one delivers.
EVENTS = {"completed": "task.completed", "archived": "task.archived"}


@dataclass(frozen=True, slots=True)
class WebhookOptions:
    """Options of the ``durq:webhook`` delivery tasks an app's enqueues ask for.

    ``queue``: None delivers from the finished task's own queue. ``timeout`` is the HTTP
    timeout; the delivery task's own timeout is twice that."""

    queue: str | None = None
    max_retry: int = 10
    timeout: float = 10.0
    retention: float = 86400.0
    #: Networks deliveries may reach although they are not public (e.g. ``10.0.0.0/8``).
    allow: tuple[Network, ...] = ()
    #: Name resolution for deliveries (tests give their own); ``None``: the system's.
    resolver: Resolver | None = field(default=None, compare=False)

    def header(self) -> str:
        """The ``durq-webhook-options`` header value: the delivery task's options."""
        spec = {
            "queue": self.queue,
            "max_retry": self.max_retry,
            "timeout": self.timeout * 2,
            "retention": self.retention,
        }
        return json.dumps(spec, separators=(",", ":"), sort_keys=True)


DEFAULT_OPTIONS = WebhookOptions()


class WebhookVerificationError(DurqError, ValueError):
    """The webhook request is not authentic: bad or missing signature, or a stale timestamp."""


class WebhookDeliveryError(Exception):
    """No 2xx answer (whatever the reason: connection, protocol or status); the delivery is
    retried with backoff. One neutral message, so a delivery's error tells nothing about the
    ports of the target."""

    def __init__(self) -> None:
        super().__init__("webhook delivery failed: no 2xx answer")


class WebhookRefusedError(ValidationError):
    """The webhook's address is not allowed (not public and not on the allow-list)."""


# -- URLs and headers ---------------------------------------------------------------------------


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The TLS settings every delivery shares: building them loads the CA bundle, 25-35 ms of
    CPU that would stall the worker's event loop on each delivery."""
    import httpx

    return httpx.create_ssl_context(trust_env=False)


def check_url(url: object) -> str:
    """Return ``url`` if it is an absolute http(s) URL with a host and no credentials;
    ValidationError otherwise (the message never repeats the URL: it may hold a secret)."""
    if not isinstance(url, str) or len(url) > 2048:
        raise ValidationError("webhook must be an http(s) URL string of at most 2048 characters")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise ValidationError("webhook URL must not contain whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValidationError("webhook must be a well-formed http:// or https:// URL") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValidationError("webhook must be an http:// or https:// URL with a host")
    if "@" in parts.netloc:
        raise ValidationError("webhook URL must not contain credentials (user:password@)")
    if port == 0:
        raise ValidationError("webhook URL must not use port 0")
    return url


_LEGACY_IPV4 = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$", re.IGNORECASE)


def parse_allow(entries: Iterable[str | Network] | str | None) -> tuple[Network, ...]:
    """The allow-list as networks: ``["10.0.0.0/8", "192.168.1.20"]`` or a comma-separated
    string; ConfigurationError for anything else."""
    if entries is None:
        return ()
    if isinstance(entries, str):
        entries = [e for e in (p.strip() for p in entries.split(",")) if e]
    out: list[Network] = []
    for entry in entries:
        try:
            out.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ConfigurationError(f"webhook allow-list: {entry!r} is not a network") from None
    return tuple(out)


def literal_address(host: str) -> Address | None:
    """The address a host names by itself (``127.0.0.1``, ``[::1]``, ``2130706433``,
    ``0x7f.1``: the forms a resolver reads as numbers), else ``None``."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if _LEGACY_IPV4.match(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def check_literal_host(url: str, allow: Sequence[Network] = ()) -> None:
    """Refuse, at enqueue, a URL whose host is itself a refused address (no DNS asked)."""
    host = urlsplit(url).hostname or ""
    address = literal_address(host)
    if address is not None and not address_allowed(address, allow):
        raise WebhookRefusedError(
            "webhook address is not allowed: loopback, link-local, private, reserved and "
            "unspecified addresses (also inside IPv6) need the webhook allow-list"
        )


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for ``host``."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return [str(info[4][0]) for info in infos]


async def resolve_target(
    url: str, allow: Sequence[Network] = (), resolver: Resolver | None = None
) -> Address:
    """The address to connect to for ``url``, after the SSRF policy: every address the host
    resolves to must be allowed (a name with one refused address is refused whole).
    Raises :class:`WebhookRefusedError`; :class:`WebhookDeliveryError` when it resolves to
    nothing."""
    check_url(url)
    parts = urlsplit(url)
    host = parts.hostname or ""
    literal = literal_address(host)
    if literal is not None:
        addresses = [literal]
    else:
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
        try:
            names_ = await (resolver or system_resolver)(host, port)
        except OSError:
            raise WebhookDeliveryError() from None
        addresses = []
        for name in names_:
            parsed = literal_address(name)
            if parsed is None:
                raise WebhookDeliveryError()
            addresses.append(parsed)
    if not addresses:
        raise WebhookDeliveryError()
    if not all(address_allowed(a, allow) for a in addresses):
        raise WebhookRefusedError(
            "webhook address is not allowed: it resolves to a loopback, link-local, private "
            "or unspecified address that is not on the webhook allow-list"
        )
    return addresses[0]


def with_webhook(headers: Mapping[str, str] | None, url: str) -> dict[str, str]:
    """``headers`` plus the webhook URL (validated); use it for :class:`EnqueueRequest`."""
    out = dict(headers or {})
    out[HEADER_URL] = check_url(url)
    return out


def delivery_task_id(task_id: str, event: str) -> str:
    """The delivery task's id: derived from the original, so it is enqueued once per event."""
    candidate = f"webhook:{event}:{task_id}"
    if len(candidate) <= 200:
        return candidate
    digest = hashlib.sha256(task_id.encode()).hexdigest()[:40]
    return f"webhook:{event}:sha256:{digest}"


# -- signing ------------------------------------------------------------------------------------


def signing_key(secret: str | bytes) -> bytes:
    """The HMAC key of a secret, as Standard Webhooks libraries read it: ``whsec_<base64>``
    is decoded; any other text is used as its UTF-8 bytes (give a receiver library those
    bytes, ``Webhook(secret.encode())``)."""
    if isinstance(secret, bytes):
        key = secret
    elif secret.startswith("whsec_"):
        try:
            key = base64.b64decode(secret[6:] + "==", validate=False)
        except (binascii.Error, ValueError):
            raise ConfigurationError("a whsec_ webhook secret must be base64") from None
    else:
        key = secret.encode("utf-8", "surrogatepass")
    if not key:
        raise ConfigurationError("a webhook secret is required to sign")
    return key


def _mac(key: bytes, msg_id: str, timestamp: str, body: bytes) -> bytes:
    message = f"{msg_id}.{timestamp}.".encode("utf-8", "surrogatepass") + body
    return hmac.new(key, message, hashlib.sha256).digest()


def sign(body: bytes, secret: str | bytes, timestamp: float | int, msg_id: str) -> dict[str, str]:
    """The Standard Webhooks headers for ``body`` sent as message ``msg_id`` at
    ``timestamp`` (epoch seconds). The signature covers the id, the time and the body."""
    if not secret:
        raise ConfigurationError("a webhook secret is required to sign")
    if not msg_id:
        raise ValidationError("a webhook id is required to sign")
    ts = str(int(timestamp))
    mac = base64.b64encode(_mac(signing_key(secret), msg_id, ts, body)).decode()
    return {ID_HEADER: msg_id, TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: f"v1,{mac}"}


def verify(
    body: bytes | str,
    headers: Mapping[str, str],
    secret: str | bytes | Sequence[str | bytes],
    tolerance: float = 300,
    *,
    now: float | None = None,
    future_skew: float = FUTURE_SKEW,
) -> Any:
    """Check a Standard Webhooks request and return its decoded JSON body.

    ``body`` must be the raw request body, byte for byte (a ``str`` is taken as its UTF-8
    bytes). ``secret`` may be a list during a rotation (any one matching is enough). Raises
    :class:`WebhookVerificationError` (and nothing else, whatever the headers and the body
    hold) when the body is text with no UTF-8 form (a lone surrogate), a header is missing
    or malformed, the signature is wrong, or the timestamp is more than ``tolerance``
    seconds old or more than ``future_skew`` seconds ahead of ``now`` (default: the wall
    clock). Deduplicate on the returned ``webhook-id`` header: the signature binds it to
    the body and the time."""
    import time

    try:
        raw = body.encode() if isinstance(body, str) else bytes(body)
    except UnicodeEncodeError:
        # A lone surrogate: no request body decodes to this text; pass the raw bytes.
        raise WebhookVerificationError("webhook body is not UTF-8 text") from None
    lower = {str(k).lower(): v for k, v in headers.items()}
    msg_id, ts, sig = (lower.get(h) for h in (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER))
    if not (isinstance(msg_id, str) and isinstance(ts, str) and isinstance(sig, str)):
        raise WebhookVerificationError(
            "missing webhook-id, webhook-timestamp or webhook-signature header"
        )
    if not msg_id or not ts or not sig:
        raise WebhookVerificationError(
            "missing webhook-id, webhook-timestamp or webhook-signature header"
        )
    if not (ts.isascii() and ts.isdigit()) or len(ts) > 12:
        raise WebhookVerificationError("webhook-timestamp is not an integer")
    sent = int(ts)
    current = time.time() if now is None else now
    if current - sent > tolerance:
        raise WebhookVerificationError(
            f"webhook-timestamp is {current - sent:.0f}s old (tolerance {tolerance:g}s)"
        )
    if sent - current > future_skew:
        raise WebhookVerificationError(
            f"webhook-timestamp is {sent - current:.0f}s in the future (skew {future_skew:g}s)"
        )
    secrets = [secret] if isinstance(secret, str | bytes) else list(secret)
    given: list[bytes] = []
    for part in sig.split(" "):
        version, _, value = part.partition(",")
        if version != "v1":
            continue
        try:
            given.append(base64.b64decode(value.encode("ascii"), validate=True))
        except (ValueError, binascii.Error):
            continue  # a malformed signature is a wrong one
    expected = [_mac(signing_key(s), msg_id, ts, raw) for s in secrets if s]
    # compare_digest for every pair: no early exit that would leak timing.
    if not any([hmac.compare_digest(g, e) for g in given for e in expected]):
        raise WebhookVerificationError("webhook signature does not match")
    try:
        return codec.decode(raw)
    except ValueError:
        raise WebhookVerificationError("webhook body is not JSON") from None


# -- delivery -----------------------------------------------------------------------------------


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def event_body(
    task: TaskInfo,
    event: str,
    *,
    result: bytes | None = None,
    error: str | None = None,
    retried: int | None = None,
    completed_at: datetime | None = None,
) -> dict[str, Any]:
    """The JSON event for ``task`` finished with ``event`` (the webhook's body).

    ``task`` may be the task as claimed (a worker's outcome, not yet recorded): the keywords
    give what the outcome changes: the result or final error, the attempt count, the time."""
    body: dict[str, Any] = {
        "event": event,
        "task": {
            "id": task.id,
            "queue": task.queue,
            "type": task.type,
            "state": event.removeprefix("task."),
            "retried": task.retried if retried is None else retried,
            "enqueued_at": _iso(task.enqueued_at),
            "completed_at": _iso(completed_at or task.completed_at),
        },
    }
    if event == EVENTS["completed"]:
        raw = task.raw_result if result is None else result
        try:
            body["result"] = codec.decode(raw) if raw is not None else None
        except ValueError:
            body["result"] = None  # undecodable stored data: the event is still delivered
    else:
        body["error"] = task.last_error if error is None else error
    return body


def options_of(headers: Mapping[str, str]) -> dict[str, Any]:
    """The delivery options a task's headers ask for (defaults for tasks without the header);
    ValueError when the header is malformed."""
    raw = headers.get(HEADER_OPTIONS)
    if raw is None:
        return json.loads(DEFAULT_OPTIONS.header())  # type: ignore[no-any-return]
    spec = json.loads(raw)
    if not isinstance(spec, dict):
        raise ValueError(f"malformed {HEADER_OPTIONS} header: {raw!r}")
    return spec


def delivery(
    task: TaskInfo,
    outcome: str,
    *,
    result: bytes | None = None,
    error: str | None = None,
    retried: int | None = None,
    completed_at: datetime | None = None,
    max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
) -> EnqueueParams | None:
    """The ``durq:webhook`` task that delivers ``outcome`` (``"completed"``/``"archived"``)
    of ``task``, or ``None`` when it asked for no webhook (or is itself a delivery).

    A pure function of the finished task, like :func:`durq.continuations.build`: the worker
    sends it with the outcome, and brokers compose it for archives decided outside a worker.
    Its id ``webhook:<event>:<task id>`` makes it one delivery per event. A result that
    would make the payload exceed ``max_payload`` is dropped (``"result_omitted"``).
    Raises ValueError (ValidationError) for a malformed URL or options header."""
    url = task.headers.get(HEADER_URL)
    event = EVENTS.get(outcome)
    if url is None or event is None or task.type == TASK_TYPE:
        return None
    check_url(url)
    spec = options_of(task.headers)
    body = event_body(
        task, event, result=result, error=error, retried=retried, completed_at=completed_at
    )
    payload = _encode({"url": url, "body": body})
    if len(payload) > max_payload:
        body.pop("result", None)
        body["result_omitted"] = "too large"
        if isinstance(body.get("error"), str):
            body["error"] = body["error"][:2048]  # a final error is a line, not a document
        payload = _encode({"url": url, "body": body})
    timeout = spec.get("timeout")
    return EnqueueParams(
        id=delivery_task_id(task.id, outcome),
        queue=names.check_queue(spec.get("queue") or task.queue),
        type=TASK_TYPE,
        payload=payload,
        max_retry=int(spec.get("max_retry", DEFAULT_OPTIONS.max_retry)),
        timeout=float(timeout) if timeout else None,
        retention=float(spec.get("retention") or 0.0),
        headers={PARENT_HEADER: task.id},
    )


def _encode(data: dict[str, Any]) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def prepare(params: EnqueueParams, options: WebhookOptions = DEFAULT_OPTIONS) -> EnqueueParams:
    """Validate a task's webhook header and record the delivery options with it (so any
    process recording its outcome, even without the app, creates the same delivery)."""
    url = params.headers.get(HEADER_URL)
    if url is None:
        return params
    check_url(url)
    check_literal_host(url, options.allow)
    headers = {**params.headers, HEADER_OPTIONS: options.header()}
    return replace(params, headers=headers)


def resolve_secret(secret: str | None) -> str | None:
    """The signing secret: the argument, else ``DURQ_WEBHOOK_SECRET``."""
    return secret or os.environ.get(SECRET_ENV) or None


class WebhookHost(TaskRegistry, Protocol):
    """What :func:`install` sets and registers on an app."""

    webhook_options: WebhookOptions

    @property
    def clock(self) -> Clock: ...


def install(
    app: WebhookHost,
    secret: str | None = None,
    *,
    queue: str | None = None,
    max_retry: int = 10,
    timeout: float = 10.0,
    retry_delay: str | backoff.RetryDelay | None = None,
    retention: float = 86400.0,
    allow: Iterable[str | Network] | str | None = None,
    resolver: Resolver | None = None,
) -> bool:
    """Set ``app``'s delivery options and register the ``durq:webhook`` handler.

    ``allow``: networks deliveries may reach although they are not public (default:
    ``DURQ_WEBHOOK_ALLOW``, comma-separated); ``resolver``: name resolution for deliveries
    (default: the system's).

    ``App(webhook_secret=...)`` calls this. The options (``queue``, ``max_retry``,
    ``timeout``, ``retention``) are always recorded: tasks this app enqueues carry them, and
    the delivery task is created with them when the task finishes. The handler, which signs
    and POSTs, is registered only with a secret (argument or ``DURQ_WEBHOOK_SECRET``); without
    one ``False`` is returned. Call it again to change options. Deliveries go to the finished
    task's queue unless ``queue`` is given."""
    if queue is not None:
        names.check_queue(queue)
    from durq.options import check_max_retry

    try:
        check_max_retry(max_retry)
        timeout = durations.seconds(timeout) or 0.0
        retention = durations.seconds(retention) or 0.0
    except ValidationError as exc:
        raise ConfigurationError(f"webhook options: {exc.message}") from None
    if timeout <= 0:
        raise ConfigurationError("webhook timeout must be > 0")
    networks = parse_allow(os.environ.get(ALLOW_ENV) if allow is None else allow)
    options = WebhookOptions(queue, max_retry, float(timeout), float(retention), networks, resolver)
    app.webhook_options = options
    key = resolve_secret(secret)
    if key is None:
        return False
    try:
        import httpx  # fail at start-up, not at the first delivery
    except ImportError as exc:  # pragma: no cover - httpx is in the web extra
        raise ConfigurationError("webhooks need httpx: pip install 'durq[web]'") from exc

    app.tasks.pop(TASK_TYPE, None)

    async def deliver(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        url = check_url(payload.get("url"))
        body = codec.encode_result(payload.get("body")) or b"null"
        try:
            address = await resolve_target(url, options.allow, options.resolver)
        except WebhookRefusedError as exc:
            raise SkipRetry(exc.message) from None  # a policy answer: retrying changes nothing
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "durq-webhook",
            **sign(body, key, app.clock.now(), ctx.id),
        }
        # Connect to the address that was checked (no second DNS answer), naming the host
        # in Host and, for https, in SNI and the certificate check.
        target = httpx.URL(url)
        extensions: dict[str, Any] = {}
        if target.scheme == "https":
            extensions["sni_hostname"] = target.host
        headers["Host"] = target.netloc.decode("ascii")
        pinned = target.copy_with(host=str(address))
        try:
            async with httpx.AsyncClient(
                timeout=timeout, follow_redirects=False, trust_env=False, verify=tls_context()
            ) as client:
                response = await client.post(
                    pinned, content=body, headers=headers, extensions=extensions
                )
        except httpx.HTTPError as exc:
            log.debug("webhook %s: %s", ctx.id, type(exc).__name__)
            raise WebhookDeliveryError() from None
        if 200 <= response.status_code < 300:
            return {"status": response.status_code}
        log.debug("webhook %s: HTTP %s", ctx.id, response.status_code)
        raise WebhookDeliveryError()

    app.task(
        TASK_TYPE,
        queue=queue,
        max_retry=max_retry,
        timeout=timeout * 2,
        retention=retention,
        retry_delay=retry_delay,
    )(deliver)
    return True
