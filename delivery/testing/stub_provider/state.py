"""What the stub remembers: faults, effects per key, stored answers, the request log."""

from __future__ import annotations

import copy
import random
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

from delivery.testing.stub_provider.answers import (
    DEFAULT_FAULTS,
    Rule,
    compile_rules,
    validate_faults,
)

__all__ = ["Logged", "State", "Stored"]


class Stored(NamedTuple):
    digest: bytes
    status: int
    body: bytes
    content_type: str


class Logged(NamedTuple):
    """One entry of ``GET /_stub/requests`` (never a payload or a secret)."""

    key: str
    to: object
    at: float
    status: int
    outcome: str  # effect, replay, error, dropped or rejected
    auth: str | None  # sha256 hex of the Authorization header


class State:
    """Everything the stub remembers; every access goes through ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seq = 0
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.faults: dict[str, Any] = copy.deepcopy(DEFAULT_FAULTS)
            self.rules: dict[str, Rule] = {}
            self.rng = random.Random(None)
            self.effects: dict[str, int] = {}
            self.stored: dict[str, Stored] = {}
            self.lookup: dict[str, bytes] = {}
            self.in_flight: set[str] = set()
            self.attempts: dict[str, int] = {}
            self.log: list[tuple[int, dict[str, Any]]] = []

    def set_faults(self, updates: Mapping[str, Any]) -> dict[str, Any]:
        clean = validate_faults(updates)
        rules = compile_rules("rules", clean["rules"]) if "rules" in clean else None
        with self.lock:
            self.faults.update(clean)
            if rules is not None:
                self.rules = rules
            if "seed" in clean:
                self.rng = random.Random(clean["seed"])
            return copy.deepcopy(self.faults)

    def get_faults(self) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.faults)

    def get_effects(self) -> dict[str, int]:
        with self.lock:
            return dict(self.effects)

    def get_requests(self) -> list[dict[str, Any]]:
        with self.lock:
            entries = list(self.log)
        entries.sort(key=lambda item: item[0])
        return [dict(entry) for _, entry in entries]

    def next_seq(self) -> int:
        with self.lock:
            self.seq += 1
            return self.seq

    def record(self, seq: int, request: Logged) -> None:
        """Log one request; ``seq`` orders the log by arrival, whenever it is answered."""
        with self.lock:
            self.log.append((seq, request._asdict()))
