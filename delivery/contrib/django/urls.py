"""The delivery receipt receiver in a Django project: ``path("hooks/",
include("delivery.contrib.django.urls"))`` serves ``POST hooks/receipts/<provider>``
(``delivery.receipts``; CSRF does not apply: each receipt is signed).

The receiver is built at the first receipt (importing this module connects to nothing): a
provider's missing secret or an outbox not migrated then fails that request with the
``ConfigError`` naming the setting, logged by Django, and every request after it until fixed.
It writes through an engine of its own on the outbox's database, each receipt in its own
committed transaction, outside any request transaction of Django's.
"""

from __future__ import annotations

import functools

from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from delivery.receipts import Receiver, Request, make_receiver
from delivery.runtime.current import get_settings

__all__ = ["receive", "urlpatterns"]


@functools.cache
def _receiver() -> Receiver:
    return make_receiver(get_settings())


@csrf_exempt
def receive(request: HttpRequest, provider: str) -> JsonResponse:
    try:
        length = int(request.META.get("CONTENT_LENGTH") or -1)
    except ValueError:
        length = -1
    answer = _receiver().respond(
        Request(
            provider,
            request.method or "",
            length,
            request,  # type: ignore[arg-type]  # Django's request reads its body as a file does
            {name.lower(): value for name, value in request.headers.items()},
            request.META.get("QUERY_STRING", ""),
        )
    )
    response = JsonResponse(answer.body, status=answer.code)
    for name, value in answer.headers:
        response[name] = value
    return response


urlpatterns = [path("receipts/<str:provider>", receive, name="delivery-receipts")]
