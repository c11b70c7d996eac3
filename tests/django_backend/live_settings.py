"""A small project with Django's admin and the shop example's tasks, served by
``runserver`` for the real-browser test and the docs' screenshots (``live_admin``).

Its files live in ``DURQ_DJANGO_LIVE_DIR``."""

import os

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
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
