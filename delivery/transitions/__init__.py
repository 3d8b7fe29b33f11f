"""The one room that writes a message's status: every transition of the state machine
(``delivery.core.status``) is a named function here, over one row or many, that makes the
conditional UPDATE and emits the ``Transition`` event (``delivery.observability.events``) once
it moved the row. No other module writes the status column (``tests/test_status_writes.py``);
an INSERT's initial status is the row's creation, not a transition.

The fence rule: a row moves only while it is where its writer saw it, its status *and* its
attempt count (``fence.move``). The attempt count changes only when a worker takes a row and
never goes back, so a late worker, a duplicate task or a second relay is a no-op, never a
second send. The moves fenced on the status alone say why that is safe in their modules: the
relay's claim (``relay``), the sweeper's moves of every row past its lease or time-to-live
(``recovery``), the operators' repairs (``repair``) and the receipts' moves
(``receipts``); each starts from a status that no worker holds.

- ``vocabulary``: what a task does next (``Action``, ``Result``), the message in flight
  (``Sending``), why an attempt did not end it (``Failure``);
- ``fence``: the one fenced UPDATE (``move``, ``move_where``);
- ``attempts``: the attempt rows written with a call's transition;
- ``worker``: take, leave, finish_sent, stop, park, give_back, renew, extend_lease;
- ``failover``: a message moves to the next provider of its route (``fail_over``);
- ``recovery``: the sweeper's expire, requeue and recover;
- ``relay``: the relay's dispatch (the claim) and release;
- ``repair``: the operators' redrive, resolve and cancel;
- ``receipts``: a provider's delivery receipt recorded, and its move (``sent`` or ``unknown``
  -> ``delivered`` or ``undelivered``); the sweeper applies the ones that waited.

A message that ends ``delivered``, ``undelivered``, ``suppressed`` or ``dead`` is told to the
app's outcome hooks (``delivery.observability.events.add_outcome_hook``) only once its change
is committed: every caller that opens a transaction (or an autocommit connection) in which one
of these can happen opens ``tell_outcomes_after()`` around it, outside it (``with
tell_outcomes_after(), engine.begin() as conn:``); ``repair``'s moves, made in the caller's
``Session``, are told at that session's commit.

May import: ``delivery.config``, ``delivery.observability.events`` and the pipeline's shared
vocabulary (``models``, ``status``, ``outcomes``, ``policies``, ``clock``); never the modules
that call in here (``sender``, ``attempt``, ``settle``, ``relay``, ``sweeper``, ``delivery.ops``).
"""

from delivery.observability.events import tell_outcomes_after
from delivery.transitions.vocabulary import (
    IN_PROGRESS,
    Action,
    Failure,
    Result,
    Sending,
    in_progress,
)

__all__ = [
    "IN_PROGRESS",
    "Action",
    "Failure",
    "Result",
    "Sending",
    "in_progress",
    "tell_outcomes_after",
]
