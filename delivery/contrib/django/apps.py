"""The Django app: configures ``delivery`` from Django's settings when Django starts.

A bad setting fails there, naming it, except a missing ``DELIVERY_BROKER_URL``: management
commands that never send (``migrate``, ``createsuperuser``, ...) do not need the broker, so
then the settings and the nudge load at their first use instead, where the same one-line
``ConfigError`` names the variable (``enqueue`` raises it before writing anything).
"""

from __future__ import annotations

import functools
from typing import Any

from django.apps import AppConfig

__all__ = ["DeliveryConfig"]


class DeliveryConfig(AppConfig):
    """``INSTALLED_APPS = [..., "delivery.contrib.django"]``; app label ``delivery_outbox``."""

    name = "delivery.contrib.django"
    label = "delivery_outbox"
    verbose_name = "Delivery outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from delivery.contrib.django.connection import sqlalchemy_url
        from delivery.contrib.nudge import install_nudge, install_nudge_on_first_commit
        from delivery.contrib.settings import ENV_KEYS, OPTIONS_KEY, settings_from_config
        from delivery.errors import ConfigError
        from delivery.runtime.current import configure, configure_lazily

        names = (*ENV_KEYS, OPTIONS_KEY)
        config: dict[str, Any] = {n: getattr(settings, n) for n in names if hasattr(settings, n)}
        alias = getattr(settings, "DELIVERY_DATABASE_ALIAS", "default")
        load = functools.partial(
            settings_from_config, config, default_database_url=lambda: sqlalchemy_url(alias)
        )
        nudge = getattr(settings, "DELIVERY_NUDGE", True)
        try:
            configure(load())
        except ConfigError as exc:
            if exc.key != "DELIVERY_BROKER_URL":
                raise
            configure_lazily(load)
            if nudge:
                install_nudge_on_first_commit()
            return
        if nudge:
            install_nudge()
