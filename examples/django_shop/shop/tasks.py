"""The shop's background work, as plain Django tasks (durq runs them)."""

from django.tasks import task

from shop.models import Order


@task
def confirm_order(order_id: int) -> dict:
    """Mark the order confirmed (the slow partner call would go here)."""
    order = Order.objects.get(pk=order_id)
    order.status = "confirmed"
    order.save(update_fields=["status"])
    return {"order": order.pk, "total_items": order.quantity}
