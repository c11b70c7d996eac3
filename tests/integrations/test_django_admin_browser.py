"""durq's page in Django's admin, in a real browser (Debian's Chromium, headless): the
admin's ``runserver`` in the Django venv, Playwright here. Logs in, finds "durq tasks" in
the index, opens the tasks of a queue, retries an archived task, and checks that the page
fits a phone's width.

Skips without ``/usr/bin/chromium``, Playwright or the Django venv (``make install``;
another with ``DURQ_DJANGO_PYTHON``), except under ``CI=true``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard.test_browser import CHROMIUM, _require_browser
from django_backend.live_admin import DJANGO_PYTHON, PASSWORD, USER, live_admin

IN_CI = os.environ.get("CI", "").lower() == "true"


def _require() -> Any:
    """Playwright's ``sync_playwright`` (the dashboard's browser tests' rules), and the
    Django venv."""
    sync_playwright = _require_browser()
    if not DJANGO_PYTHON.exists():
        reason = f"no Django venv at {DJANGO_PYTHON} (make install, or DURQ_DJANGO_PYTHON)"
        if IN_CI:
            pytest.fail(f"the Django admin browser test cannot run: {reason}")
        pytest.skip(reason)
    return sync_playwright


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[tuple[Any, str]]:
    sync_playwright = _require()
    with live_admin(tmp_path) as url, sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield chromium, url
        finally:
            chromium.close()


def test_staff_find_durq_in_the_admin_and_retry_a_task_on_a_phone(
    browser: tuple[Any, str],
) -> None:
    chromium, url = browser
    context = chromium.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.goto(f"{url}/admin/login/?next=/admin/")
    page.fill("#id_username", USER)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.get_by_role("link", name="Tasks", exact=True).first.click()
    assert page.url == f"{url}/admin/durq/task/"
    page.locator('a[href$="state=archived"]').first.click()  # three failed orders
    assert "state=archived" in page.url
    rows = page.locator("tr", has_text="shop.tasks.confirm_order")
    assert rows.count() == 3
    assert "DoesNotExist: Order matching query does not exist." in rows.first.inner_text()
    # The wide table scrolls inside the page: the page itself is no wider than the phone.
    width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width

    rows.first.get_by_role("button", name="run").click()
    page.wait_for_selector(".messagelist .success")
    assert "will run now" in page.inner_text(".messagelist")
    assert page.locator("tr", has_text="shop.tasks.confirm_order").count() == 2
    context.close()
