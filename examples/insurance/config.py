"""Configuration from the environment.

Every knob of the service is an ``INSURANCE_*`` variable with a safe default;
``DURQ_BROKER_URL`` picks the broker as everywhere in durq. :meth:`Settings.from_env` is the
only place that reads ``os.environ``; tests build ``Settings`` directly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from durq.brokers import resolve_url
from durq.errors import ValidationError
from durq.limits import parse_rate

#: The bound on waits inside a process: anything longer belongs in the task queue.
IN_MEMORY_WAIT_LIMIT = 2.0


#: The numeric settings, each read from ``INSURANCE_<NAME>``.
_NUMBERS = (
    "max_attempts",
    "backoff_base",
    "backoff_cap",
    "call_timeout",
    "fanout_timeout",
    "in_memory_wait",
    "breaker_failures",
    "breaker_reset",
    "bulkhead",
    "health_ttl",
    "lock_budget",
    "max_body",
    "concurrency",
    "worker_poll",
    "shutdown_timeout",
)


class ConfigError(ValueError):
    """An environment variable holds an invalid value."""


@dataclass(frozen=True)
class Settings:
    """Everything the service reads from the environment, typed and validated."""

    #: The durq broker (``DURQ_BROKER_URL``): sqlite, postgresql or redis.
    broker_url: str = "sqlite:///durq.sqlite3"
    #: The service's own database for orders. Default: the broker's PostgreSQL database
    #: (so an order and its task share one transaction), else ``sqlite:///insurance.sqlite3``.
    database_url: str = "sqlite:///insurance.sqlite3"
    #: PostgreSQL schema of the orders table.
    database_schema: str = "insurance"
    #: ``token=customer`` pairs: who may call the API.
    tokens: Mapping[str, str] = field(default_factory=dict)
    #: The insurance partner's base URL.
    partner_url: str = "http://127.0.0.1:8100"
    #: Where the partner POSTs its decision: this service's ``/partner/callbacks/coverage``
    #: as the partner reaches it. Empty: no callback is asked for, polling alone.
    callback_url: str = ""
    #: The secret shared with the partner: a callback is taken only with its signature.
    partner_secret: str = field(default="", repr=False)
    #: Warehouse systems for the availability fan-out: name -> base URL.
    warehouses: Mapping[str, str] = field(default_factory=dict)
    #: Seed: "after 20 attempts the task is FAILED".
    max_attempts: int = 20
    #: Backoff ``min(base * 2**n, cap)`` s; the default is base 1, cap 300.
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    #: Per-call deadline for every outbound HTTP call.
    call_timeout: float = 5.0
    #: One overall deadline for the warehouse fan-out (rule 3).
    fanout_timeout: float = 8.0
    #: Total in-process waiting one attempt may spend on transient retries (< 2 s).
    in_memory_wait: float = 1.0
    #: Circuit breaker: consecutive failures that open it, seconds it stays open.
    breaker_failures: int = 5
    breaker_reset: float = 30.0
    #: Bulkhead: concurrent calls per partner system. For the insurance partner it is a
    #: durq limit, so it holds across every worker process and machine.
    bulkhead: int = 8
    #: The insurance partner's rate (``"50/s"``, ``"600/m"``): a durq limit too.
    partner_rate: str = "50/s"
    #: Health probe cache (seconds).
    health_ttl: float = 5.0
    #: Seconds a write of the orders store waits for the SQLite write lock before the
    #: request is answered 503 with Retry-After.
    lock_budget: float = 5.0
    #: Largest request body accepted (bytes).
    max_body: int = 64 * 1024
    #: Run the worker inside the API process (monolith) or not (split).
    monolith: bool = True
    #: Worker tuning: concurrency and how often an idle worker looks for due retries.
    concurrency: int = 10
    worker_poll: float = 1.0
    shutdown_timeout: float = 10.0
    #: ``text`` or ``json`` logs.
    log_format: str = "text"
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if self.in_memory_wait >= IN_MEMORY_WAIT_LIMIT:
            raise ConfigError(
                f"INSURANCE_IN_MEMORY_WAIT must stay below {IN_MEMORY_WAIT_LIMIT:g}s "
                "(longer waits belong in the task queue)"
            )
        for name in ("max_attempts", "breaker_failures", "bulkhead", "concurrency", "max_body"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        for name in (
            "backoff_base",
            "backoff_cap",
            "call_timeout",
            "fanout_timeout",
            "lock_budget",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
        if self.callback_url and not self.partner_secret:
            raise ConfigError(
                "INSURANCE_CALLBACK_URL needs INSURANCE_PARTNER_SECRET: unsigned callbacks "
                "are refused"
            )
        if self.log_format not in ("text", "json"):
            raise ConfigError("INSURANCE_LOG_FORMAT is text or json")
        try:
            parse_rate(self.partner_rate)
        except ValidationError as exc:
            raise ConfigError(f"INSURANCE_PARTNER_RATE: {exc}") from None

    @property
    def uses_postgres_orders(self) -> bool:
        return urlsplit(self.database_url).scheme in ("postgresql", "postgres")

    def to_env(self) -> dict[str, str]:
        """The environment that :meth:`from_env` reads back as these settings (to start
        the API or a worker in another process)."""
        env = {
            "DURQ_BROKER_URL": self.broker_url,
            "INSURANCE_DATABASE_URL": self.database_url,
            "INSURANCE_DATABASE_SCHEMA": self.database_schema,
            "INSURANCE_TOKENS": _pairs(self.tokens),
            "INSURANCE_PARTNER_URL": self.partner_url,
            "INSURANCE_CALLBACK_URL": self.callback_url,
            "INSURANCE_PARTNER_SECRET": self.partner_secret,
            "INSURANCE_PARTNER_RATE": self.partner_rate,
            "INSURANCE_WAREHOUSES": _pairs(self.warehouses),
            "INSURANCE_MONOLITH": "1" if self.monolith else "0",
            "INSURANCE_LOG_FORMAT": self.log_format,
            "INSURANCE_LOG_LEVEL": self.log_level,
        }
        for name in _NUMBERS:
            env[f"INSURANCE_{name.upper()}"] = str(getattr(self, name))
        return env

    def with_(self, **changes: Any) -> Settings:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read ``INSURANCE_*`` and ``DURQ_BROKER_URL``."""
        env = os.environ if env is None else env
        broker_url = resolve_url(env.get("DURQ_BROKER_URL"))
        database_url = env.get("INSURANCE_DATABASE_URL") or default_database_url(broker_url)

        def num(name: str, default: float) -> float:
            raw = env.get(f"INSURANCE_{name}")
            if raw is None or raw == "":
                return default
            try:
                return float(raw)
            except ValueError:
                raise ConfigError(f"INSURANCE_{name}={raw!r} is not a number") from None

        def flag(name: str, default: bool) -> bool:
            raw = env.get(f"INSURANCE_{name}")
            if raw is None or raw == "":
                return default
            return raw.strip().lower() in ("1", "true", "yes", "on")

        return cls(
            broker_url=broker_url,
            database_url=database_url,
            database_schema=env.get("INSURANCE_DATABASE_SCHEMA", "insurance"),
            tokens=parse_pairs(env.get("INSURANCE_TOKENS", ""), "INSURANCE_TOKENS"),
            partner_url=env.get("INSURANCE_PARTNER_URL", cls.partner_url).rstrip("/"),
            callback_url=env.get("INSURANCE_CALLBACK_URL", ""),
            partner_secret=env.get("INSURANCE_PARTNER_SECRET", ""),
            partner_rate=env.get("INSURANCE_PARTNER_RATE") or cls.partner_rate,
            warehouses=parse_pairs(env.get("INSURANCE_WAREHOUSES", ""), "INSURANCE_WAREHOUSES"),
            monolith=flag("MONOLITH", True),
            **{
                name: type(getattr(cls, name))(num(name.upper(), getattr(cls, name)))
                for name in _NUMBERS
            },
            log_format=env.get("INSURANCE_LOG_FORMAT", "text"),
            log_level=env.get("INSURANCE_LOG_LEVEL", "INFO"),
        )


def _pairs(pairs: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in pairs.items())


def parse_pairs(raw: str, what: str) -> dict[str, str]:
    """``"a=x,b=y"`` -> ``{"a": "x", "b": "y"}``."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"{what}: expected name=value pairs, got {part!r}")
        out[key.strip()] = value.strip()
    return out


def default_database_url(broker_url: str) -> str:
    """Orders live next to the tasks when the broker is SQL (one transaction for both): in
    its PostgreSQL database, or in its SQLite file; with Redis, in the service's own SQLite
    file."""
    parts = urlsplit(broker_url)
    if parts.scheme in ("postgresql", "postgres"):
        query = {k: v[-1] for k, v in parse_qs(parts.query).items() if k != "schema"}
        return urlunsplit(parts._replace(query=urlencode(query)))
    if parts.scheme == "sqlite":
        # The broker's own file. Cut the query by hand: urlunsplit would turn the absolute
        # "sqlite:////tmp/x.db" into the relative "sqlite://tmp/x.db".
        return broker_url.split("?", 1)[0]
    return "sqlite:///insurance.sqlite3"
