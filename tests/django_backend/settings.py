"""Settings of the Django integration tests: SQLite (file) as ``default``, PostgreSQL as ``pg``
(a database of this run, made by conftest) and a Redis-backed task backend."""

import os
import tempfile
import uuid

from servers import PG_DSN, REDIS_URL

TMP = os.environ.setdefault("DURQ_DJANGO_TMP", tempfile.mkdtemp(prefix="durq-django-"))
PG_NAME = os.environ.setdefault("DURQ_DJANGO_PG_DB", f"durq_dj_{uuid.uuid4().hex[:10]}")
REDIS_PREFIX = os.environ.setdefault("DURQ_DJANGO_REDIS_PREFIX", f"durqdj{uuid.uuid4().hex[:10]}")
PG_HOST = PG_DSN.split("@", 1)[1].split("/", 1)[0].split(":")[0]

SECRET_KEY = "tests-only"
# A worker process may run with DEBUG on: Django then logs to its console handler.
DEBUG = os.environ.get("DURQ_DJANGO_DEBUG") == "1"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "durq.contrib.django",
    "django_backend.notes",
]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(TMP, "db.sqlite3")},
    "pg": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": PG_NAME,
        "USER": "postgres",
        "HOST": PG_HOST,
        "PORT": "5432",
    },
}
TASKS = {
    "default": {
        "BACKEND": "durq.contrib.django.DurqBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"database": "default"},
    },
    "pg": {
        "BACKEND": "durq.contrib.django.DurqBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"database": "pg"},
    },
    "redis": {
        "BACKEND": "durq.contrib.django.DurqBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"broker_url": f"{REDIS_URL}?prefix={REDIS_PREFIX}", "max_retry": 0},
    },
    "retrying": {
        "BACKEND": "durq.contrib.django.DurqBackend",
        "QUEUES": [],  # any queue
        "OPTIONS": {
            "broker_url": f"sqlite:///{os.path.join(TMP, 'retry.sqlite3')}",
            "max_retry": 2,
        },
    },
}
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ROOT_URLCONF = "django_backend.urls"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
ALLOWED_HOSTS = ["testserver"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
