"""The keys of a route in ``delivery.toml`` (``[channels.NAME]``, ``[types.NAME]``): the
ordered ``providers`` a message may go through (``provider``: one), and ``failover_after``,
how long after its enqueue it may move to the next (``delivery.guards.failover``)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import PlainValidator, WithJsonSchema

from delivery.config.problems import Invalid

__all__ = ["FailoverAfter", "ordered"]


def _failover_after(value: object) -> float | str:
    if value == "never":
        return "never"
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1e9:
        return float(value)
    raise ValueError('must be a number of seconds > 0, or "never"')


#: ``failover_after``: seconds from enqueue, or ``"never"``.
FailoverAfter = Annotated[
    float | Literal["never"],
    PlainValidator(_failover_after),
    WithJsonSchema({"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"const": "never"}]}),
]


def ordered(provider: str | None, providers: list[str] | None) -> tuple[str, ...]:
    """A table's ordered providers from ``provider`` and/or ``providers`` (which must then
    start with it), each named once; () when it names none."""
    if providers is None:
        return () if provider is None else (provider,)
    if provider is not None and providers[0] != provider:
        raise Invalid("provider", f"{provider!r} must be the first of providers, or left out")
    twice = sorted({name for name in providers if providers.count(name) > 1})
    if twice:
        raise Invalid("providers", f"names {', '.join(twice)} more than once")
    return tuple(providers)
