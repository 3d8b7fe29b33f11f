"""The example view: a user and their welcome email commit together, or neither does."""

from __future__ import annotations

import json

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import delivery
from delivery.contrib.django import enqueue


def register_user(email: str) -> tuple[User, delivery.Message]:
    """Create a user and enqueue their welcome email in the current transaction."""
    user = User.objects.create_user(username=email, email=email)
    message = enqueue(
        channel="email",
        to=email,
        payload={"subject": "Welcome!", "text": "Thanks for signing up."},
        key=delivery.key("signup", user.pk, "welcome"),
    )
    return user, message


@csrf_exempt  # a JSON API for the example; keep CSRF on for browser forms
@require_POST
def signup(request: HttpRequest) -> JsonResponse:
    """``POST {"email": ...}``: 201 with the user id and the message key."""
    try:
        email = json.loads(request.body or b"{}").get("email")
    except (ValueError, AttributeError):
        email = None
    if not isinstance(email, str) or not email:
        return JsonResponse({"error": "email is required", "field": "email"}, status=400)
    try:
        with transaction.atomic():  # the user and the message, or neither
            user, message = register_user(email)
    except delivery.InvalidMessage as exc:
        return JsonResponse({"error": exc.problem, "field": exc.field}, status=400)
    except IntegrityError:
        return JsonResponse({"error": "this email is already registered"}, status=409)
    return JsonResponse({"id": user.pk, "message_key": message.key}, status=201)
