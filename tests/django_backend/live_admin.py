"""Serve the live project (``live_settings``) with ``manage.py runserver`` in the Django
venv, for a browser driven from another venv (Playwright lives in the main one).

Used by ``tests/integrations/test_django_admin_browser.py`` and
``docs/screenshots/django_admin.py``."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The Django venv's Python (``make install`` makes ``.venv-django``; another with this variable).
DJANGO_PYTHON = Path(os.environ.get("DURQ_DJANGO_PYTHON", ROOT / ".venv-django" / "bin" / "python"))
USER, PASSWORD = "admin", "admin-pw"  # as live_seed


def _env(directory: Path) -> dict[str, str]:
    path = [ROOT / "src", ROOT / "tests", ROOT / "examples" / "django_shop", ROOT]
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DURQ_"))},
        "PYTHONPATH": os.pathsep.join(str(p) for p in path),
        "DJANGO_SETTINGS_MODULE": "django_backend.live_settings",
        "DURQ_DJANGO_LIVE_DIR": str(directory),
        "PYTHONUNBUFFERED": "1",
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def live_admin(directory: Path, python: Path = DJANGO_PYTHON) -> Iterator[str]:
    """Seed a project in ``directory`` and serve it; yields its base URL."""
    env = _env(directory)
    subprocess.run(
        [str(python), "-m", "django_backend.live_seed"], env=env, check=True, timeout=120
    )
    port = _free_port()
    server = subprocess.Popen(
        [str(python), "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/admin/login/", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"runserver did not start: {server.stderr.read()}") from None
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.communicate(timeout=10)
