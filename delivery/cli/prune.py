"""``delivery prune``: delete final messages, their attempts and old audit rows
(``delivery.ops.prune``, ``delivery.ops.audit``)."""

from __future__ import annotations

import datetime as dt

import click

from delivery import ops
from delivery.cli.common import echo_json, open_session, progress_bar, since_callback

__all__ = ["prune_command"]


@click.command("prune")
@click.option(
    "--older-than",
    "cutoff",
    required=True,
    callback=since_callback,
    metavar="30d|12h|ISO",
    help="Delete final messages last changed before then.",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Messages deleted per transaction.",
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with the counts.")
def prune_command(cutoff: dt.datetime, batch: int, dry_run: bool, as_json: bool) -> None:
    """Delete final messages (sent, delivered, undelivered, suppressed, dead, unknown,
    cancelled, expired), their attempts and receipts, and audit rows older than the cutoff.

    Works in batches, committing each; open messages are never deleted.
    """
    deleted, attempts, audit = 0, 0, 0
    with open_session() as session:
        total = ops.prunable(session, cutoff)
        if not dry_run:
            with progress_bar() as progress:
                task = progress.add_task("pruning", total=total)
                while True:
                    done = ops.prune_batch(session, cutoff, limit=batch)
                    session.commit()
                    if not done.messages:
                        break
                    deleted, attempts = deleted + done.messages, attempts + done.attempts
                    progress.advance(task, done.messages)
            while removed := ops.prune_audit_batch(session, cutoff, limit=batch):
                session.commit()
                audit += removed
    report = {
        "cutoff": cutoff.isoformat(),
        "dry_run": dry_run,
        "messages": total if dry_run else deleted,
        "attempts": attempts,
        "audit": audit,
    }
    if as_json:
        echo_json(report)
    elif dry_run:
        click.echo(
            f"would delete {total} final messages last changed before {cutoff:%Y-%m-%d %H:%M} UTC"
        )
    else:
        click.echo(
            f"deleted {deleted} final messages, {attempts} attempts and {audit} audit rows "
            f"last changed before {cutoff:%Y-%m-%d %H:%M} UTC"
        )
