"""Keys from business intent: ``delivery.key`` and ``delivery.agent_key`` (pure, no services)."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import pytest

import delivery
from delivery import InvalidMessage, agent_key, key


def test_key_joins_intent_with_dashes_and_purpose_with_a_colon() -> None:
    """key("order", 42, "receipt") is "order-42:receipt", and longer intents join with "-"."""
    assert key("order", 42, "receipt") == "order-42:receipt"
    assert key("signup", "u_17", "otp", 3) == "signup-u_17-otp:3"
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert key("user", ident, "welcome") == f"user-{ident}:welcome"
    assert delivery.key is key


@pytest.mark.parametrize(
    ("parts", "problem"),
    [
        (("order",), "at least two parts"),
        (("order", "", "receipt"), "part 2 is empty"),
        (("order", "4:2", "receipt"), "contains ':'"),
        (("order", 42, "re\nceipt"), "control character"),
        (("order", 4.2, "receipt"), "str, int or UUID"),
        (("order", True, "receipt"), "str, int or UUID"),
        (("order", None, "receipt"), "str, int or UUID"),
        (("order", "x" * 300, "receipt"), "the limit is 255"),
    ],
)
def test_key_rejects_bad_parts_naming_the_key_field(parts: tuple[Any, ...], problem: str) -> None:
    """Too few, empty, colon-bearing, control-character, non-id or overlong parts raise
    InvalidMessage with field "key"."""
    with pytest.raises(InvalidMessage) as error:
        key(*parts)
    assert error.value.field == "key"
    assert problem in str(error.value)


def test_agent_key_is_run_step_and_a_short_hash_of_the_important_arguments() -> None:
    """agent_key is "run:step:" plus the first 16 hex chars of sha256 over the canonical
    JSON of the important arguments."""
    args = {"to": "+12015550123", "body": "Your order shipped", "amount": 12}
    digest = hashlib.sha256(b'{"amount":12,"to":"+12015550123"}').hexdigest()[:16]
    assert agent_key("run_7f3a", 4, args, important=["to", "amount"]) == f"run_7f3a:4:{digest}"
    everything = hashlib.sha256(
        b'{"amount":12,"body":"Your order shipped","to":"+12015550123"}'
    ).hexdigest()[:16]
    assert agent_key("run_7f3a", 4, args) == f"run_7f3a:4:{everything}"


def test_agent_key_is_stable_for_a_resumed_run_and_ignores_rephrasing() -> None:
    """The same run, step and important arguments give the same key whatever the argument
    order or the wording of unimportant ones; another recipient, step or run does not."""
    first = agent_key("run-1", "step-2", {"to": "a@example.com", "subject": "Hi"}, important=["to"])
    again = agent_key(
        "run-1", "step-2", {"subject": "Hello there", "to": "a@example.com"}, important=["to"]
    )
    assert first == again
    assert first != agent_key("run-1", "step-2", {"to": "b@example.com"}, important=["to"])
    assert first != agent_key("run-1", "step-3", {"to": "a@example.com"}, important=["to"])
    assert first != agent_key("run-2", "step-2", {"to": "a@example.com"}, important=["to"])
    # The names are hashed with the values: the same value under another name differs.
    assert agent_key("r", "s", {"to": "x"}) != agent_key("r", "s", {"cc": "x"})


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: agent_key("run:1", "s", {}), "key"),
        (lambda: agent_key("", "s", {}), "key"),
        (lambda: agent_key("r", None, {}), "key"),  # type: ignore[arg-type]
        (lambda: agent_key("r", "s", {"to": "x"}, important=["amount"]), "important"),
        (lambda: agent_key("r", "s", {"to": "x"}, important="to"), "important"),
        (lambda: agent_key("r", "s", {"when": object()}), "args"),
        (lambda: agent_key("r", "s", {1: "x"}), "args"),  # type: ignore[dict-item]
        (lambda: agent_key("r", "s", ["to"]), "args"),  # type: ignore[arg-type]
        (lambda: agent_key("r" * 250, "s", {}), "key"),
    ],
)
def test_agent_key_rejects_bad_input_naming_the_field(call: Any, field: str) -> None:
    """Bad ids, unknown important names and non-JSON arguments raise InvalidMessage naming
    the offending field."""
    with pytest.raises(InvalidMessage) as error:
        call()
    assert error.value.field == field
