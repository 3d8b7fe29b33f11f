"""``delivery.outbox.validation``'s shortcuts answer as the rules they stand for (pure, no
services): a plain key accepted by one regular expression, the payload hash from the payload's
canonical JSON made once."""

from __future__ import annotations

import hashlib
import json
import random
import string
from typing import Any

import pytest

from delivery import InvalidMessage
from delivery.config.settings import ChannelConfig, ProviderConfig, Settings, Timeouts
from delivery.outbox.routing import route
from delivery.outbox.validation import (
    MAX_KEY_LENGTH,
    check_key,
    checked_payload,
    payload_digest,
    payload_hash,
)


def key_rules(key: str) -> bool:
    """The key rules spelled one by one: non-empty, within the limit, printable ASCII, no
    space at either end."""
    return (
        0 < len(key) <= MAX_KEY_LENGTH
        and all(" " <= ch <= "~" for ch in key)
        and key[0] != " "
        and key[-1] != " "
    )


def test_check_key_accepts_exactly_the_keys_the_rules_allow() -> None:
    """Over 30,000 random strings (printable, NUL, non-ASCII, spaces; lengths around the
    limit) and the edge cases, check_key returns the key when the rules allow it and raises
    InvalidMessage naming "key" when they do not."""
    rng = random.Random(13)
    alphabet = string.printable + "\x00\x7f\u00e9\u2028  "
    keys = ["", " ", "a", " a", "a ", "a b", "~", "x" * 255, "x" * 256, "x" * 254 + " "]
    for _ in range(30_000):
        size = rng.choice([1, 2, 3, 8, 40, 254, 255, 256])
        keys.append("".join(rng.choice(alphabet) for _ in range(size)))
    for key in keys:
        if key_rules(key):
            assert check_key(key) == key
        else:
            with pytest.raises(InvalidMessage) as error:
                check_key(key)
            assert error.value.field == "key"


@pytest.mark.parametrize(
    "payload",
    [
        {"body": "code 1"},
        {"z": 1, "a": [1, 2.5, None, True], "m": {"y": "\u00e9\u2028", "b": {"c": "\U0001f600"}}},
        {"body": 'quote " backslash \\ newline \n'},
    ],
)
def test_payload_digest_is_the_hash_of_the_whole_canonical_document(payload: Any) -> None:
    """payload_digest, from the payload's canonical JSON, equals the sha256 of the canonical
    JSON of {"channel", "to", "payload"} (what payload_hash always was)."""
    document = json.dumps(
        {"channel": "sms", "to": "+12015550123", "payload": payload},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    expected = hashlib.sha256(document.encode()).hexdigest()
    assert payload_hash("sms", "+12015550123", payload) == expected
    _, payload_json = checked_payload("webhook", payload, 65536)
    assert payload_digest("sms", "+12015550123", payload_json) == expected


def test_a_route_is_kept_per_settings_object_and_per_arguments() -> None:
    """route() answers from its cache only for the same settings object and the same routing
    arguments: other settings, or other arguments, are resolved again."""
    settings = Settings(
        database_url="sqlite://",
        broker_url="memory://",
        providers={"a": ProviderConfig("a", "http", "http://a", Timeouts())},
        channels={"sms": ChannelConfig("sms", "a")},
    )
    spec = {"channel": "sms", "to": "+12015550123", "payload": {"body": "x"}}
    first = route(settings, spec)
    assert route(settings, dict(spec)) is first
    assert route(settings, {**spec, "max_attempts": 3}).max_attempts == 3
    assert route(settings.with_(max_attempts=5), spec).max_attempts == 5
    assert route(settings, spec).max_attempts == settings.max_attempts
    with pytest.raises(InvalidMessage) as error:
        route(settings, {**spec, "max_attempts": True})  # bool is not an int here
    assert error.value.field == "max_attempts"
