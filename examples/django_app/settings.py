"""Settings of the Django example.

One URL drives Django and everything outside it: ``DELIVERY_DATABASE_URL`` (a SQLAlchemy URL
such as ``postgresql+psycopg://app:secret@127.0.0.1:5432/app``) becomes
``DATABASES["default"]`` here, and is what ``delivery db upgrade``, the Celery worker and beat
read: they never see Django's settings. It is required (PostgreSQL only), so that Django and
the worker cannot end up on two different databases. Secrets come from the environment only
(``DJANGO_SECRET_KEY``, the URL's password). ``DJANGO_DEBUG=1`` turns on Django's debug mode,
in which ``runserver`` also serves the admin's CSS and JavaScript (``run.sh`` sets it); without
it, run ``collectstatic`` into ``STATIC_ROOT`` and serve that folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from sqlalchemy.engine import make_url

DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-example-key-set-DJANGO_SECRET_KEY")
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",")
ROOT_URLCONF = "examples.django_app.urls"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
STATIC_ROOT = os.environ.get("DJANGO_STATIC_ROOT", str(Path.cwd() / ".delivery" / "static"))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "delivery.contrib.django",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]


def database(url: str) -> dict[str, object]:
    """``DATABASES["default"]`` from a SQLAlchemy PostgreSQL URL."""
    parsed = make_url(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parsed.database,
        "USER": parsed.username or "",
        "PASSWORD": parsed.password or "",
        "HOST": parsed.host or "",
        "PORT": str(parsed.port or ""),
    }


_URL = os.environ.get("DELIVERY_DATABASE_URL")
if not _URL:
    raise ImproperlyConfigured(
        "DELIVERY_DATABASE_URL is not set: set it to your PostgreSQL database "
        "(postgresql+psycopg://user:password@host:5432/name); Django, delivery db upgrade, "
        "the worker and beat all read it"
    )
DATABASES = {"default": database(_URL)}
