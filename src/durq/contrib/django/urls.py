"""The admin page's first URLs, kept working for projects that mounted them by hand::

    path("admin/durq/", include("durq.contrib.django.urls")),  # before admin.site.urls

Not needed any more: the page is in the admin (``/admin/durq/task/``, see
:mod:`durq.contrib.django.admin`); these URLs redirect there."""

from django.tasks import task_backends
from django.urls import path, register_converter

from durq.contrib.django import views
from durq.contrib.django.backend import DurqBackend


class _DurqAlias:
    """A ``TASKS`` alias of a durq backend, and nothing else: ``task/`` (the admin's own
    page under the same prefix) falls through to the admin's URLs."""

    regex = r"[^/]+"

    def to_python(self, value: str) -> str:
        try:
            backend = task_backends[value]
        except Exception:
            raise ValueError(value) from None
        if not isinstance(backend, DurqBackend):
            raise ValueError(value)
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(_DurqAlias, "durq_alias")

app_name = "durq"
urlpatterns = [
    path("", views.legacy_overview, name="overview"),
    path("<durq_alias:alias>/", views.legacy_overview, name="overview-backend"),
]
