"""The service's settings: the environment round trip and the default orders database."""

from __future__ import annotations

import pytest
from examples.insurance.config import ConfigError, Settings, default_database_url
from examples.insurance.store import sqlite_path


def test_settings_survive_the_environment_round_trip() -> None:
    settings = Settings(
        broker_url="redis://127.0.0.1:6379/0?prefix=x",
        tokens={"tok": "alice"},
        warehouses={"north": "http://127.0.0.1:1"},
        callback_url="https://shop.example/partner/callbacks/coverage",
        partner_secret="s3cret",
        concurrency=3,
        lock_budget=0.5,
        monolith=False,
    )
    assert Settings.from_env(settings.to_env()) == settings


def test_orders_default_to_the_sqlite_brokers_own_file_for_absolute_paths() -> None:
    url = default_database_url("sqlite:////var/lib/app/durq.sqlite3?busy_timeout=10")
    assert sqlite_path(url) == "/var/lib/app/durq.sqlite3"
    assert sqlite_path(default_database_url("sqlite:///durq.sqlite3")) == "durq.sqlite3"


def test_a_callback_url_needs_the_partner_secret() -> None:
    with pytest.raises(ConfigError, match="INSURANCE_PARTNER_SECRET"):
        Settings(callback_url="https://shop.example/partner/callbacks/coverage")
