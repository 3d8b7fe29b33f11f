"""Delivery receipts: what providers call back about a message they accepted.

- ``protocols``: each provider's receipt protocol, from the settings;
- ``standard``: the reference protocol's receipts (kind ``http``): the signature check
  (Standard Webhooks, with the ``standardwebhooks`` library) and the receipt's fields;
- ``twilio``: Twilio's StatusCallback (kind ``twilio``) and its ``X-Twilio-Signature``;
- ``fields``: what they share (a refused signature, a checked text field);
- ``receiver``: the WSGI app ``POST /receipts/{provider}`` that stores each receipt before it
  answers, and sheds load with 503 when the database does not answer (``delivery receiver``
  serves it);
- ``group_commit``: the receipts that arrive together stored in one transaction, by one
  writer thread.

Storing a receipt and the move it makes is the status room's (``delivery.transitions.receipts``).

May import: ``delivery.config``, ``delivery.core``, ``delivery.errors``, ``delivery.guards``
(the suppression list), ``delivery.observability`` (what ``/metrics`` serves), ``delivery.ops``
(the audit of a receipt that resolves an ``unknown`` message), ``delivery.providers`` (the
adapters' own vocabulary: Twilio's statuses and codes, the ``whsec_`` secrets),
``delivery.runtime`` and ``delivery.transitions``.
"""

from delivery.receipts.receiver import MAX_BODY, Answer, Receiver, Request, make_receiver

__all__ = ["MAX_BODY", "Answer", "Receiver", "Request", "make_receiver"]
