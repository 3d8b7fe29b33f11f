"""``delivery prune``: delete final messages, their attempts and old audit rows
(``delivery.ops.prune``, ``delivery.ops.audit``)."""

from __future__ import annotations

import datetime as dt

import click

from delivery import ops
from delivery.cli.common import echo_json, open_session, progress_bar, since_callback

__all__ = ["prune_command"]

_KEPT = {"changed": "changed since the cutoff"}


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

    Works in batches, committing each; open messages are never deleted. On a partitioned
    outbox (PostgreSQL) whole days go: the cutoff is rounded down to midnight UTC, a day whose
    every message is one to delete is dropped at once, and a day that holds another is kept
    (and named) while its final messages are deleted one by one.
    """
    deleted, attempts, audit = 0, 0, 0
    with open_session() as session:
        cutoff = ops.days_cutoff(session, cutoff)
        total = ops.prunable(session, cutoff)
        days = ops.drop_days(session, cutoff, dry_run=dry_run)
        gone = [day for day in days if day.dropped]
        if not dry_run:
            deleted = sum(day.messages for day in gone)
            attempts = sum(day.attempts for day in gone)
            with progress_bar() as progress:
                task = progress.add_task("pruning", total=total, completed=deleted)
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
        "days_dropped": [day.day.suffix for day in gone],
        "days_kept": {day.day.suffix: day.kept for day in days if not day.dropped},
    }
    if as_json:
        echo_json(report)
        return
    for day in days:
        if "busy" in day.kept:
            click.echo(f"kept day {day.day.suffix}: its tables stayed locked (tried next time)")
        elif not day.dropped:
            why = ", ".join(
                f"{count} {_KEPT.get(status, status)}" for status, count in sorted(day.kept.items())
            )
            click.echo(f"kept day {day.day.suffix}: it holds {why}")
    dropped = f" ({len(gone)} whole days)" if gone else ""
    if dry_run:
        click.echo(
            f"would delete {total} final messages{dropped} last changed before "
            f"{cutoff:%Y-%m-%d %H:%M} UTC"
        )
    else:
        click.echo(
            f"deleted {deleted} final messages{dropped}, {attempts} attempts and {audit} audit "
            f"rows last changed before {cutoff:%Y-%m-%d %H:%M} UTC"
        )
