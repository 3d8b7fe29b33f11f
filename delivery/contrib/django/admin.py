"""The admin page of the outbox: messages by status, their attempt logs, and the ops actions.

Read-only, recipients masked and payloads shown by size (as in ``delivery show``): no add, no
delete and no Save (``has_change_permission`` is false, so a posted change form is refused
with 403; ``save_model`` and ``delete_model`` raise as well). Messages change only through the
actions, ``delivery.ops``'s conditional ``redrive`` (nudged after commit), ``cancel`` and
``resolve``, which report a message that moved meanwhile instead of overwriting it. They need
the model's ``change`` permission (``delivery_outbox.change_message``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from sqlalchemy.orm import Session

from delivery import ops
from delivery.contrib.django.connection import borrowed_session
from delivery.contrib.django.models import Attempt, Message, Receipt
from delivery.contrib.nudge import nudge_after_commit
from delivery.core.status import Status
from delivery.observability.events import mask, tell_outcomes
from delivery.outbox.validation import canonical_json

__all__ = [
    "AttemptInline",
    "MessageAdmin",
    "ReceiptInline",
    "cancel",
    "redrive",
    "resolve_dead",
    "resolve_sent",
]

if TYPE_CHECKING:  # django-stubs' generics; Django's classes are not subscriptable at run time
    _ModelAdmin = admin.ModelAdmin[Message]
    _AttemptInline = admin.TabularInline[Attempt, Message]
    _ReceiptInline = admin.TabularInline[Receipt, Message]
else:
    _ModelAdmin = admin.ModelAdmin
    _AttemptInline = _ReceiptInline = admin.TabularInline

READ_ONLY = "the outbox admin is read-only: use its actions (redrive, cancel, resolve)"
# (ref, applied, reason) of one message, whatever the operation.
_Done = tuple[str, bool, str | None]


def _actor(request: HttpRequest) -> str:
    """The audit actor of an admin action: ``admin:<username>``."""
    return f"admin:{request.user.get_username()}"


def _apply(
    modeladmin: _ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Message],
    verb: tuple[str, str],
    run: Callable[[Session, list[str], str], Sequence[_Done]],
) -> None:
    """Run one ``delivery.ops`` operation on the selected keys in one Django transaction
    and report each message: done, or why not. ``verb``: ("Redrove", "redriven")."""
    using = queryset.db
    keys = list(queryset.values_list("key", flat=True))
    with transaction.atomic(using=using), borrowed_session(using) as session:
        results = list(run(session, keys, _actor(request)))
        # Django commits this session's work: its outcomes are told at Django's commit.
        told = ops.take_outcomes(session)
        if told:
            tell = functools.partial(tell_outcomes, told)
            transaction.on_commit(tell, using=using, robust=True)
    done = sum(1 for _, applied, _ in results if applied)
    if done:
        modeladmin.message_user(request, f"{verb[0]} {done} message(s).", messages.SUCCESS)
    for ref, applied, reason in results:
        if not applied:
            modeladmin.message_user(request, f"Not {verb[1]} {ref}: {reason}", messages.WARNING)


@admin.action(
    description="Redrive selected dead/unknown messages (same key)", permissions=["operate"]
)
def redrive(modeladmin: _ModelAdmin, request: HttpRequest, queryset: QuerySet[Message]) -> None:
    """``delivery.ops.redrive`` on the selection, in one transaction; nudged after commit."""

    def run(session: Session, keys: list[str], actor: str) -> list[_Done]:
        results = ops.redrive(session, keys, actor=actor)
        redriven = [r.id for r in results if r.redriven]
        if redriven:
            transaction.on_commit(
                functools.partial(nudge_after_commit, redriven),
                using=queryset.db,
                robust=True,
            )
        return [(r.key, r.redriven, r.reason) for r in results]

    _apply(modeladmin, request, queryset, ("Redrove", "redriven"), run)


@admin.action(description="Cancel selected pending messages", permissions=["operate"])
def cancel(modeladmin: _ModelAdmin, request: HttpRequest, queryset: QuerySet[Message]) -> None:
    """``delivery.ops.cancel`` on the selection: ``pending -> cancelled``, in one transaction."""

    def run(session: Session, keys: list[str], actor: str) -> list[_Done]:
        results = [ops.cancel(session, key, actor=actor) for key in keys]
        return [(r.key, r.cancelled, r.reason) for r in results]

    _apply(modeladmin, request, queryset, ("Cancelled", "cancelled"), run)


def _resolve_action(
    target: Status,
) -> Callable[[_ModelAdmin, HttpRequest, QuerySet[Message]], None]:
    """The action ``resolve_<target>``: ``delivery.ops.resolve``, ``unknown -> target``."""

    def run(session: Session, keys: list[str], actor: str) -> list[_Done]:
        results = [ops.resolve(session, key, target, actor=actor) for key in keys]
        return [(r.key, r.resolved, r.reason) for r in results]

    def action(modeladmin: _ModelAdmin, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        _apply(modeladmin, request, queryset, ("Resolved", "resolved"), run)

    action.__name__ = f"resolve_{target.value}"  # the action's name in the admin's form
    description = f"Resolve selected unknown messages as {target.value} (checked with the provider)"
    return admin.action(description=description, permissions=["operate"])(action)


resolve_sent = _resolve_action(Status.SENT)
resolve_dead = _resolve_action(Status.DEAD)


class _ReadOnly:
    """No add, no change form (a posted one is refused with 403), no delete."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AttemptInline(_ReadOnly, _AttemptInline):
    """The attempt log, oldest first, read-only, each with the provider it called."""

    model = Attempt
    extra = 0
    can_delete = False
    fields = (
        "number",
        "kind",
        "called",
        "started_at",
        "outcome",
        "http_status",
        "error_code",
        "error",
        "latency_ms",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Attempt]:
        return super().get_queryset(request).select_related("message")  # for ``called``

    @admin.display(description="provider")
    def called(self, attempt: Attempt) -> str:
        """The provider it called (a row written before failover: its message's)."""
        return attempt.provider or attempt.message.provider


