"""The coverage task: the insurance partner's answer, by its callback or by polling, as one
durable durq task.

The polling loop step by step, and who does it:

* "find due tasks with FOR UPDATE SKIP LOCKED LIMIT 50": the durq worker's claim;
* "call the partner with a per-call deadline": :func:`request_coverage` and
  :func:`coverage_status` via ``partners.py``, each recorded as a step of the task;
* "still pending: reschedule with min(2^n, 300) s": ``ctx.wait_for`` the partner's answer
  for :func:`poll_delay` (the broker keeps the time, not this process; the task holds no
  worker while it waits). The partner's callback, which the API's webhook turns into the
  signal :data:`PARTNER_ANSWER`, ends the wait at once; without it the wait times out and
  the task polls once;
* "after 20 attempts: FAILED + ERROR log": after the 20th "pending" the handler marks the
  order FAILED and durq archives the task with its ERROR alert line;
* "success: COMPLETED and the business flow continues": the order becomes COVERED with
  the policy number, and the task completes.

A partner that cannot answer (down, a malformed answer) fails the attempt: durq retries it
with the capped backoff, at most ``max_attempts`` times, and the recorded polls are not
made again. However the coverage task ends up archived (retries used up, the rescuer's
"worker lost" after repeated crashes, an operator's archive or cancel), its continuation
``insurance:finalize`` marks a still-PENDING order FAILED. durq creates that follow-up in
the same transaction (or Lua script) that archives the task, so no order stays PENDING
behind an archived task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

import durq
from durq.backoff import RetryDelay
from durq.brokers.base import CAP_TRANSACTIONAL_ENQUEUE
from durq.web import Answer, answer_for_error, queued, unavailable

from .config import Settings
from .partners import (
    CoverageCallback,
    CoverageItem,
    CoverageStatus,
    InsurancePartner,
    PartnerProtocolError,
    PartnerSystem,
    Warehouses,
)
from .resilience import (
    Bulkhead,
    CircuitBreaker,
    SystemUnavailableError,
    retry_briefly,
)
from .store import NewOrder, Order, OrderStore, open_store

log = logging.getLogger("insurance.coverage")

COVERAGE_TASK = "insurance:check_coverage"
COVERAGE_QUEUE = "insurance"
FINALIZE_TASK = "insurance:finalize"
#: The signal that carries the partner's decision from its callback to the waiting task.
PARTNER_ANSWER = "partner-answer"
#: The coverage task's continuation: only when it is archived (a failure handler).
FINALIZE = durq.Then(FINALIZE_TASK, queue=COVERAGE_QUEUE, on_archived=True, on_completed=False)


def coverage_task_id(order_id: str) -> str:
    """The id of an order's coverage task: one task per order, found again by the order id
    (a retried request, the partner's callback)."""
    return f"coverage:{order_id}"


class CoveragePayload(BaseModel):
    """The task's payload: only the order id; everything else is read from the order."""

    order_id: str


class PermanentFailure(Exception):
    """Retrying cannot help (rejected by the partner, out of stock)."""


class Runtime:
    """What the API and the coverage task share in one process: the orders store and one
    client (with breaker and bulkhead) per partner system."""

    def __init__(self, settings: Settings, *, transactional: bool) -> None:
        self.settings = settings
        self.store: OrderStore = open_store(
            settings.database_url,
            settings.database_schema,
            transactional=transactional,
            broker_url=settings.broker_url,
            lock_budget=settings.lock_budget,
        )
        self.insurance = InsurancePartner(self._system("insurance", settings.partner_url))
        self.warehouses = Warehouses(
            {
                name: self._system(f"warehouse:{name}", url)
                for name, url in settings.warehouses.items()
            },
            fanout_timeout=settings.fanout_timeout,
        )

    def _system(self, name: str, url: str) -> PartnerSystem:
        s = self.settings
        return PartnerSystem(
            name,
            url,
            call_timeout=s.call_timeout,
            breaker=CircuitBreaker(name, failures=s.breaker_failures, reset=s.breaker_reset),
            bulkhead=Bulkhead(name, s.bulkhead),
        )

    def systems(self) -> list[PartnerSystem]:
        return [self.insurance.system, *self.warehouses.systems.values()]

    async def open(self) -> None:
        await self.store.open()

    async def aclose(self) -> None:
        await self.insurance.system.aclose()
        await self.warehouses.aclose()
        await self.store.close()


class Runtimes:
    """One :class:`Runtime` per event loop (HTTP clients and pools are bound to their loop).

    In the monolith the API's lifespan installs it; a split worker creates it on first use."""

    def __init__(self, settings: Settings, app: durq.App) -> None:
        self.settings = settings
        self.app = app
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Runtime] = (
            weakref.WeakKeyDictionary()
        )
        self._lock: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    async def get(self) -> Runtime:
        loop = asyncio.get_running_loop()
        runtime = self._by_loop.get(loop)
        if runtime is not None:
            return runtime
        async with self._lock.setdefault(loop, asyncio.Lock()):
            runtime = self._by_loop.get(loop)
            if runtime is None:
                runtime = await self.create()
                self._by_loop[loop] = runtime
        return runtime

    async def create(self) -> Runtime:
        # Capabilities are declared as data: no connection needed, so the API starts (and
        # answers 503) even while the broker is down.
        transactional = CAP_TRANSACTIONAL_ENQUEUE in self.app.new_broker().capabilities
        runtime = Runtime(self.settings, transactional=transactional)
        await runtime.open()
        if runtime.store.transactional:
            # The task is written inside the order's transaction, into durq's tables: make
            # sure they exist first (connecting migrates an embedded SQLite broker). A broker
            # that is down now answers 503 per request later.
            with contextlib.suppress(durq.BrokerUnavailableError):
                await self.app.broker()
        return runtime

    def install(self, runtime: Runtime) -> None:
        self._by_loop[asyncio.get_running_loop()] = runtime

    async def close(self) -> None:
        runtime = self._by_loop.pop(asyncio.get_running_loop(), None)
        if runtime is not None:
            await runtime.aclose()


