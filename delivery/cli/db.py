"""``delivery db``: schema migrations of the outbox."""

from __future__ import annotations

import click
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from delivery.cli.common import open_engine
from delivery.config.loading import load_settings
from delivery.errors import ConfigError
from delivery.runtime import conversion, partitions
from delivery.runtime.db import (
    DATABASE_VARIABLE,
    UPGRADE_HINT,
    current_revision,
    database_error,
    head_revision,
    revisions_between,
    upgrade,
)

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
        partitioned_now = upgrade(engine)
        revision = current_revision(engine)
        with engine.connect() as conn:
            shape = partitions.is_partitioned(conn)
    applied = revisions_between(before, revision)
    if not applied:
        click.echo(f"{url} is already at revision {revision}: nothing to apply")
    for rev, doc in applied:
        click.echo(f"applied {rev}: {doc}")
    if applied:
        click.echo(f"{url} is at revision {revision} (was {before or 'empty'})")
    if partitioned_now:
        click.echo("partitioned by day: `delivery prune` drops whole days")
    elif engine.dialect.name == "postgresql" and not shape:
        click.echo(
            "not partitioned: `delivery db partition` converts it, and `delivery prune` then "
            "drops whole days (docs/operations.md, Retention)"
        )


@db.command("partition")
def db_partition() -> None:
    """Partition a PostgreSQL outbox by day (the pipeline may run: it waits well under a
    second), or on one that is, create the coming days' partitions."""
    settings = load_settings()
    with open_engine(settings) as engine:
        if engine.dialect.name != "postgresql":
            raise ConfigError(
                DATABASE_VARIABLE,
                f"names a {engine.dialect.name} outbox: only a PostgreSQL one is partitioned",
            )
        if current_revision(engine) != head_revision():
            raise ConfigError(
                DATABASE_VARIABLE, f"the outbox is not at the newest revision: run {UPGRADE_HINT}"
            )
        with engine.connect() as conn:
            already = partitions.is_partitioned(conn)
        if already:
            created = partitions.ensure_ahead(engine)
            click.echo(f"already partitioned; {len(created)} days created ahead")
            return
        done = conversion.partition(engine, say=lambda step: click.echo(f"  {step}"))
    click.echo(
        f"partitioned by day: {done.keys} keys recorded, the swap held the outbox for "
        f"{done.pause_s * 1000:.0f} ms, {len(done.created)} days created ahead"
    )


@db.command("current")
def db_current() -> None:
    """Print the outbox's schema revision (``none`` before ``db upgrade``)."""
    with open_engine() as engine:
        revision = current_revision(engine)
    click.echo(revision or "none")
