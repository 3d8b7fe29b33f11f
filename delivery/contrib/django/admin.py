"""The admin page of the outbox: messages by status, their attempt logs, redrive and cancel.

Recipients are masked and payloads shown by size only, as in ``delivery show``. Nothing can
be added, edited or deleted here: messages change only through the two actions, which keep
to the state machine (``delivery.pipeline.status``).

- *Redrive* is ``delivery.ops.redrive`` run in Django's transaction: ``dead`` or ``unknown``
  back to ``pending`` with the same key (``unknown`` ones ask the provider first).
- *Cancel* is ``delivery.ops.cancel``: ``pending -> cancelled``, a conditional UPDATE, so a
  message the relay claimed meanwhile is reported as too late, never overwritten.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from delivery import ops
from delivery.contrib.django.connection import borrowed_session
from delivery.contrib.django.models import Attempt, Message
from delivery.contrib.nudge import nudge_after_commit
from delivery.observability.events import mask
from delivery.pipeline.validation import canonical_json

__all__ = ["AttemptInline", "MessageAdmin", "cancel", "redrive"]

if TYPE_CHECKING:  # django-stubs' generics; Django's classes are not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin[Message]
    _AttemptInline = admin.TabularInline[Attempt, Message]
else:
    _ModelAdmin = admin.ModelAdmin
    _AttemptInline = admin.TabularInline


@admin.action(
    description="Redrive selected dead/unknown messages (same key)", permissions=["change"]
)
def redrive(modeladmin: _ModelAdmin, request: HttpRequest, queryset: QuerySet[Message]) -> None:
    """``delivery.ops.redrive`` on the selection, in one transaction; nudged after commit."""
    using = queryset.db
    keys = list(queryset.values_list("key", flat=True))
    with transaction.atomic(using=using), borrowed_session(using) as session:
        results = ops.redrive(session, keys)
        redriven = [r.id for r in results if r.redriven]
        if redriven:
            transaction.on_commit(
                functools.partial(nudge_after_commit, redriven), using=using, robust=True
            )
    skipped = [r for r in results if not r.redriven]
    if redriven:
        modeladmin.message_user(request, f"Redrove {len(redriven)} message(s).", messages.SUCCESS)
    for result in skipped:
        modeladmin.message_user(
            request, f"Not redriven {result.key}: {result.reason}", messages.WARNING
        )


@admin.action(description="Cancel selected pending messages", permissions=["change"])
def cancel(modeladmin: _ModelAdmin, request: HttpRequest, queryset: QuerySet[Message]) -> None:
    """``delivery.ops.cancel`` on the selection: ``pending -> cancelled``, in one transaction."""
    using = queryset.db
    keys = list(queryset.values_list("key", flat=True))
    with transaction.atomic(using=using), borrowed_session(using) as session:
        results = [ops.cancel(session, key) for key in keys]
    cancelled = sum(1 for result in results if result.cancelled)
    if cancelled:
        modeladmin.message_user(request, f"Cancelled {cancelled} message(s).", messages.SUCCESS)
    for result in results:
        if not result.cancelled:
            modeladmin.message_user(
                request, f"Not cancelled {result.key}: {result.reason}", messages.WARNING
            )


class AttemptInline(_AttemptInline):
    """The attempt log, oldest first, read-only."""

    model = Attempt
    extra = 0
    can_delete = False
    fields = (
        "number",
        "kind",
        "started_at",
        "outcome",
        "http_status",
        "error_code",
        "error",
        "latency_ms",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Message)
class MessageAdmin(_ModelAdmin):
    """Messages, newest first, filtered by status; read-only apart from the actions."""

    list_display = (
        "id",
        "key",
        "channel",
        "masked_recipient",
        "status",
        "tries",
        "last_error_code",
        "updated_at",
    )
    list_filter = ("status", "channel", "provider")
    search_fields = ("=key", "=provider_ref")
    actions = (redrive, cancel)
    inlines = (AttemptInline,)
    fields = (
        "id",
        "key",
        "channel",
        "provider",
        "masked_recipient",
        "payload_size",
        "status",
        "attempts",
        "max_attempts",
        "on_unknown",
        "needs_lookup",
        "next_attempt_at",
        "lease_expires_at",
        "last_error_code",
        "last_error",
        "provider_ref",
        "created_at",
        "updated_at",
        "sent_at",
    )
    readonly_fields = fields

    @admin.display(description="recipient")
    def masked_recipient(self, message: Message) -> str:
        return mask(message.recipient)

    @admin.display(description="payload")
    def payload_size(self, message: Message) -> str:
        return f"<hidden: {len(canonical_json(message.payload).encode())} bytes>"

    @admin.display(description="tries")
    def tries(self, message: Message) -> str:
        return f"{message.attempts}/{message.max_attempts}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
