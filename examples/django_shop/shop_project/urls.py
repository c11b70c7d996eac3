from django.urls import path
from shop import views

urlpatterns = [
    path("orders", views.create_order, name="create-order"),
    path("orders/<int:pk>", views.order_status, name="order-status"),
]
