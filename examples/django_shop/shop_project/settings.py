"""Settings of the django_shop example: durq stores its tasks in the project's own database.

``SHOP_DB=sqlite`` (default: ``shop.sqlite3`` here) or ``SHOP_DB=postgres`` (``SHOP_PG_*``)."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("SHOP_DEBUG") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "durq.contrib.django",  # manage.py durq_worker, durq's tables on migrate
    "shop",
]
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
ROOT_URLCONF = "shop_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if os.environ.get("SHOP_DB", "sqlite") == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",  # psycopg 3
            "NAME": os.environ.get("SHOP_PG_NAME", "shop"),
            "USER": os.environ.get("SHOP_PG_USER", "postgres"),
            "HOST": os.environ.get("SHOP_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("SHOP_PG_PORT", "5432"),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SHOP_SQLITE", str(BASE_DIR / "shop.sqlite3")),
            # The worker is another process: the test database must be a file too.
            "TEST": {"NAME": os.environ.get("SHOP_SQLITE_TEST", str(BASE_DIR / "test.sqlite3"))},
        }
    }

# The whole durq set-up: tasks live in the "default" database, in its transactions.
TASKS = {
    "default": {
        "BACKEND": "durq.contrib.django.DurqBackend",
        "OPTIONS": {"database": "default"},
    }
}
if os.environ.get("SHOP_TASKS") == "embedded":
    # No options: DURQ_BROKER_URL, else durq's embedded default (durq.sqlite3 in the working
    # directory); enqueues inside atomic() then wait for the commit.
    TASKS = {"default": {"BACKEND": "durq.contrib.django.DurqBackend"}}
