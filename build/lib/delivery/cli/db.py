"""``delivery db``: schema migrations of the outbox."""

from __future__ import annotations

import click
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from delivery.cli.common import (
    current_settings,
    open_engine,
)
from delivery.errors import ConfigError
from delivery.runtime.db import current_revision, upgrade

__all__ = ["db"]


def _revisions_between(before: str | None, after: str | None) -> list[tuple[str, str]]:
    """The migrations applied going from ``before`` to ``after``: (revision, first doc line)."""
    config = Config()
    config.set_main_option("script_location", "delivery:migrations")
    script = ScriptDirectory.from_config(config)
    if after is None:
        return []
    applied = []
    for rev in script.iterate_revisions(after, before):
        doc = (rev.doc or "").strip().splitlines()[0] if rev.doc else ""
        applied.append((rev.revision, doc))
    return list(reversed(applied))


@click.group()
def db() -> None:
    """Schema migrations of the outbox."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the outbox tables to the newest revision; print what was applied."""
    settings = current_settings()
    url = make_url(settings.database_url).render_as_string(hide_password=True)
    with open_engine(settings) as engine:
        try:
            before = current_revision(engine)
        except OperationalError as exc:
            raise ConfigError(
                "DELIVERY_DATABASE_URL",
                f"cannot connect to {url}: {str(exc.orig).strip().splitlines()[-1]} "
                "(create the database first, e.g. `createdb NAME`, or fix the URL)",
            ) from None
        upgrade(engine)
        revision = current_revision(engine)
    applied = _revisions_between(before, revision)
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
