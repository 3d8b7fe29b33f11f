"""``delivery suppression list|add|lift``: the recipients a channel must not send to."""

from __future__ import annotations

from collections.abc import Callable

import click

from delivery.cli.common import cell, echo_json, new_console, new_table, open_session
from delivery.config.loading import load_settings
from delivery.config.settings import CHANNELS
from delivery.guards.suppression import Suppressions
from delivery.ops.audit import cli_actor
from delivery.ops.suppression import lift, suppress, suppressions

__all__ = ["suppression_group"]

_CHANNEL = click.argument("channel", type=click.Choice(CHANNELS))
_RECIPIENT = click.argument("recipient")


@click.group("suppression")
def suppression_group() -> None:
    """The suppression list: recipients never sent to again on a channel (kept as keyed
    hashes; DELIVERY_SUPPRESSION_SECRET, or the variable suppression_secret_env names)."""


@suppression_group.command("list")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON list, one object per entry.")
def list_command(limit: int, as_json: bool) -> None:
    """The newest entries: channel, hash (its first characters), code, source, when."""
    settings = load_settings()
    with open_session(settings) as session:
        rows = suppressions(session, Suppressions(settings), limit=limit)
    if as_json:
        echo_json([row.as_dict() for row in rows])
        return
    table = new_table("channel", "hash", "code", "source", "added (UTC)")
    for row in rows:
        table.add_row(
            *(cell(v) for v in (row.channel, row.hash, row.code, row.source)), cell(row.created_at)
        )
    new_console().print(table if rows else "the suppression list is empty")


@suppression_group.command("add")
@_CHANNEL
@_RECIPIENT
def add_command(channel: str, recipient: str) -> None:
    """Never send to RECIPIENT on CHANNEL again (audited)."""
    _change(suppress, channel, recipient, "added", "already on the list")


@suppression_group.command("lift")
@_CHANNEL
@_RECIPIENT
def lift_command(channel: str, recipient: str) -> None:
    """Let RECIPIENT be sent to on CHANNEL again (audited); exit 1 if it was not listed."""
    if not _change(lift, channel, recipient, "lifted", "not on the list"):
        raise SystemExit(1)


def _change(
    change: Callable[..., bool], channel: str, recipient: str, done: str, not_done: str
) -> bool:
    """Add or lift (``change``: ``ops.suppression``'s, audited) and say which happened."""
    settings = load_settings()
    with open_session(settings) as session:
        changed = change(session, Suppressions(settings), channel, recipient, actor=cli_actor())
        session.commit()
    click.echo(done if changed else not_done)
    return changed
