"""The package's shape: public API, layering, schema, and the linters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sqlalchemy import inspect

import delivery
from delivery.pipeline.models import Base
from delivery.runtime.db import make_engine, upgrade

ROOT = Path(__file__).resolve().parents[1]


def test_public_api_is_pinned_and_sorted() -> None:
    """delivery's public names are exactly these, sorted."""
    assert delivery.__all__ == sorted(delivery.__all__)
    assert delivery.__all__ == [
        "Attempt",
        "ConfigError",
        "DeliveryError",
        "IdempotencyConflict",
        "InvalidMessage",
        "Message",
        "MessageNotFound",
        "Settings",
        "Status",
        "Transition",
        "UnknownPolicy",
        "add_hook",
        "agent_key",
        "configure",
        "enqueue",
        "get_settings",
        "key",
        "load_settings",
    ]


def test_library_does_not_import_celery() -> None:
    """delivery/ is framework-free: importing all of it loads no Celery."""
    code = (
        "import sys, pkgutil, importlib, delivery, django\n"
        "from django.conf import settings\n"  # delivery.contrib.django's models need an app
        "settings.configure(DELIVERY_NUDGE=False, DELIVERY_DATABASE_URL='sqlite://',\n"
        "    INSTALLED_APPS=['django.contrib.admin', 'django.contrib.auth',\n"
        "    'django.contrib.contenttypes', 'django.contrib.messages',\n"
        "    'delivery.contrib.django'])\n"
        "django.setup()\n"
        "for m in pkgutil.walk_packages(delivery.__path__, 'delivery.'):\n"
        "    if '.migrations' not in m.name: importlib.import_module(m.name)\n"
        "assert 'celery' not in sys.modules, 'celery imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_migrations_match_models(tmp_path: Path) -> None:
    """The shipped Alembic migration creates the same columns and indexes as the models."""
    engine = make_engine(f"sqlite:///{tmp_path}/m.sqlite3")
    upgrade(engine)
    inspector = inspect(engine)
    for table in Base.metadata.sorted_tables:
        migrated = {c["name"] for c in inspector.get_columns(table.name)}
        assert migrated == set(table.columns.keys()), table.name
        indexes = {i["name"] for i in inspector.get_indexes(table.name)}
        assert {i.name for i in table.indexes} <= indexes, table.name


def test_ruff_and_mypy_are_clean() -> None:
    """The code passes ruff and strict mypy as configured in pyproject.toml."""
    for argv in (["ruff", "check", "delivery", "tasks", "tests"], ["mypy"]):
        result = subprocess.run(
            [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
