"""Idempotency keys derived from business intent (guarantee G2; docs/concepts.md, "Keys from
business intent"): ``key`` for an app's messages, ``agent_key`` for the tools an LLM agent
calls. A key names the *intent*, not the attempt: the same on every retry, after every
restart, in every process.

A ``-`` inside a part is allowed (``user-signup``, negative numbers), so ``("a-b", 1)`` and
``("a", "b-1")`` give the same key: start every key with a fixed namespace that names the
kind of thing (``order``, ``signup``) and let only the last parts vary.
"""

from __future__ import annotations

import hashlib
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from delivery.errors import InvalidMessage
from delivery.outbox.validation import canonical_json, check_key

__all__ = ["DIGEST_LENGTH", "agent_key", "key"]

DIGEST_LENGTH = 16
"""Hex characters of sha256 kept in ``agent_key`` (64 bits)."""


def _part(value: Any, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | uuid.UUID):
        raise InvalidMessage("key", f"{what} must be a str, int or UUID, not {value!r}")
    text = str(value)
    if not text:
        raise InvalidMessage("key", f"{what} is empty")
    if ":" in text:
        raise InvalidMessage("key", f"{what} {text!r} contains ':', which separates the parts")
    if any(unicodedata.category(ch) == "Cc" for ch in text):
        raise InvalidMessage("key", f"{what} {text!r} contains a control character")
    return text


def key(*parts: str | int | uuid.UUID) -> str:
    """The idempotency key of a business intent: ``key("order", 42, "receipt")`` is
    ``"order-42:receipt"``. Raises ``InvalidMessage`` (field ``key``) on bad parts."""
    if len(parts) < 2:
        raise InvalidMessage("key", "needs at least two parts: what, then what for")
    texts = [_part(value, f"part {i + 1}") for i, value in enumerate(parts)]
    return check_key(f"{'-'.join(texts[:-1])}:{texts[-1]}")


def agent_key(
    run_id: str | int | uuid.UUID,
    step_id: str | int | uuid.UUID,
    args: Mapping[str, Any],
    *,
    important: Sequence[str] | None = None,
) -> str:
    """``"{run_id}:{step_id}:{digest}"``: the key of one side-effecting tool call of an agent.

    ``digest`` is the first 16 hex characters of the sha256 of the canonical JSON (sorted
    keys, no spaces) of ``{name: args[name] for name in important}``; with ``important``
    ``None`` every argument counts. Raises ``InvalidMessage``: field ``key`` for a bad run or
    step id, ``important`` for a name that is not in ``args``, ``args`` for arguments that are
    not a mapping with string keys or not JSON-serialisable.
    """
    run = _part(run_id, "run_id")
    step = _part(step_id, "step_id")
    if not isinstance(args, Mapping) or not all(isinstance(name, str) for name in args):
        raise InvalidMessage("args", "must be a mapping with string keys")
    if important is None:
        chosen = dict(args)
    else:
        if isinstance(important, str):
            raise InvalidMessage("important", "must be a sequence of argument names, not a str")
        missing = [name for name in important if name not in args]
        if missing:
            named = ", ".join(map(str, missing))
            known = ", ".join(sorted(map(str, args)))
            raise InvalidMessage("important", f"{named} not among the arguments ({known})")
        chosen = {name: args[name] for name in important}
    try:
        document = canonical_json(chosen)
    except InvalidMessage as exc:
        raise InvalidMessage("args", exc.problem) from None
    digest = hashlib.sha256(document.encode()).hexdigest()[:DIGEST_LENGTH]
    return check_key(f"{run}:{step}:{digest}")
