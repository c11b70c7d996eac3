"""Take the Django admin screenshots shown in docs/integrations.md.

Seeds a small project (the shop example's tasks, in every state, run by a real worker),
serves Django's admin with ``runserver`` from the Django venv and photographs the admin
index and durq's task page with Chromium::

    .venv/bin/python docs/screenshots/django_admin.py [--chromium /usr/bin/chromium]

Needs the ``dev`` extra (Playwright) here and the Django venv (``make install``; another
with ``DURQ_DJANGO_PYTHON``). Writes docs/screenshots/django-admin-*.png."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from django_backend.live_admin import PASSWORD, USER, live_admin  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with (
        tempfile.TemporaryDirectory(prefix="durq-django-shots-") as tmp,
        live_admin(Path(tmp)) as url,
        sync_playwright() as p,
    ):
        browser = p.chromium.launch(
            executable_path=args.chromium,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_context(viewport={"width": 1280, "height": 720}).new_page()
        page.goto(f"{url}/admin/login/?next=/admin/")
        page.fill("#id_username", USER)
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_selector("#content-main")
        page.screenshot(path=str(HERE / "django-admin-index.png"))
        page.goto(f"{url}/admin/durq/task/?queue=default&state=archived")
        page.wait_for_selector(".durq-actions")
        page.screenshot(path=str(HERE / "django-admin-tasks.png"), full_page=True)
        browser.close()
    print("wrote", ", ".join(f"django-admin-{n}.png" for n in ("index", "tasks")))


if __name__ == "__main__":
    main()
