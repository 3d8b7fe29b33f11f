"""A fault-injecting stub of the reference message provider, for tests and benchmarks.

Protocol (JSON over HTTP/1.1, keep-alive):

* ``POST /v1/messages`` with body ``{"to": "<non-empty string>", ...payload}`` and an optional
  ``Idempotency-Key`` header. Success is ``201 {"id": "msg_<hex>", "to": ..., "status":
  "accepted"}`` and records one *effect* under the key (``""`` when the header is absent or
  empty). A bad JSON body or a missing ``to`` gives ``400 {"code": "INVALID_REQUEST"}``.
* Dedupe (on by default, keyed requests only): the same key with the same body (sha256 of the
  raw bytes) replays the stored status and body byte for byte with no new effect; the same key
  with another body gives ``422 {"code": "IDEMPOTENCY_KEY_REUSED"}``; the same key while its
  first request is still in flight gives ``409 {"code": "IDEMPOTENCY_IN_PROGRESS"}``. Only
  answers that recorded an effect are stored, so a key that got an injected error can be retried.
* ``GET /v1/messages?idempotency_key=K`` returns ``200`` with the stored message (the 201
  shape) or ``404 {"code": "NOT_FOUND"}``. Lookup works whether or not dedupe is on.

Fault knobs (all off by default; ``PUT /_stub/faults`` merges a partial dict, top level only):

* ``drop_rate`` (0..1): record the effect and store the message, then close the connection
  without answering. Draws come from ``random.Random(seed)``; ``seed`` reseeds when set.
* ``delay_ms``: sleep after the dedupe check and before processing; the key is in flight.
* ``error_rate`` (0..1) and ``error_status`` (default 503): answer an error with no effect.
  A 503 with ``error_html`` (default true) is an HTML page; a 429 is ``{"code":
  "RATE_LIMITED"}``; anything else is ``{"code": "PROVIDER_ERROR"}``. ``retry_after``
  (seconds or null) adds a ``Retry-After`` header to these errors.
* ``fail_first``: the first N POSTs per key get the ``error_status`` answer, whatever
  ``error_rate`` says.
* ``rules``: ``{recipient: {"status": int, "json": value}}`` or ``{recipient: {"status": int,
  "body": "text", "content_type": "..."}}``. Such a recipient always gets that answer, before
  any other fault; a non-2xx rule records no effect, a 2xx rule records one (and lookup then
  returns the usual message shape); ``"drop": true`` on a 2xx rule takes effect and closes
  the connection unanswered (a lost answer for that recipient only; a repeat of the key gets
  the stored answer). Setting ``rules`` replaces the whole map.
* ``dedupe`` (default true): when false every POST is a new effect, but keys are still
  remembered for lookup.
* ``down`` (default false): a provider that is down. Every request to ``/v1/messages`` gets
  the ``error_status`` answer (as ``error_rate`` gives it), before anything else: a POST
  whose key and body would replay a stored answer too, and a lookup. No effect is recorded
  and nothing is stored; what the stub holds (effects, stored answers) is kept for when it
  comes back up, and the control API still answers.

Delivery receipts (off by default), as a provider calls back a StatusCallback URL: for each
effect (a ``drop``ped answer's too; never a replay) a daemon thread POSTs the message's
receipts to ``url``, one per status of its sequence, ``delay_ms`` after the effect:

* Body (compact JSON): ``{"id": "msg_...", "idempotency_key": K, "status": S, "code": null or
  "...", "at": "2026-12-06T03:00:00.123Z"}``; ``at`` is the event time, 1 ms apart along the
  sequence whatever the order sent.
* Headers (Standard Webhooks): ``content-type: application/json``, ``webhook-id: evt_<24 hex>``
  (one per event; a duplicate delivery reuses it), ``webhook-timestamp`` (Unix seconds of this
  POST), ``webhook-signature: v1,<base64 HMAC-SHA256(key, f"{id}.{timestamp}." + body)>`` with
  ``key = b64decode(secret.removeprefix("whsec_") + "==")``.
* A POST answered non-2xx, refused or timed out (5 s) is tried again after ``retry_ms``,
  doubling each time, ``max_tries`` times in all. No proxy, no redirect.

Receipt knobs (``PUT /_stub/receipts`` merges a partial dict, top level only):

* ``url`` (http(s) URL or null = off) and ``secret`` (``whsec_<base64>``, required with a url).
* ``statuses`` (default ``["sent", "delivered"]``), each with ``code`` null.
* ``rules``: ``{recipient: {"status": "delivered" | "undelivered", "code": "30003" or null}}``
  replaces the last status and its code for that recipient. Setting ``rules`` replaces the map.
* ``delay_ms`` (default 0); ``reorder`` (false): send a message's sequence last status first.
* ``duplicate_rate`` (0..1, per event): deliver the event twice. ``never_rate`` (0..1, per
  message): send no receipt. Draws come from their own ``random.Random(seed)``.
* ``max_tries`` (default 5, >= 1) and ``retry_ms`` (default 200).

Control API: ``GET|PUT /_stub/faults`` and ``GET|PUT /_stub/receipts`` (unknown or invalid
field -> 400 naming it; a PUT returns the whole config), ``POST /_stub/reset`` (faults and
receipts' config back to defaults, every log cleared, unsent receipts dropped),
``GET /_stub/receipts`` -> ``{"config": {...}, "sent": [{"event", "key", "status", "answer",
"tries", "duplicate"}], "queued": n}`` (one entry per receipt event in the order first
attempted; ``queued``: POSTs still to make, retries included; ``answer``
is the last HTTP status, null if never answered; ``tries`` counts a duplicate's POSTs too; the
config shows ``secret`` and the recipients of ``rules`` as sha256 hex; no recipient, body or
secret is shown), ``GET /_stub/effects`` -> ``{"effects": {key: n}, "total": n}``,
``GET /_stub/requests`` -> ``{"requests": [{"key", "to", "at", "status", "outcome", "auth"}]}``
in arrival order (outcome is effect, replay, error, dropped or rejected; a dropped request logs
the status it would have had; ``auth`` is the sha256 hex of the Authorization header, or null
when there was none; payloads and secrets are never logged),
``GET /_stub/health`` -> ``{"ok": true}``.

The package: ``answers`` (the answers, the knobs' validation, the receipts' body and
signature), ``state`` (what the stub remembers, and the receipts' sender thread), ``handler``
(the HTTP server and its request handler), ``server`` (``StubServer``, ``main``), ``client``
(``StubClient``). May import: nothing of ``delivery`` (it stands for somebody else's service).
"""

from __future__ import annotations

from delivery.testing.stub_provider.client import StubClient
from delivery.testing.stub_provider.server import StubServer, main

__all__ = ["StubClient", "StubServer", "main"]
