"""The admin's handle on durq's tasks: a model with no table of its own.

durq keeps tasks in its broker (durq's own tables, or Redis), never in a Django model. The
unmanaged :class:`Task` exists so Django's admin lists "durq tasks" in its index and sidebar,
and so its permissions (``durq.view_task``, ``durq.change_task`` to run or cancel a task,
``durq.delete_task``) can be given to staff as any other model's."""

from __future__ import annotations

from django.db import models


class Task(models.Model):  # type: ignore[misc]
    """A durq task, as the admin shows it (see :mod:`durq.contrib.django.admin`)."""

    class Meta:
        managed = False  # no table: the admin page reads durq's broker
        db_table = "durq_admin_task"
        verbose_name = "task"
        verbose_name_plural = "tasks"
        # Adding a task is enqueueing it from code; run and cancel need "change".
        default_permissions = ("view", "change", "delete")

    def __str__(self) -> str:
        return f"durq task {self.pk}"
