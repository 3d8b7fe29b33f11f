"""Unmanaged Django models over the tables ``delivery db upgrade`` creates.

The outbox has one schema, owned by the Alembic migrations shipped in ``delivery``: these
models only describe it (``managed = False``), for reading, filtering and reporting, and
``tests/test_django.py`` checks that every field matches its SQLAlchemy column. Write through
``delivery.contrib.django.enqueue`` and the admin actions, which keep to the state machine.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import models

from delivery.core.status import Status

__all__ = ["Attempt", "Message", "PayloadField"]


class PayloadField(models.JSONField):  # type: ignore[type-arg]
    """``payload`` is a ``json`` column (not ``jsonb``): the driver may already decode it."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if value is None or not isinstance(value, str):
            return value
        return super().from_db_value(value, expression, connection)


class Message(models.Model):
    """One logical message (``delivery.core.models.Message``); ``key`` is its idempotency
    key."""

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    key: models.CharField[str, str] = models.CharField(max_length=255, unique=True)
    channel: models.CharField[str, str] = models.CharField(max_length=32)
    provider: models.CharField[str, str] = models.CharField(max_length=64)
    recipient: models.TextField[str, str] = models.TextField()
    payload: PayloadField = PayloadField()
    payload_hash: models.CharField[str, str] = models.CharField(max_length=64)
    on_unknown: models.CharField[str, str] = models.CharField(max_length=16)
    status: models.CharField[str, str] = models.CharField(
        max_length=16, choices=[(s.value, s.value) for s in Status]
    )
    attempts: models.IntegerField[int, int] = models.IntegerField()
    max_attempts: models.IntegerField[int, int] = models.IntegerField()
    budget_start: models.IntegerField[int, int] = models.IntegerField(default=0)
    needs_lookup: models.BooleanField[bool, bool] = models.BooleanField()
    pinned: models.BooleanField[bool, bool] = models.BooleanField(default=False)
    next_attempt_at: models.DateTimeField[dt.datetime, dt.datetime] = models.DateTimeField()
    lease_expires_at: models.DateTimeField[dt.datetime | None, dt.datetime | None] = (
        models.DateTimeField(null=True)
    )
    last_error_code: models.CharField[str | None, str | None] = models.CharField(
        max_length=64, null=True
    )
    last_error: models.TextField[str | None, str | None] = models.TextField(null=True)
    provider_ref: models.CharField[str | None, str | None] = models.CharField(
        max_length=255, null=True
    )
    created_at: models.DateTimeField[dt.datetime, dt.datetime] = models.DateTimeField()
    updated_at: models.DateTimeField[dt.datetime, dt.datetime] = models.DateTimeField()
    sent_at: models.DateTimeField[dt.datetime | None, dt.datetime | None] = models.DateTimeField(
        null=True
    )
    message_type: models.CharField[str | None, str | None] = models.CharField(
        max_length=32, null=True
    )
    priority: models.CharField[str, str] = models.CharField(max_length=16, default="normal")
    expires_at: models.DateTimeField[dt.datetime | None, dt.datetime | None] = models.DateTimeField(
        null=True
    )
    traceparent: models.CharField[str | None, str | None] = models.CharField(
        max_length=55, null=True
    )

    class Meta:
        managed = False
        db_table = "delivery_messages"
        ordering = ("-id",)
        verbose_name = "outbox message"

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"


class Attempt(models.Model):
    """One call to the provider and how it ended (``delivery.core.models.Attempt``)."""

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    message: models.ForeignKey[Message, Message] = models.ForeignKey(
        Message,
        on_delete=models.DO_NOTHING,  # the database cascades (ON DELETE CASCADE)
        db_constraint=False,
        related_name="attempt_log",
    )
    message_id: int
    number: models.IntegerField[int, int] = models.IntegerField()
    kind: models.CharField[str, str] = models.CharField(max_length=16)
    provider: models.CharField[str | None, str | None] = models.CharField(max_length=64, null=True)
    started_at: models.DateTimeField[dt.datetime, dt.datetime] = models.DateTimeField()
    outcome: models.CharField[str, str] = models.CharField(max_length=16)
    http_status: models.IntegerField[int | None, int | None] = models.IntegerField(null=True)
    error_code: models.CharField[str | None, str | None] = models.CharField(
        max_length=64, null=True
    )
    error: models.TextField[str | None, str | None] = models.TextField(null=True)
    latency_ms: models.FloatField[float | None, float | None] = models.FloatField(null=True)

    class Meta:
        managed = False
        db_table = "delivery_attempts"
        ordering = ("id",)
        verbose_name = "delivery attempt"

    def __str__(self) -> str:
        return f"attempt {self.number} of message {self.message_id}: {self.outcome}"


class Receipt(models.Model):
    """A provider's delivery receipt and what it did to its message (``moved``, ``kept`` or
    ``waiting``; ``delivery.core.models.Receipt``). Written by the receiver; read-only here."""

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    message: models.ForeignKey[Message, Message] = models.ForeignKey(
        Message,
        on_delete=models.DO_NOTHING,  # the database cascades (ON DELETE CASCADE)
        db_constraint=False,
        related_name="receipts",
    )
    message_id: int
    provider: models.CharField[str, str] = models.CharField(max_length=64)
    event: models.CharField[str, str] = models.CharField(max_length=255)
    status: models.CharField[str, str] = models.CharField(max_length=16)
    code: models.CharField[str | None, str | None] = models.CharField(max_length=64, null=True)
    provider_at: models.DateTimeField[dt.datetime | None, dt.datetime | None] = (
        models.DateTimeField(null=True)
    )
    received_at: models.DateTimeField[dt.datetime, dt.datetime] = models.DateTimeField()
    effect: models.CharField[str, str] = models.CharField(max_length=16)

    class Meta:
        managed = False
        db_table = "delivery_receipts"
        ordering = ("id",)
        verbose_name = "delivery receipt"

    def __str__(self) -> str:
        return f"receipt {self.event} of message {self.message_id}: {self.status}"


class AuditEntry(models.Model):
    """One operator action (``delivery.core.models.AuditEntry``): who, when, what, on which
    message, from which status to which. Written by ``delivery.ops``; read-only here."""

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    at: models.DateTimeField[dt.datetime, dt.datetime] = models.DateTimeField()
    actor: models.CharField[str, str] = models.CharField(max_length=128)
    action: models.CharField[str, str] = models.CharField(max_length=32)
    message_id: models.BigIntegerField[int | None, int | None] = models.BigIntegerField(null=True)
    message_key: models.CharField[str | None, str | None] = models.CharField(
        max_length=255, null=True
    )
    from_status: models.CharField[str | None, str | None] = models.CharField(
        max_length=16, null=True
    )
    to_status: models.CharField[str | None, str | None] = models.CharField(max_length=16, null=True)
    detail: models.TextField[str | None, str | None] = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = "delivery_audit"
        ordering = ("-id",)
        verbose_name = "audit entry"
        verbose_name_plural = "audit"

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.message_key or ''}".rstrip()
