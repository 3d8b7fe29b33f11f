"""The Django app: configures ``delivery`` from Django's settings when Django starts."""

from __future__ import annotations

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
        from delivery.contrib.nudge import install_nudge
        from delivery.contrib.settings import ENV_KEYS, OPTIONS_KEY, settings_from_config
        from delivery.runtime.current import configure

        names = (*ENV_KEYS, OPTIONS_KEY)
        config: dict[str, Any] = {n: getattr(settings, n) for n in names if hasattr(settings, n)}
        alias = getattr(settings, "DELIVERY_DATABASE_ALIAS", "default")
        configure(settings_from_config(config, default_database_url=lambda: sqlalchemy_url(alias)))
        if getattr(settings, "DELIVERY_NUDGE", True):
            install_nudge()
