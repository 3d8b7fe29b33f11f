"""``delivery stats``, ``delivery dead``, ``delivery show``: read the outbox (``ops.inspect``)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from delivery import ops
from delivery.cli.common import (
    age,
    cell,
    echo_json,
    new_console,
    new_table,
    open_session,
    since_option,
)

__all__ = ["DUE", "TRIES", "dead_command", "move_text", "route_text", "show", "stats"]

#: What the age under ``stats`` counts.
DUE = "pending or in flight, and due; messages scheduled for later do not count"
#: What a timeline's ``round`` and ``try N`` count (also on the console's message page).
TRIES = (
    "round: each redrive opens the next round; try N: the message's attempt count at that "
    "call, across rounds (a redrive does not reset it, it grants max_attempts more)"
)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object: status -> count.")
@click.option(
    "--by-provider",
    is_flag=True,
    help="Also counts per provider and the oldest pending age (JSON: extra keys "
    "'by_provider' and 'oldest_pending_age_seconds' beside the status counts).",
)
def stats(as_json: bool, by_provider: bool) -> None:
    """Count messages in every status (and per provider, with --by-provider)."""
    with open_session() as session:
        counts = ops.stats(session)
        providers = ops.stats_by_provider(session) if by_provider else {}
        oldest = ops.oldest_pending_age(session)
    if as_json:
        extra = {"by_provider": providers, "oldest_pending_age_seconds": oldest}
        echo_json({**counts, **extra} if by_provider else counts)
        return
    table = Table("status", "messages", *providers, title="delivery outbox")
    for status, count in counts.items():
        table.add_row(cell(status), cell(count), *(cell(c[status]) for c in providers.values()))
    table.add_section()
    totals = (cell(sum(c.values())) for c in providers.values())
    table.add_row(Text("total", style="bold"), cell(sum(counts.values())), *totals)
    console = new_console()
    console.print(table)
    console.print(f"oldest due message: {age(oldest)} ({DUE})")


@click.command("dead")
@since_option("Only messages that died since then.")
@click.option("--code", help="Only messages whose last error code is CODE.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of messages.")
def dead_command(since: dt.datetime | None, code: str | None, limit: int, as_json: bool) -> None:
    """List dead messages, most recent first."""
    with open_session() as session:
        messages = ops.dead(session, since=since, code=code, limit=limit)
    if as_json:
        echo_json([ops.message_dict(message) for message in messages])
        return
    if not messages:
        click.echo("no dead messages")
        return
    table = new_table(
        "id", "key", "channel", "recipient", "tries", "code", "updated (UTC)", "error"
    )
    table.title = f"{len(messages)} dead"
    for message in messages:
        fields = ops.message_dict(message)
        table.add_row(
            cell(message.id),
            cell(message.key),
            cell(message.channel),
            cell(fields["recipient"]),
            cell(f"{message.attempts}/{message.max_attempts}"),
            cell(message.last_error_code),
            cell(message.updated_at),
            cell(fields["last_error"]),
        )
    new_console().print(table)


def _timeline_table(
    events: Sequence[ops.Event], shown: Sequence[dict[str, Any]], moved: str | None
) -> Table:
    """Attempts numbered across redrives (``#``), each with the provider it called, the
    operator actions and the moves to another provider between them; the error printed is the
    masked one of ``shown`` (``ops.attempt_dict``), never the stored text; ``moved``: the
    message's masked ``last_error``, the reason of its latest failover."""
    errors = {fields["id"]: fields["error"] for fields in shown}
    providers = {fields["id"]: fields["provider"] for fields in shown}
    table = new_table(
        "#",
        "round",
        "when (UTC)",
        "what",
        "provider",
        "outcome",
        "http",
        "code",
        "ms",
        "error / detail",
    )
    table.title = "timeline"
    for event in events:
        attempt, action, receipt, move = event.attempt, event.audit, event.receipt, event.move
        if attempt is not None:
            latency = None if attempt.latency_ms is None else f"{attempt.latency_ms:.0f}"
            table.add_row(
                cell(event.seq),
                cell(event.round),
                cell(attempt.started_at),
                cell(f"{attempt.kind} (try {attempt.number})"),
                cell(providers.get(attempt.id)),
                cell(attempt.outcome),
                cell(attempt.http_status),
                cell(attempt.error_code),
                cell(latency),
                cell(errors.get(attempt.id)),
            )
        elif move is not None:
            table.add_row(
                cell(None),
                cell(event.round),
                cell(None),  # not recorded: the move sits between the attempts it parts
                cell("failover"),
                cell(move_text(move)),
                *[cell(None)] * 4,
                cell(moved if move.latest else None),
            )
        elif receipt is not None:
            table.add_row(
                cell(None),
                cell(event.round),
                cell(receipt.received_at),
                cell(f"receipt {receipt.status}"),
                cell(None),
                cell(receipt.effect),
                cell(None),
                cell(receipt.code),
                cell(None),
                cell(f"{receipt.event}, provider's time {receipt.provider_at or '-'}"),
            )
        elif action is not None:
            moved_status = (
                f"{action.from_status} -> {action.to_status}" if action.from_status else None
            )
            table.add_row(
                cell(None),
                cell(event.round),
                cell(action.at),
                cell(f"{action.action} by {action.actor}"),
                cell(None),
                cell(moved_status),
                *[cell(None)] * 3,
                cell(action.detail),
            )
    return table


def move_text(move: ops.Move) -> str:
    """``primary -> backup``; ``-> backup`` when no attempt was made at the first."""
    return f"{move.from_provider or ''} -> {move.to_provider}".lstrip()


def route_text(route: Sequence[str]) -> str:
    """A message's route as read: ``primary -> backup``."""
    return " -> ".join(route)


@click.command()
@click.argument("ref", metavar="ID_OR_KEY")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with the attempts.")
@click.option("--reveal", is_flag=True, help="Show the recipient and payload unmasked (audited).")
def show(ref: str, as_json: bool, reveal: bool) -> None:
    """Show one message and its full attempt log."""
    with open_session() as session:
        message, attempts = ops.show(session, ref)
        if reveal:
            ops.reveal(session, ref, actor=ops.cli_actor())
            session.commit()
        events = ops.timeline(session, message, attempts)
        receipts = [ops.receipt_dict(r) for r in ops.receipts(session, message)]
    data = ops.message_dict(message, attempts, reveal=reveal)
    data["receipts"] = receipts
    if as_json:
        echo_json(data)
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for name, value in data.items():
        if name in ("attempts", "receipts"):
            continue
        if name == "payload" and reveal:
            value = json.dumps(value, ensure_ascii=False)
        if name == "route":
            value = route_text(value)
        grid.add_row(Text(name), cell(value))
    console = new_console()
    console.print(grid)
    if events:
        console.print(_timeline_table(events, data["attempts"], data["last_error"]))
        console.print(TRIES, style="dim")
    else:
        console.print("no attempts yet")
