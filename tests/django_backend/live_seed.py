"""Fill the live project (``live_settings``) with orders and their tasks in every state:
``python -m django_backend.live_seed`` with ``DJANGO_SETTINGS_MODULE`` set."""

from __future__ import annotations

from datetime import timedelta

import django

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.tasks import task_backends  # noqa: E402
from django.utils import timezone  # noqa: E402
from shop.models import Order  # noqa: E402
from shop.tasks import confirm_order  # noqa: E402

from django_backend.workers import run_until_finished  # noqa: E402

USER, PASSWORD = "admin", "admin-pw"


def main() -> None:
    call_command("migrate", verbosity=0)
    User.objects.create_superuser(USER, password=PASSWORD)
    backend = task_backends["default"]
    items = ["standing desk", "monitor arm", "desk lamp", "cable tray", "footrest"]
    orders = [Order.objects.create(item=item, quantity=n + 1) for n, item in enumerate(items)]
    ran = [confirm_order.enqueue(o.pk).id for o in orders]
    ran += [confirm_order.enqueue(pk).id for pk in (9001, 9002, 9003)]  # no such order: fails
    run_until_finished(backend, ran)
    later = timezone.now() + timedelta(hours=2)
    for order in orders[:2]:
        confirm_order.using(run_after=later).enqueue(order.pk)
    for order in orders[2:]:
        confirm_order.using(priority=10).enqueue(order.pk)  # pending: no worker runs now
    backend.close()


if __name__ == "__main__":
    main()
