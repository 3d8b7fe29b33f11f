"""Django integration: add ``"delivery.contrib.django"`` to ``INSTALLED_APPS``.

- Settings: the ``DELIVERY_*`` names of ``delivery.config.loading`` are read from Django's settings,
  then the environment (``delivery.contrib.settings``). Without ``DELIVERY_DATABASE_URL`` the
  outbox is the database of ``DATABASES[DELIVERY_DATABASE_ALIAS]`` (``"default"``), which is
  what ``enqueue`` writes through (PostgreSQL with psycopg 3 only). ``DELIVERY_NUDGE = False``
  skips importing the Celery app.
- ``enqueue(...)``: ``delivery.enqueue`` through Django's own connection, inside
  ``transaction.atomic()``; the nudge runs from ``transaction.on_commit``.
- Schema: one. ``delivery db upgrade`` (Alembic) creates ``delivery_messages`` and
  ``delivery_attempts``; the models here are unmanaged (``managed = False``) views of those
  tables, so ``manage.py migrate`` creates nothing for this app. A test checks that their
  fields match the SQLAlchemy columns.
- Admin: messages listed with filters by status, channel and provider, each with its attempt
  log; actions *redrive* (``delivery.ops.redrive``: dead/unknown back to pending, same key)
  and *cancel* (``delivery.ops.cancel``: pending -> cancelled, a conditional UPDATE).

Only ``enqueue`` is imported here; the models load when Django loads the app. May import:
Django, ``delivery.contrib`` and the public surface of ``delivery`` (see ``delivery.contrib``).
"""

from __future__ import annotations

from delivery.contrib.django.outbox import enqueue

__all__ = ["enqueue"]
