"""Settings of the Django example.

One URL drives both Django and the worker: ``DELIVERY_DATABASE_URL`` (a SQLAlchemy URL such as
``postgresql+psycopg://app:secret@127.0.0.1:5432/app``) becomes ``DATABASES["default"]``, and
``delivery.contrib.django`` hands the same database to ``delivery`` (PostgreSQL only). Without
it, ``postgresql+psycopg://127.0.0.1:5432/delivery_example``. Secrets come from the environment
only (``DJANGO_SECRET_KEY``, the URL's password).
"""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url

DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-example-key-set-DJANGO_SECRET_KEY")
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",")
ROOT_URLCONF = "examples.django_app.urls"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
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


DATABASES = {
    "default": database(
        os.environ.get("DELIVERY_DATABASE_URL")
        or "postgresql+psycopg://127.0.0.1:5432/delivery_example"
    )
}