async def enqueue_coverage(
    app: durq.App, orders: Sequence[NewOrder], connection: Any = None
) -> list[Answer]:
    """Queue the coverage task of each order, in ``connection``'s transaction when given
    (E8), all in one ``enqueue_many``; the web contract's answer for each: 202 queued,
    200 already accepted (its task exists), 503 (the broker is unavailable)."""
    requests = [
        # FINALIZE: archived by any path -> the order becomes FAILED.
        durq.EnqueueRequest(COVERAGE_TASK, {"order_id": o.id}, task_id=o.task_id, then=FINALIZE)
        for o in orders
    ]
    try:
        outcomes = await app.enqueue_many(requests, connection=connection)
    except durq.BrokerUnavailableError:
        return [unavailable() for _ in orders]
    answers = []
    for order, outcome in zip(orders, outcomes, strict=True):
        location, extra = f"/orders/{order.id}", {"order_id": order.id}
        if outcome.info is not None:
            answers.append(queued(outcome.info, location=location, extra=extra))
            continue
        answer = answer_for_error(outcome.error, location=location, extra=extra)
        answers.append(answer if answer is not None else unavailable())
    return answers


def retry_policy(settings: Settings) -> str | RetryDelay:
    """``min(base * 2**n, cap)`` s (by default ``min(2**n, 300)``); base and cap come from
    the environment."""
    if settings.backoff_base == 1.0 and settings.backoff_cap == 300.0:
        return "capped_power_of_two"
    base, cap = settings.backoff_base, settings.backoff_cap

    def policy(retried: int, exc: BaseException) -> float:
        return float(min(base * 2 ** min(retried, 62), cap))

    return policy


