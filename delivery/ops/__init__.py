"""Operations: what ops ask of the outbox and how they repair it, free of any CLI or web
framework (the ``delivery`` CLI, the Django admin and the metrics exporter all call these).

- ``inspect``: read only: counts, ages and rates; one message and its attempt log; JSON views
  with the recipient masked.
- ``repair``: ``redrive``, ``resolve``, ``cancel``: each one conditional UPDATE on the
  expected status that emits a ``Transition``.
- ``prune``: delete final messages and their attempts in batches, never an open one.

Every function takes a SQLAlchemy ``Session`` and never commits: the caller decides. The names
below are the ops API (``delivery.ops.redrive``, ``delivery.ops.stats``, ...).

May import: ``delivery.errors``, ``delivery.pipeline`` (models, status, validation) and
``delivery.observability.events``; never the CLI, Celery or a provider.
"""

from __future__ import annotations

from delivery.ops.inspect import (
    attempt_dict,
    dead,
    dead_ids,
    find,
    message_dict,
    oldest_pending_age,
    rates,
    relay_lag,
    show,
    stats,
    stats_by_provider,
)
from delivery.ops.prune import PruneBatch, prunable, prune_batch
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
)

__all__ = [
    "REDRIVABLE",
    "RESOLVABLE",
    "CancelResult",
    "PruneBatch",
    "RedriveResult",
    "ResolveResult",
    "attempt_dict",
    "cancel",
    "dead",
    "dead_ids",
    "find",
    "message_dict",
    "oldest_pending_age",
    "prunable",
    "prune_batch",
    "rates",
    "redrive",
    "redrive_ids",
    "relay_lag",
    "resolve",
    "show",
    "stats",
    "stats_by_provider",
]
