"""``delivery redrive``, ``delivery resolve``, ``delivery cancel``: repair messages
(``delivery.ops.repair``). Each exits 1 when a ref was not repaired."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict
from typing import Any

import click

from delivery import ops
from delivery.cli.common import (
    cell,
    echo,
    echo_json,
    new_console,
    new_table,
    open_session,
    progress_bar,
    since_option,
)
from delivery.config.loading import load_settings
from delivery.errors import MessageNotFound
from delivery.runtime.hooks import use_outcome_hooks

__all__ = ["cancel_command", "redrive_command", "resolve_command"]

_BULK = 500


@click.command("redrive")
@click.argument("refs", nargs=-1, metavar="ID_OR_KEY...")
@click.option("--all-dead", is_flag=True, help="Every dead message (filtered by --since, --code).")
@since_option("With --all-dead: died since then.")
@click.option("--code", help="With --all-dead: only those whose last error code is CODE.")
@click.option("--dry-run", is_flag=True, help="Say what would be redriven; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list with one result per message.")
def redrive_command(
    refs: tuple[str, ...],
    *,
    all_dead: bool,
    since: dt.datetime | None,
    code: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Send dead or unknown messages again, with the same key.

    Give ID_OR_KEY... or --all-dead. Exits 1 if any ref was not found or not redriven.
    """
    if bool(refs) == all_dead:
        raise click.UsageError("give either ID_OR_KEY... or --all-dead, not both or neither")
    if (since or code) and not all_dead:
        raise click.UsageError("--since and --code select dead messages: use them with --all-dead")
    if all_dead:
        _redrive_all_dead(since, code, dry_run, as_json)
        return
    rows: list[dict[str, Any]] = []
    with open_session() as session:
        for ref in refs:
            try:
                if dry_run:
                    message = ops.find(session, ref)
                    would = message.status in ops.REDRIVABLE
                    reason = None if would else f"message is {message.status}"
                    result = ops.RedriveResult(
                        ref, message.id, message.key, message.status, False, reason
                    )
                    rows.append({**asdict(result), "would_redrive": would})
                else:
                    (result,) = ops.redrive(session, [ref], actor=ops.cli_actor())
                    rows.append(asdict(result))
            except MessageNotFound as exc:
                unknown = dict.fromkeys(("id", "key", "from_status"))
                rows.append({"ref": ref, **unknown, "redriven": False, "reason": str(exc)})
        if not dry_run:
            session.commit()
    if as_json:
        echo_json(rows)
    else:
        done = "would redrive" if dry_run else "redriven"
        for row in rows:
            if row["redriven"] or row.get("would_redrive"):
                echo(
                    f"{done} {row['ref']}: message {row['id']} (key {row['key']!r}) "
                    f"{row['from_status']} -> pending"
                )
            elif row["id"] is None:
                echo(f"not found {row['ref']}: {row['reason']}", err=True)
            else:
                echo(
                    f"not redriven {row['ref']}: message {row['id']} "
                    f"(key {row['key']!r}): {row['reason']}",
                    err=True,
                )
    if not all(row["redriven"] or row.get("would_redrive") for row in rows):
        raise SystemExit(1)


def _redrive_all_dead(
    since: dt.datetime | None, code: str | None, dry_run: bool, as_json: bool
) -> None:
    """Redrive every matching dead message in batches of ``_BULK``, committing each."""
    rows: list[dict[str, Any]] = []
    with open_session() as session:
        ids = ops.dead_ids(session, since=since, code=code)
        if dry_run:
            messages = ops.dead(session, since=since, code=code, limit=max(len(ids), 1))
            nothing = "dry run: nothing changed"
            rows = [
                {
                    **asdict(ops.RedriveResult(str(m.id), m.id, m.key, m.status, False, nothing)),
                    "would_redrive": True,
                }
                for m in messages
            ]
        else:
            with progress_bar() as progress:
                task = progress.add_task("redriving", total=len(ids))
                for start in range(0, len(ids), _BULK):
                    results = ops.redrive_ids(
                        session, ids[start : start + _BULK], actor=ops.cli_actor()
                    )
                    session.commit()
                    rows.extend(asdict(result) for result in results)
                    progress.advance(task, _BULK)
    if as_json:
        echo_json(rows)
        return
    redriven = sum(1 for row in rows if row["redriven"] or row.get("would_redrive"))
    if dry_run:
        click.echo(f"would redrive {redriven} dead messages")
        table = new_table("id", "key", "status")
        for row in rows[:50]:
            table.add_row(cell(row["id"]), cell(row["key"]), cell(row["from_status"]))
        new_console().print(table)
        if len(rows) > 50:
            click.echo(f"... and {len(rows) - 50} more")
        return
    click.echo(f"redriven {redriven} of {len(ids)} dead messages")
    for row in rows:
        if not row["redriven"]:
            echo(f"not redriven {row['ref']} (key {row['key']!r}): {row['reason']}", err=True)
    if redriven != len(ids):
        raise SystemExit(1)


@click.command("resolve")
@click.argument("ref", metavar="ID_OR_KEY")
@click.option(
    "--as",
    "to_status",
    type=click.Choice([status.value for status in ops.RESOLVABLE]),
    required=True,
    help="What the provider says happened: sent, or dead (never delivered).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object with the result.")
def resolve_command(ref: str, to_status: str, as_json: bool) -> None:
    """Settle an unknown message as sent or dead after checking with the provider.

    Exits 1 if the message is not unknown.
    """
    settings = load_settings()
    use_outcome_hooks(settings)  # a resolve to dead is told to the app's outcome hooks
    with open_session(settings) as session:
        result = ops.resolve(session, ref, to_status, actor=ops.cli_actor())
        session.commit()
    if as_json:
        echo_json(asdict(result))
    elif result.resolved:
        echo(
            f"resolved {ref}: message {result.id} (key {result.key!r}) "
            f"{result.from_status} -> {result.to_status}"
        )
    else:
        echo(f"not resolved {ref}: {result.reason}", err=True)
    if not result.resolved:
        raise SystemExit(1)


@click.command("cancel")
@click.argument("refs", nargs=-1, required=True, metavar="ID_OR_KEY...")
@click.option("--json", "as_json", is_flag=True, help="A JSON list with one result per ref.")
def cancel_command(refs: tuple[str, ...], as_json: bool) -> None:
    """Cancel pending messages so they are never sent.

    A message already dispatched or sending is too late to cancel. Exits 1 if any ref was
    not cancelled.
    """
    results: list[ops.CancelResult] = []
    with open_session() as session:
        for ref in refs:
            results.append(ops.cancel(session, ref, actor=ops.cli_actor()))
        session.commit()
    if as_json:
        echo_json([asdict(result) for result in results])
    else:
        for r in results:
            if r.cancelled:
                echo(f"cancelled {r.ref}: message {r.id} (key {r.key!r}) pending -> cancelled")
            else:
                echo(f"not cancelled {r.ref}: message {r.id}: {r.reason}", err=True)
    if not all(result.cancelled for result in results):
        raise SystemExit(1)