async def request_coverage(runtime: Runtime, order: Order) -> str:
    """Check stock (fan-out to the warehouses) and submit the order to the insurance partner;
    its reference. Runs once per order: the task records it as a step."""
    budget = runtime.settings.in_memory_wait
    if order.external_ref is not None:  # submitted before the step was recorded
        return order.external_ref
    needed: dict[str, int] = {}
    for item in order.items:
        needed[item["sku"]] = needed.get(item["sku"], 0) + int(item["qty"])
    available = await runtime.warehouses.availability(list(needed))
    if runtime.warehouses.systems:
        short = [sku for sku, qty in needed.items() if available.get(sku, 0) < qty]
        if short:
            raise PermanentFailure(f"out of stock: {', '.join(sorted(short))}")
    items = [CoverageItem(sku=i["sku"], qty=int(i["qty"])) for i in order.items]
    callback_url = runtime.settings.callback_url or None  # none configured: polling alone
    ref = await retry_briefly(
        lambda: runtime.insurance.request_coverage(order.id, items, callback_url), budget=budget
    )
    await runtime.store.set_external_ref(order.id, ref)
    return ref


async def coverage_status(runtime: Runtime, ref: str) -> dict[str, Any]:
    """One status call: ``{"status": "pending" | "confirmed" | "rejected", ...}``; raises
    :class:`SystemUnavailableError` or :class:`PartnerProtocolError` when the partner cannot
    answer (the attempt fails and durq retries it with the backoff)."""
    budget = runtime.settings.in_memory_wait
    status = await retry_briefly(lambda: runtime.insurance.coverage_status(ref), budget=budget)
    return partner_answer(status)


def partner_answer(said: CoverageStatus | CoverageCallback) -> dict[str, Any]:
    """What the task records of the partner's answer, polled or called back: ``{"status",
    "policy", "reason"}``; :class:`PartnerProtocolError` for a confirmation without a policy
    number."""
    if said.status == "confirmed" and not said.policy_number:
        raise PartnerProtocolError("insurance: confirmed without a policy number")
    return {"status": said.status, "policy": said.policy_number, "reason": said.reason}


async def called_back(ctx: durq.TaskContext, n: int, delay: float) -> dict[str, Any] | None:
    """Wait up to ``delay`` s, holding no worker, for the partner's answer by callback
    (:data:`PARTNER_ANSWER`): the answer, or ``None`` once the wait is over without it (time
    for poll ``n``). Each wait is its own step, ``answer-n``; the signal comes once, to the
    wait under way or, if it comes while the task runs, to the next one at once."""
    try:
        answer: dict[str, Any] = await ctx.wait_for(
            PARTNER_ANSWER, timeout=delay, step=f"answer-{n}"
        )
    except durq.SignalTimeoutError:
        return None
    return answer


def poll_delay(settings: Settings, polls: int) -> float:
    """How long to wait for the callback before poll ``polls`` (after the request, or the
    ``polls - 1``-th "pending"): ``min(base * 2**(polls - 1), cap)`` seconds (by default
    ``min(2**n, 300)``, n counted from 0)."""
    return float(min(settings.backoff_base * 2 ** min(polls - 1, 62), settings.backoff_cap))


def partner_limit(settings: Settings) -> durq.Limit:
    """The insurance partner's bulkhead and rate, as one durq limit."""
    return durq.Limit(
        "partner:insurance", concurrency=settings.bulkhead, rate=settings.partner_rate
    )


