"""``delivery db``: schema migrations of the outbox."""

from __future__ import annotations

import click
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from delivery.cli.common import open_engine
from delivery.config.loading import load_settings
from delivery.runtime.db import current_revision, database_error, revisions_between, upgrade

__all__ = ["db"]


@click.group()
def db() -> None:
    """Schema migrations of the outbox."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the outbox tables to the newest revision; print what was applied."""
    settings = load_settings()
    url = make_url(settings.database_url).render_as_string(hide_password=True)
    with open_engine(settings) as engine:
        try:
            before = current_revision(engine)
        except OperationalError as exc:
            raise database_error(exc, settings.database_url, upgrading=True) from None
        upgrade(engine)
        revision = current_revision(engine)
    applied = revisions_between(before, revision)
    if not applied:
        click.echo(f"{url} is already at revision {revision}: nothing to apply")
        return
    for rev, doc in applied:
        click.echo(f"applied {rev}: {doc}")
    click.echo(f"{url} is at revision {revision} (was {before or 'empty'})")


@db.command("current")
def db_current() -> None:
    """Print the outbox's schema revision (``none`` before ``db upgrade``)."""
    with open_engine() as engine:
        revision = current_revision(engine)
    click.echo(revision or "none")
