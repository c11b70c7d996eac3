"""Signed webhooks: deliver a task's result (or final error) by HTTP POST.

``await app.enqueue("report:build", {...}, webhook="https://partner.example/hooks/durq")``
stores the URL in the task's headers (``durq-webhook``). When the task finishes (completed,
or archived: retries used up, SkipRetry, cancelled, worker lost, archived by an operator), a
durable ``durq:webhook`` task is created *in the same atomic step* as the outcome: it is a
built-in continuation, one more entry of ``CompleteParams``/``ArchiveParams.follow_ups``
(see :mod:`durq.continuations`), composed by :func:`delivery`. Its handler POSTs a JSON event
with ``httpx``; it has its own retries and backoff, and its id derives from the original task
and the event, so there is at most one delivery per event.

Each request carries ``Durq-Timestamp`` (epoch seconds) and
``Durq-Signature: v1=<hex HMAC-SHA256 of "<timestamp>.<body>">`` signed with the app's secret
(``App(webhook_secret=...)`` or ``DURQ_WEBHOOK_SECRET``). Receivers check both with
:func:`verify`.

The delivery options (``install(..., queue=, max_retry=, timeout=, retention=)``) of the
enqueuing app are resolved at enqueue into the header ``durq-webhook-options``, so whoever
records the outcome (a worker, the rescuer, the inspector) creates the same delivery task.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from durq import backoff, codec, names
from durq.brokers.base import EnqueueParams
from durq.errors import ConfigurationError, DurqError, ValidationError

if TYPE_CHECKING:
    from durq.app import App
    from durq.task import TaskContext, TaskInfo

#: The task type that delivers webhooks.
TASK_TYPE = "durq:webhook"
#: Header of the original task that holds the URL.
HEADER_URL = "durq-webhook"
#: Header of the original task with the delivery task's options, resolved at enqueue (JSON).
HEADER_OPTIONS = "durq-webhook-options"
#: Header of the delivery task naming the task it reports on (as continuations do).
PARENT_HEADER = "durq-then-of"
SIGNATURE_HEADER = "Durq-Signature"
TIMESTAMP_HEADER = "Durq-Timestamp"
DELIVERY_HEADER = "Durq-Delivery"
EVENT_HEADER = "Durq-Event"
SECRET_ENV = "DURQ_WEBHOOK_SECRET"  # noqa: S105 - the variable's name, not a secret

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
    """The receiver did not answer 2xx; the delivery is retried with backoff."""


# -- URLs and headers ---------------------------------------------------------------------------


def check_url(url: object) -> str:
    """Return ``url`` if it is an absolute http(s) URL with a host; ValidationError otherwise."""
    if not isinstance(url, str) or len(url) > 2048:
        raise ValidationError("webhook must be an http(s) URL string of at most 2048 characters")
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValidationError(f"webhook must be an http:// or https:// URL, got {url!r}")
    if any(c.isspace() for c in url):
        raise ValidationError("webhook URL must not contain whitespace")
    return url


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


def _mac(secret: str, timestamp: str, body: bytes) -> str:
    message = timestamp.encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(body: bytes, secret: str, timestamp: float | int) -> dict[str, str]:
    """The signature headers for ``body`` sent at ``timestamp`` (epoch seconds)."""
    if not secret:
        raise ConfigurationError("a webhook secret is required to sign")
    ts = str(int(timestamp))
    return {TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: f"v1={_mac(secret, ts, body)}"}


def verify(
    body: bytes | str,
    headers: Mapping[str, str],
    secret: str | Sequence[str],
    tolerance: float = 300,
    *,
    now: float | None = None,
) -> Any:
    """Check a webhook request and return its decoded JSON body.

    ``body`` must be the raw request body, byte for byte. ``secret`` may be a list during a
    rotation (any one matching is enough). Raises :class:`WebhookVerificationError` when
    the signature is missing or wrong, or the timestamp is more than ``tolerance`` seconds
    away from ``now`` (default: the wall clock), which stops replays of old requests."""
    import time

    raw = body.encode() if isinstance(body, str) else bytes(body)
    lower = {k.lower(): v for k, v in headers.items()}
    ts = lower.get(TIMESTAMP_HEADER.lower())
    sig = lower.get(SIGNATURE_HEADER.lower())
    if not ts or not sig:
        raise WebhookVerificationError("missing Durq-Timestamp or Durq-Signature header")
    try:
        sent = int(ts)
    except ValueError:
        raise WebhookVerificationError("Durq-Timestamp is not an integer") from None
    current = time.time() if now is None else now
    if abs(current - sent) > tolerance:
        raise WebhookVerificationError(
            f"Durq-Timestamp is {current - sent:.0f}s away from now (tolerance {tolerance:g}s)"
        )
    secrets = [secret] if isinstance(secret, str) else list(secret)
    given = [p.strip()[3:] for p in sig.split(",") if p.strip().startswith("v1=")]
    expected = [_mac(s, ts, raw) for s in secrets if s]
    # compare_digest for every pair: no early exit that would leak timing.
    if not any(hmac.compare_digest(g, e) for g in given for e in expected):
        raise WebhookVerificationError("webhook signature does not match")
    try:
        return json.loads(raw)
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
    headers = {**params.headers, HEADER_OPTIONS: options.header()}
    return replace(params, headers=headers)


def resolve_secret(secret: str | None) -> str | None:
    """The signing secret: the argument, else ``DURQ_WEBHOOK_SECRET``."""
    return secret or os.environ.get(SECRET_ENV) or None


def install(
    app: App,
    secret: str | None = None,
    *,
    queue: str | None = None,
    max_retry: int = 10,
    timeout: float = 10.0,
    retry_delay: str | backoff.RetryDelay | None = None,
    retention: float = 86400.0,
) -> bool:
    """Set ``app``'s delivery options and register the ``durq:webhook`` handler.

    ``App(webhook_secret=...)`` calls this. The options (``queue``, ``max_retry``,
    ``timeout``, ``retention``) are always recorded: tasks this app enqueues carry them, and
    the delivery task is created with them when the task finishes. The handler, which signs
    and POSTs, is registered only with a secret (argument or ``DURQ_WEBHOOK_SECRET``); without
    one ``False`` is returned. Call it again to change options. Deliveries go to the finished
    task's queue unless ``queue`` is given."""
    if queue is not None:
        names.check_queue(queue)
    if not isinstance(max_retry, int) or isinstance(max_retry, bool) or max_retry < 0:
        raise ConfigurationError(f"max_retry must be an integer >= 0, got {max_retry!r}")
    if timeout <= 0 or retention < 0:
        raise ConfigurationError("webhook timeout must be > 0 and retention >= 0")
    app.webhook_options = WebhookOptions(queue, max_retry, float(timeout), float(retention))
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
        event = payload.get("body", {}).get("event", "")
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "durq-webhook",
            DELIVERY_HEADER: ctx.id,
            EVENT_HEADER: str(event),
            **sign(body, key, app.clock.now()),
        }
        try:
            async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
                response = await client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise WebhookDeliveryError(f"POST {url}: {type(exc).__name__}: {exc}") from exc
        if 200 <= response.status_code < 300:
            return {"status": response.status_code}
        raise WebhookDeliveryError(f"POST {url}: HTTP {response.status_code}")

    app.task(
        TASK_TYPE,
        queue=queue,
        max_retry=max_retry,
        timeout=timeout * 2,
        retention=retention,
        retry_delay=retry_delay,
    )(deliver)
    return True
