"""``enqueue`` for Django: ``delivery.enqueue`` through Django's own connection.

It runs inside ``transaction.atomic(using=...)``: within the caller's ``atomic`` block it is
a savepoint of the caller's transaction (rollback: no row, no send); outside one, its own
transaction. The publish of a row it wrote claimed is registered with ``transaction.on_commit``,
so it runs only once the outermost transaction has committed, never after a rollback.
"""

from __future__ import annotations

import functools
from typing import Unpack

from django.db import DEFAULT_DB_ALIAS, transaction

from delivery.config.settings import Settings
from delivery.contrib.django.connection import borrowed_session
from delivery.contrib.nudge import publish_after_commit
from delivery.core.models import Message
from delivery.outbox import enqueue as outbox
from delivery.outbox.enqueue import EnqueueArgs

__all__ = ["enqueue"]


def enqueue(
    *,
    settings: Settings | None = None,
    using: str = DEFAULT_DB_ALIAS,
    **message: Unpack[EnqueueArgs],
) -> Message:
    """Write one message in Django's current transaction on ``using`` and return it.

    The keyword arguments are ``delivery.enqueue``'s (``delivery.EnqueueArgs``, the one list
    both share; ``type=`` included) plus ``settings`` and ``using``, and so are the errors
    (``InvalidMessage`` naming the field, ``IdempotencyConflict``) and the
    same-key-same-payload rule; the returned ``delivery.Message`` is detached (the Django
    model is ``delivery.contrib.django.models.Message``). Never commits.
    """
    with transaction.atomic(using=using), borrowed_session(using) as session:
        message_row = outbox.enqueue(session, settings=settings, **message)
        # Only a row this call wrote claimed (new, due, the nudge installed): Django commits,
        # so the session's own after-commit nudge never runs.
        claims = outbox.take_claims(session)
        if claims:
            transaction.on_commit(
                functools.partial(publish_after_commit, claims), using=using, robust=True
            )
    return message_row
