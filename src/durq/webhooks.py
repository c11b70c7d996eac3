"""Signed webhooks: deliver a task's result (or final error) by HTTP POST.

``await app.enqueue("report:build", {...}, webhook="https://partner.example/hooks/durq")``
stores the URL in the task's headers (``durq-webhook``). When a worker finishes the task
(completed, or archived after its last attempt), :class:`WebhookHooks` enqueues a durable
``durq:webhook`` task whose handler POSTs a JSON event with ``httpx``; that task has its own
retries and backoff, and its id derives from the original task, so it is created once.

Each request carries ``Durq-Timestamp`` (epoch seconds) and
``Durq-Signature: v1=<hex HMAC-SHA256 of "<timestamp>.<body>">`` signed with the app's secret
(``App(webhook_secret=...)`` or ``DURQ_WEBHOOK_SECRET``). Receivers check both with
:func:`verify`.

Not atomic with completion: a worker that dies between completing the task and enqueuing
the delivery loses that delivery (see ``docs/periodic.md``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from durq import backoff, codec
from durq.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    DurqError,
    PayloadError,
    TaskIDConflictError,
    TaskNotFoundError,
    ValidationError,
)
from durq.options import EnqueueRequest
from durq.worker.hooks import WorkerHooks

if TYPE_CHECKING:
    from durq.app import App
    from durq.brokers.base import EnqueueParams
    from durq.task import TaskContext, TaskInfo

log = logging.getLogger("durq.webhooks")

#: The task type that delivers webhooks.
TASK_TYPE = "durq:webhook"
#: Header of the original task that holds the URL.
HEADER_URL = "durq-webhook"
SIGNATURE_HEADER = "Durq-Signature"
TIMESTAMP_HEADER = "Durq-Timestamp"
DELIVERY_HEADER = "Durq-Delivery"
EVENT_HEADER = "Durq-Event"
SECRET_ENV = "DURQ_WEBHOOK_SECRET"  # noqa: S105 - the variable's name, not a secret

#: Outcomes of a worker attempt that end a task, and the event name each one delivers.
EVENTS = {"completed": "task.completed", "archived": "task.archived"}


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


def event_body(task: TaskInfo, event: str) -> dict[str, Any]:
    """The JSON event for a finished task (the webhook's body)."""
    body: dict[str, Any] = {
        "event": event,
        "task": {
            "id": task.id,
            "queue": task.queue,
            "type": task.type,
            "state": task.state.value,
            "retried": task.retried,
            "enqueued_at": task.enqueued_at.isoformat() if task.enqueued_at else None,
            "completed_at": task.completed_at.isoformat() if task.completed_at else None,
        },
    }
    if event == EVENTS["completed"]:
        try:
            body["result"] = task.result
        except ValueError:
            body["result"] = None
    else:
        body["error"] = task.last_error
    return body


class WebhookHooks(WorkerHooks):
    """Enqueues the delivery task when a worker finishes a task that asked for a webhook.

    Runs after the broker recorded the outcome; the enqueue is a separate step (not atomic)."""

    def __init__(self, app: App, queue: str | None = None) -> None:
        self.app = app
        self.queue = queue
        self._pending: set[asyncio.Task[None]] = set()

    def task_finished(self, task: TaskInfo, outcome: str, duration: float) -> None:
        url = task.headers.get(HEADER_URL)
        event = EVENTS.get(outcome)
        if not url or event is None or task.type == TASK_TYPE:
            return
        job = asyncio.get_running_loop().create_task(self._enqueue(task, event, url))
        self._pending.add(job)  # hold a reference until it is done
        job.add_done_callback(self._pending.discard)

    async def drain(self) -> None:
        """Wait for deliveries being enqueued (tests, orderly shutdown)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def _enqueue(self, task: TaskInfo, event: str, url: str) -> None:
        for delay in (0.1, 0.5, 2.0, None):
            try:
                await self._enqueue_once(task, event, url)
                return
            except BrokerUnavailableError as exc:
                if delay is None:
                    log.error("webhook for task %s lost: broker unavailable (%s)", task.id, exc)
                    return
                await asyncio.sleep(delay)
            except Exception:
                log.exception("webhook for task %s could not be enqueued", task.id)
                return

    async def _enqueue_once(self, task: TaskInfo, event: str, url: str) -> None:
        broker = await self.app.broker()
        try:
            # The stored task carries the result (completed) or the final error (archived).
            finished = await broker.get_task(task.queue, task.id)
        except TaskNotFoundError:
            finished = task  # deleted already (retention 0 and no result kept)
        body = event_body(finished, event)
        payload = {"url": url, "body": body}
        try:
            codec.encode_payload(payload, max_bytes=self.app.max_payload)
        except PayloadError:
            body.pop("result", None)
            body["result_omitted"] = "too large"
        request = EnqueueRequest(
            TASK_TYPE,
            payload,
            queue=self.queue or task.queue,
            task_id=delivery_task_id(task.id, event.removeprefix("task.")),
        )
        try:
            await broker.enqueue(self.app.params(request))
        except TaskIDConflictError:
            pass  # already enqueued for this event


#: A task with a webhook keeps its result at least this long, so the hook can read it.
MIN_RETENTION = 300.0


def prepare(params: EnqueueParams) -> EnqueueParams:
    """Validate a task's webhook header and keep its result long enough to be delivered."""
    url = params.headers.get(HEADER_URL)
    if url is None:
        return params
    check_url(url)
    if params.retention < MIN_RETENTION:
        params = replace(params, retention=MIN_RETENTION)
    return params


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
    """Enable webhook delivery on ``app``: register ``durq:webhook`` and the worker hook.

    ``App(webhook_secret=...)`` calls this; without a secret (argument or
    ``DURQ_WEBHOOK_SECRET``) nothing is installed and ``False`` is returned. Call it again to
    change options. Deliveries go to the finished task's queue unless ``queue`` is given."""
    key = resolve_secret(secret)
    if key is None:
        return False
    try:
        import httpx  # fail at start-up, not at the first delivery
    except ImportError as exc:  # pragma: no cover - httpx is in the web extra
        raise ConfigurationError("webhooks need httpx: pip install 'durq[web]'") from exc

    app.tasks.pop(TASK_TYPE, None)
    app.worker_hooks[:] = [h for h in app.worker_hooks if not isinstance(h, WebhookHooks)]

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
    app.worker_hooks.append(WebhookHooks(app, queue))
    return True
