"""An order endpoint that saves the order and enqueues its task in one transaction."""

import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.tasks import TaskResultStatus
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from shop.models import Order
from shop.tasks import confirm_order


@csrf_exempt  # a JSON API for the example; put your own authentication in front of it
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    try:
        data = json.loads(request.body)
        item, quantity = str(data["item"]), int(data["quantity"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": "expected {'item': str, 'quantity': int}"}, status=400)
    if quantity < 1:
        return JsonResponse({"error": "quantity must be at least 1"}, status=400)
    with transaction.atomic():
        order = Order.objects.create(item=item, quantity=quantity)
        # Same transaction as the order: no order without its task, no task without its order.
        result = confirm_order.enqueue(order.pk)
        order.task_id = result.id
        order.save(update_fields=["task_id"])
        if item == "explode":  # lets the tests check that a rollback leaves nothing
            raise RuntimeError("the order failed after its task was enqueued")
    return JsonResponse(
        {"status": "queued", "order": order.pk, "task_id": result.id},
        status=202,
        headers={"Location": f"/orders/{order.pk}"},
    )


@require_GET
def order_status(request: HttpRequest, pk: int) -> JsonResponse:
    order = get_object_or_404(Order, pk=pk)
    result = confirm_order.get_result(order.task_id)
    body = {"order": order.pk, "status": order.status, "task": result.status}
    if result.status == TaskResultStatus.SUCCESSFUL:
        body["result"] = result.return_value
    return JsonResponse(body)
