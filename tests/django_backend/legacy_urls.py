"""The admin page's URLs mounted by hand, as the docs used to say."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/durq/", include("durq.contrib.django.urls")),
    path("admin/", admin.site.urls),
]
