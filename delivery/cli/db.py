"""``delivery db``: schema migrations of the outbox."""

from __future__ import annotations

import click
from sqlalchemy.engine import make_url

from delivery.cli.common import (
    current_settings,
    open_engine,
)
from delivery.runtime.db import current_revision, upgrade

__all__ = ["db"]


@click.group()
def db() -> None:
    """Schema migrations of the outbox."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the outbox tables to the newest revision."""
    settings = current_settings()
    with open_engine(settings) as engine:
        upgrade(engine)
        revision = current_revision(engine)
    url = make_url(settings.database_url).render_as_string(hide_password=True)
    click.echo(f"{url} is at revision {revision}")


@db.command("current")
def db_current() -> None:
    """Print the outbox's schema revision (``none`` before ``db upgrade``)."""
    with open_engine() as engine:
        revision = current_revision(engine)
    click.echo(revision or "none")
