"""durq as the engine behind Django's Tasks framework (``django.tasks``, Django 6+).

Settings::

    INSTALLED_APPS = [..., "durq.contrib.django"]
    TASKS = {"default": {"BACKEND": "durq.contrib.django.DurqBackend",
                         "OPTIONS": {"database": "default"}}}

and run ``python manage.py durq_worker``. See ``docs/integrations.md``."""

from durq.contrib.django.backend import DurqBackend

__all__ = ["DurqBackend"]
