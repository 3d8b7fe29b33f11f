"""Django integration: add ``"delivery.contrib.django"`` to ``INSTALLED_APPS``.

- Settings: the ``DELIVERY_*`` names of ``delivery.config.loading`` are read from Django's settings,
  then the environment (``delivery.contrib.settings``). Without ``DELIVERY_DATABASE_URL`` the
  outbox is the database of ``DATABASES[DELIVERY_DATABASE_ALIAS]`` (``"default"``), which is
  what ``enqueue`` writes through (PostgreSQL with psycopg 3 only). ``DELIVERY_NUDGE = False``
  skips importing the Celery app.
- Outside Django: ``delivery db upgrade``, the Celery worker and beat never read Django's
  settings. They take ``DELIVERY_DATABASE_URL`` (and the other ``DELIVERY_*`` variables) from
  the environment, so it must name the database of ``DATABASES["default"]``
  (``examples/django_app/settings.py`` builds ``DATABASES`` from that variable).
- ``enqueue(...)``: ``delivery.enqueue`` through Django's own connection, inside
  ``transaction.atomic()``, with exactly its keyword arguments plus ``using``; the nudge runs
  from ``transaction.on_commit``.
- Schema: one. ``delivery db upgrade`` (Alembic) creates ``delivery_messages`` and
  ``delivery_attempts``; the models here are unmanaged (``managed = False``) views of those
  tables, so ``manage.py migrate`` creates nothing for this app. A test checks that their
  fields match the SQLAlchemy columns.
- Admin: messages listed with filters by status, channel and provider, each with its attempt
  log, read-only (no Save); the only writes are the actions, the CLI's conditional
  transitions: *redrive*, *cancel* and *resolve as sent/dead* (``delivery.contrib.django.admin``).

- ``apps``: the app's config; ``models``, ``admin``, ``outbox`` (the ``enqueue`` above),
  ``connection`` (the outbox engine on Django's own database); ``migrations``: Django's record
  of the unmanaged models.

Only ``enqueue`` is imported here; the models load when Django loads the app. May import:
Django, ``delivery.contrib`` and the public surface of ``delivery`` (see ``delivery.contrib``).
"""

from __future__ import annotations

try:
    import django  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "delivery.contrib.django needs Django: pip install 'delivery-outbox[django]'"
    ) from exc

from delivery.contrib.django.outbox import enqueue

__all__ = ["enqueue"]