class ReceiptInline(_ReadOnly, _ReceiptInline):
    """The provider's delivery receipts, oldest first, read-only, with what each did."""

    model = Receipt
    extra = 0
    can_delete = False
    fields = ("received_at", "provider", "event", "status", "code", "provider_at", "effect")
    readonly_fields = fields


@admin.register(Message)
class MessageAdmin(_ReadOnly, _ModelAdmin):
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
    actions = (redrive, cancel, resolve_sent, resolve_dead)
    inlines = (AttemptInline, ReceiptInline)
    fields = (
        "id",
        "key",
        "channel",
        "provider",
        "route",
        "masked_recipient",
        "payload_size",
        "status",
        "attempts",
        "max_attempts",
        "on_unknown",
        "needs_lookup",
        "pinned",
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

    @admin.display(description="route")
    def route(self, message: Message) -> str:
        """The providers its attempts went through, in order, then the one it is on now
        (``delivery.ops.route_of``): ``primary -> backup`` once it failed over."""
        attempts = Attempt.objects.filter(message_id=message.id).order_by("id")
        called = attempts.values_list("provider", flat=True)
        return " -> ".join(ops.route_of(message.provider, called))

    @admin.display(description="tries")
    def tries(self, message: Message) -> str:
        return f"{message.attempts}/{message.max_attempts}"

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """The actions (the CLI's conditional transitions) need the model's change permission."""
        opts = self.opts
        has_perm = getattr(request.user, "has_perm", None)
        return bool(has_perm and has_perm(f"{opts.app_label}.change_{opts.model_name}"))

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        raise PermissionDenied(READ_ONLY)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        raise PermissionDenied(READ_ONLY)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        raise PermissionDenied(READ_ONLY)
