"""URLs of the read-only admin page (see :mod:`durq.contrib.django.views`)."""

from django.urls import path

from durq.contrib.django import views

app_name = "durq"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("<str:alias>/", views.overview, name="overview-backend"),
]
