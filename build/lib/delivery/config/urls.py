"""Database URLs as SQLAlchemy takes them: ``postgres://`` (Heroku's spelling) and a bare
``postgresql://`` get the installed driver; anything else fails in one line naming the
variable, never echoing the URL (it may hold a password)."""

from __future__ import annotations

from delivery.errors import ConfigError

__all__ = ["database_url_for"]

#: PostgreSQL drivers SQLAlchemy can use, preferred first; ``postgres://`` (Heroku's
#: spelling) and a bare ``postgresql://`` get the first one installed.
_PG_DRIVERS = (("psycopg", "psycopg"), ("psycopg2", "psycopg2"))


def database_url_for(url: str, key: str = "DELIVERY_DATABASE_URL") -> str:
    """``url`` as SQLAlchemy takes it, with its driver importable, or a one-line
    ``ConfigError`` naming ``key`` (never the URL itself: it may hold a password)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigError(key, "is not a database URL (expected e.g. postgresql://host/db)")
    if scheme in ("postgres", "postgresql"):
        driver = next((d for d, module in _PG_DRIVERS if _importable(module)), None)
        if driver is None:
            raise ConfigError(
                key, "is a PostgreSQL URL but no driver is installed (pip install psycopg)"
            )
        url = f"postgresql+{driver}://{rest}"
    try:
        dialect = make_url(url).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise ConfigError(
            key, f"{scheme}:// is not a database URL SQLAlchemy knows ({type(exc).__name__})"
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise ConfigError(
            key, f"{scheme}://: its driver is not installed ({exc.name or exc})"
        ) from None
    return url


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
