"""Delivery receipts: what providers call back about a message they accepted.

- ``protocol``: the reference protocol's receipts (kind ``http``): the signature check
  (Standard Webhooks, with the ``standardwebhooks`` library) and the receipt's fields, checked
  and bounded;
- ``receiver``: the WSGI app ``POST /receipts/{provider}`` that stores each receipt before it
  answers, and sheds load with 503 when the database does not answer (``delivery receiver``
  serves it).

Storing a receipt and the move it makes is the status room's (``delivery.transitions.receipts``).

May import: ``delivery.config``, ``delivery.core``, ``delivery.errors``, ``delivery.ops`` (the
audit of a receipt that resolves an ``unknown`` message), ``delivery.runtime`` and
``delivery.transitions``.
"""

from delivery.receipts.receiver import MAX_BODY, Answer, Receiver, make_receiver

__all__ = ["MAX_BODY", "Answer", "Receiver", "make_receiver"]
