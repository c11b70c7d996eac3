"""durq in Django's admin: the "durq tasks" entry of the index and sidebar, whose page is
:func:`durq.contrib.django.views.task_page` (see there for permissions and actions)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path

from durq.contrib.django import views
from durq.contrib.django.models import Task


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):  # type: ignore[type-arg,misc]
    """The change list is durq's page; there is no add or change form (tasks are enqueued
    from code, and live in durq's broker, not in a table)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return views.task_page(request, self, extra_context)
