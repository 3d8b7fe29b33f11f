"""Django integration: add ``"delivery.contrib.django"`` to ``INSTALLED_APPS``, and write with
``enqueue`` (``delivery.enqueue`` through Django's own connection, inside
``transaction.atomic()``). Settings, the one schema and the admin are in
[docs/integrations.md](../../../docs/integrations.md#django).

- ``apps``: the app's config; ``models``: unmanaged views of the outbox's tables; ``admin``:
  the read-only admin and its actions; ``outbox``: ``enqueue``; ``connection``: the outbox
  engine on Django's own database; ``migrations``: Django's record of the unmanaged models;
  ``urls``: the delivery receipt receiver, for ``include("delivery.contrib.django.urls")``.

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
