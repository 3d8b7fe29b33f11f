"""Process-wide settings, loaded from the environment on first use (or set explicitly)."""

from __future__ import annotations

import threading

from delivery.config.loading import load_settings
from delivery.config.settings import Settings

__all__ = ["configure", "get_settings"]

_lock = threading.Lock()
_settings: Settings | None = None


def configure(settings: Settings | None) -> None:
    """Use ``settings`` for this process (``None`` reloads from the environment next time)."""
    global _settings
    with _lock:
        _settings = settings


def get_settings() -> Settings:
    global _settings
    with _lock:
        if _settings is None:
            _settings = load_settings()
        return _settings
