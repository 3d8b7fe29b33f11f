"""What to do when the outcome of a send is unknown (docs/concepts.md, "Guarantees", G5).

- ``retry``: send again with the same key. Right when the provider dedupes on the key.
- ``lookup``: ask the provider whether the key exists first: sent if found, send again only if
  absent, look again later if the lookup itself fails. For providers that can be queried.
- ``give_up``: park the message as ``unknown`` for a person to review. Right when a duplicate
  is worse than a miss and nothing dedupes.

A ``sending`` row whose lease expired (its worker died mid-send) goes through the same policy.
"""

from __future__ import annotations

import enum

__all__ = ["UnknownPolicy"]


class UnknownPolicy(enum.StrEnum):
    RETRY = "retry"
    LOOKUP = "lookup"
    GIVE_UP = "give_up"
