"""Framework integrations: ``delivery.contrib.flask`` and ``delivery.contrib.django``.

Both read the ``DELIVERY_*`` settings from the framework's configuration (falling back to the
environment) with ``delivery.contrib.settings.settings_from_config``, and install the
post-commit nudge so that a committed message is published at once instead of on the next
beat tick. Neither is imported by ``delivery`` itself: Flask and Django stay optional.

May import: the public surface of ``delivery`` (``config``, ``runtime``, ``core``, ``outbox``,
``relay``, ``ops``, ``observability.events``, and ``receipts``, the receipt receiver they
mount), their own framework, and ``delivery.worker`` by
name only when the nudge is installed (``nudge.install_nudge``); nothing in ``delivery``
imports them.
"""
