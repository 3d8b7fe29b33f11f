"""Operations: what ops ask of the outbox and how they repair it, free of any CLI or web
framework (the ``delivery`` CLI, the console, the Django admin and the metrics exporter all
call these). Every function takes a SQLAlchemy ``Session`` and never commits: the caller decides.

- ``inspect``: read only: counts, ages and rates, the days a partitioned outbox has ready;
  one message, its attempt log and its route (the providers it went through); JSON views
  with the recipient masked.
- ``repair``: ``redrive``, ``resolve``, ``cancel``: each one conditional UPDATE on the
  expected status that emits a ``Transition`` (an outcome for the app's hooks is told at the
  session's commit; ``take_outcomes`` for a session that never commits itself).
- ``prune``: delete final messages and their attempts in batches, never an open one; on a
  partitioned outbox, drop whole days (``drop_days``).
- ``audit``: one row per operator action (repairs, reveals, breaker resets) with its actor.
- ``search``: the console's message search (keyset pages on indexed columns).
- ``series``: per-minute counts, error rates and latency percentiles for charts.
- ``timeline``: a message's attempts, the actions on it, its receipts and its moves to
  another provider, in time order.
- ``breakers``: each provider's breaker as a row, and an audited reset.
- ``suppression``: the suppression list: list, add, lift (audited; no recipient shown).
- ``receipts``: what the receipts of a recent window say per provider (delivery rate, lag).

May import: ``delivery.errors``, ``delivery.core`` (models, status), ``delivery.outbox``
(validation), ``delivery.transitions`` (every repair's status write), ``delivery.config``,
``delivery.guards.breaker`` and ``delivery.observability``; never the CLI, Celery or a
provider.
"""

from __future__ import annotations

from delivery.ops.audit import (
    DEFAULT_ACTOR,
    AuditRow,
    cli_actor,
    entries,
    prune_audit_batch,
    record,
    reveal,
)
from delivery.ops.inspect import (
    attempt_dict,
    attempt_provider,
    days_ahead,
    dead,
    dead_ids,
    find,
    message_dict,
    oldest_pending_age,
    rates,
    receipt_dict,
    relay_lag,
    route,
    route_of,
    show,
    stats,
    stats_by_provider,
)
from delivery.ops.prune import Dropped, PruneBatch, days_cutoff, drop_days, prunable, prune_batch
from delivery.ops.receipts import ReceiptRates, receipt_rates
from delivery.ops.repair import (
    REDRIVABLE,
    RESOLVABLE,
    CancelResult,
    RedriveResult,
    ResolveResult,
    cancel,
    redrive,
    redrive_ids,
    resolve,
    take_outcomes,
)
from delivery.ops.search import MessageFilter, Page, matching_ids, parse_filter, search
from delivery.ops.series import Series, series
from delivery.ops.timeline import Event, Move, receipts, timeline

__all__ = [
    "DEFAULT_ACTOR",
    "REDRIVABLE",
    "RESOLVABLE",
    "AuditRow",
    "CancelResult",
    "Dropped",
    "Event",
    "MessageFilter",
    "Move",
    "Page",
    "PruneBatch",
    "ReceiptRates",
    "RedriveResult",
    "ResolveResult",
    "Series",
    "attempt_dict",
    "attempt_provider",
    "cancel",
    "cli_actor",
    "days_ahead",
    "days_cutoff",
    "dead",
    "dead_ids",
    "drop_days",
    "entries",
    "find",
    "matching_ids",
    "message_dict",
    "oldest_pending_age",
    "parse_filter",
    "prunable",
    "prune_audit_batch",
    "prune_batch",
    "rates",
    "receipt_dict",
    "receipt_rates",
    "receipts",
    "record",
    "redrive",
    "redrive_ids",
    "relay_lag",
    "resolve",
    "reveal",
    "route",
    "route_of",
    "search",
    "series",
    "show",
    "stats",
    "stats_by_provider",
    "take_outcomes",
    "timeline",
]
