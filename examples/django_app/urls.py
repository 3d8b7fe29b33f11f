"""``/signup/`` (the example view) and ``/admin/`` (with the outbox's messages)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from examples.django_app.views import signup

urlpatterns = [
    path("signup/", signup, name="signup"),
    path("admin/", admin.site.urls),
]