def register(app: durq.App, runtimes: Runtimes, settings: Settings) -> durq.TaskDef[Any, Any]:
    """Register the coverage task on ``app``."""
    timeout = settings.fanout_timeout + 2 * (settings.call_timeout + settings.in_memory_wait) + 5

    @app.task(
        COVERAGE_TASK,
        queue=COVERAGE_QUEUE,
        # max_retry counts retries: 20 attempts = the first one + 19 retries.
        max_retry=settings.max_attempts - 1,
        retry_delay=retry_policy(settings),
        timeout=timeout,
        retention=7 * 24 * 3600,
        # One attempt makes one call at most to the insurance partner: its bulkhead and rate
        # hold across every worker process and pod, counted by the broker.
        limit=partner_limit(settings),
    )
    async def check_coverage(payload: CoveragePayload, ctx: durq.TaskContext) -> dict[str, Any]:
        """One order, as one durable task: request coverage, then wait for the partner's
        callback with the capped backoff as the timeout, polling once after each wait that
        ends without it, until the order is covered or given up.

        Each wait and each poll's answer is recorded as a step, so a run after a wait (or
        after a crash or a deploy) replays what is recorded and makes only the next call.
        Waits hold no worker slot and no partner token."""
        runtime = await runtimes.get()
        store = runtime.store
        fields = {"order_id": payload.order_id, "task_id": ctx.id, "attempt": ctx.attempt}
        order = await store.get(payload.order_id)
        if order is None:
            raise durq.SkipRetry(f"order {payload.order_id} not found")
        if order.status != "PENDING":  # at-least-once: a re-run after success changes nothing
            return {"order_id": order.id, "status": order.status, "policy": order.policy_number}
        polls = 0
        try:
            ref = await ctx.step("request", request_coverage, runtime, order)
            while True:
                answer = await called_back(ctx, polls + 1, poll_delay(settings, polls + 1))
                if answer is None:  # no callback in time: poll
                    polls += 1
                    answer = await ctx.step(f"status-{polls}", coverage_status, runtime, ref)
                if answer["status"] != "pending":
                    break
                reason = "coverage pending at the insurance partner"
                if polls >= settings.max_attempts:
                    # durq archives the task after this raise and writes the ERROR alert line.
                    await store.mark_failed(
                        order.id, f"gave up after {polls} attempts: {reason}", polls
                    )
                    log.warning("order FAILED after %d attempts: %s", polls, reason, extra=fields)
                    raise durq.SkipRetry(f"gave up after {polls} polls: {reason}", alert=True)
                await store.record_attempt(order.id, polls, reason)
        except PermanentFailure as exc:
            await store.mark_failed(order.id, str(exc), max(polls, 1))
            log.warning("order FAILED: %s", exc, extra=fields)
            raise durq.SkipRetry(str(exc)) from None
        except (SystemUnavailableError, PartnerProtocolError) as exc:
            if ctx.retried >= ctx.max_retry:
                await store.mark_failed(
                    order.id, f"gave up after {ctx.attempt} attempts: {exc}", max(polls, 1)
                )
                log.warning("order FAILED after %d attempts: %s", ctx.attempt, exc, extra=fields)
            else:
                await store.record_attempt(order.id, max(polls, 1), str(exc))
            raise
        if answer["status"] == "rejected":
            error = f"rejected by the insurance partner: {answer['reason'] or 'no reason'}"
            await store.mark_failed(order.id, error, polls)
            log.warning("order FAILED: %s", error, extra=fields)
            raise durq.SkipRetry(error)
        policy = str(answer["policy"])
        await store.mark_covered(order.id, policy, polls)
        log.info("order COVERED: policy %s", policy, extra=fields)
        return {"order_id": order.id, "status": "COVERED", "policy": policy}

    @app.task(FINALIZE_TASK, queue=COVERAGE_QUEUE, max_retry=50, retention=7 * 24 * 3600)
    async def finalize(payload: dict[str, Any]) -> dict[str, Any]:
        """The coverage task was archived: its order is FAILED, whoever archived it."""
        task = payload["task"]
        order_id = (payload.get("payload") or {}).get("order_id")
        runtime = await runtimes.get()
        order = await runtime.store.get(order_id) if isinstance(order_id, str) else None
        if order is None or order.status != "PENDING":
            # Already final: the handler marks FAILED itself on its last attempt.
            return {"order_id": order_id, "status": order.status if order else None}
        error = payload.get("error") or "archived"
        await runtime.store.mark_failed(
            order.id, f"coverage task {task['id']} archived: {error}", order.attempts
        )
        log.warning(
            "order FAILED: coverage task archived (%s)",
            error,
            extra={"order_id": order.id, "task_id": task["id"]},
        )
        return {"order_id": order.id, "status": "FAILED"}

    return check_coverage


def build(settings: Settings, *, app: durq.App | None = None) -> tuple[durq.App, Runtimes]:
    """The durq app with the coverage task, and the per-loop runtimes it uses."""
    app = app or durq.App(settings.broker_url)
    runtimes = Runtimes(settings, app)
    register(app, runtimes, settings)
    return app, runtimes
