"""A small project with Django's admin and the shop example's tasks, served by
``runserver`` for the real-browser test and the docs' screenshots (``live_admin``).

Its files live in ``DURQ_DJANGO_LIVE_DIR``."""

import os

# The tests' middleware (sessions, CSRF, auth, messages), templates and fast hashing.
from django_backend.settings import MIDDLEWARE, PASSWORD_HASHERS, TEMPLATES  # noqa: F401

TMP = os.environ["DURQ_DJANGO_LIVE_DIR"]
SECRET_KEY = "live-admin-only"
DEBUG = True  # runserver serves the admin's static files
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.admin",
    "durq.contrib.django",
    "shop",  # examples/django_shop
]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(TMP, "db.sqlite3")}
}
TASKS = {
    "default": {"BACKEND": "durq.contrib.django.DurqBackend", "OPTIONS": {"database": "default"}}
}
ROOT_URLCONF = "django_backend.urls"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
