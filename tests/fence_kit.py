"""What the fence and state-machine tests share: a PostgreSQL database of their own (the live
pipeline of other tests never sees its rows), a ``Service`` on it, and ``ProviderStub``, an
in-memory provider *without* dedupe that implements the adapter protocol and counts effects.

``ProviderStub`` stands in for the provider only; every part of ``delivery`` runs for real.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, insert, text

from delivery.core import outcomes
from delivery.core.models import messages_table, utcnow
from delivery.providers.base import Envelope
from delivery.runtime.db import make_sessionmaker
from delivery.runtime.service import Service
from tests.conftest import PG_DB, PG_SERVER, need
from tests.factories import empty_outbox, message_values

FENCE_DB = f"{PG_DB}_fences"


@pytest.fixture(scope="session")
def fence_engine() -> Iterator[Engine]:
    """A migrated database of its own, created from scratch for this session."""
    try:
        admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {FENCE_DB} WITH (FORCE)"))
            conn.execute(text(f"CREATE DATABASE {FENCE_DB}"))
    except Exception as exc:
        need("PostgreSQL", exc)
    from delivery.runtime.db import make_engine, upgrade

    engine = make_engine(f"{PG_SERVER}/{FENCE_DB}")
    upgrade(engine, partition=False)
    split_today(engine)
    yield engine
    engine.dispose()
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {FENCE_DB} WITH (FORCE)"))
    admin.dispose()


@pytest.fixture
def fence_db(fence_engine: Engine) -> Engine:
    """That database, emptied."""
    wipe(fence_engine)
    return fence_engine


def wipe(engine: Engine) -> None:
    """Empty the outbox; ids start again at the first of today's small partitions."""
    with engine.begin() as conn:
        empty_outbox(conn, restart=True)


def split_today(engine: Engine, size: int = 4, count: int = 12) -> None:
    """Partition the outbox by day from today (``delivery.runtime.partitions``), with today's
    first ``size * count`` ids cut into partitions of ``size``: a run's messages, attempts and
    receipts land in many partitions, as over many days."""
    from delivery.runtime import conversion, partitions

    today = dt.datetime.now(dt.UTC).date()
    conversion.partition(engine, start=today)
    base = partitions.day_of(today) << 32
    cuts = [base + size * i for i in range(count + 1)] + [base + (1 << 32)]
    with engine.begin() as conn:
        for table, _ in partitions.TABLES:
            conn.execute(text(f"DROP TABLE {table}_p{today:%Y%m%d}"))
            for i, (low, high) in enumerate(itertools.pairwise(cuts)):
                conn.execute(
                    text(
                        f"CREATE TABLE {table}_today{i} PARTITION OF {table} "
                        f"FOR VALUES FROM ({low}) TO ({high})"
                    )
                )


Hook = Callable[[Envelope], None]


@dataclass
class ProviderStub:
    """A provider that keeps no idempotency keys: every send that takes effect is counted.

    ``answers`` scripts the next sends (an ``Outcome``; ``"drop"`` takes effect and answers
    ``Unknown``, the answer lost; default: ``Delivered``). ``lookups`` answer from the effects
    seen, unless ``supports_lookup`` is false (``NO_LOOKUP``, as pigeon and webhooks do).
    ``on_send`` / ``on_lookup`` run inside the call, to interleave other steps."""

    name: str = "stub"
    supports_lookup: bool = True
    in_progress_wait: float | None = None
    effects: Counter[str] = field(default_factory=Counter)
    answers: list[Any] = field(default_factory=list)
    sends: list[str] = field(default_factory=list)
    looked_up: list[str] = field(default_factory=list)
    on_send: Hook | None = None
    on_lookup: Hook | None = None

    def send(self, envelope: Envelope) -> outcomes.Outcome:
        self.sends.append(envelope.key)
        if self.on_send is not None:
            hook, self.on_send = self.on_send, None
            hook(envelope)
        answer = self.answers.pop(0) if self.answers else None
        if answer is None or answer == "drop":
            self.effects[envelope.key] += 1
            if answer == "drop":
                return outcomes.Unknown("NETWORK_ReadTimeout", "request sent, no answer")
            return outcomes.Delivered(f"ref-{envelope.key}-{self.effects[envelope.key]}", 201)
        assert isinstance(
            answer, outcomes.Delivered | outcomes.Retryable | outcomes.Permanent | outcomes.Unknown
        )
        if isinstance(answer, outcomes.Delivered):
            self.effects[envelope.key] += 1
        return answer

    def lookup(self, envelope: Envelope) -> outcomes.LookupOutcome:
        self.looked_up.append(envelope.key)
        if self.on_lookup is not None:
            hook, self.on_lookup = self.on_lookup, None
            hook(envelope)
        if not self.supports_lookup:
            return outcomes.LookupFailed("NO_LOOKUP", "this provider cannot be asked")
        if self.effects[envelope.key]:
            return outcomes.Found(f"ref-{envelope.key}")
        return outcomes.Absent()

    def close(self) -> None:
        pass


def service_on(engine: Engine, provider: ProviderStub, **settings: Any) -> Service:
    """A real ``Service`` on ``engine`` whose provider ``stub`` is ``provider`` (in-process
    breaker that never opens, unless ``settings`` say otherwise)."""
    import delivery

    base = delivery.get_settings()
    stub = base.providers["stub"]
    quiet = stub.breaker.__class__(**{**_fields(stub.breaker), "failure_threshold": 10**6})
    providers = {**base.providers, "stub": stub.__class__(**{**_fields(stub), "breaker": quiet})}
    values: dict[str, Any] = {"redis_url": None, "providers": providers, **settings}
    service = Service(base.with_(**values), engine, make_sessionmaker(engine))
    service._providers[provider.name] = provider  # the provider stub, nothing of ours
    return service


def two_providers(service: Service, backup: Any, failover_after: float = 1.0) -> Service:
    """``service`` (``service_on``'s) with a second provider, ``backup`` (its breaker as
    quiet as ``stub``'s), after ``stub`` on the ``sms`` channel's route: its messages fail
    over once a wait on ``stub`` would end ``failover_after`` s after their enqueue."""
    settings = service.settings
    stub = settings.providers["stub"]
    sms = replace(settings.channels["sms"], providers=("stub", "backup"))
    sms = replace(sms, failover_after=failover_after)
    changed = settings.with_(
        providers={**settings.providers, "backup": replace(stub, name="backup")},
        channels={**settings.channels, "sms": sms},
    )
    two = Service(changed, service.engine, service.sessions)
    two._providers.update(service._providers)
    two._providers["backup"] = backup
    service.close()
    return two


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


def add_row(engine: Engine, key: str, status: str = "pending", **fields: Any) -> int:
    """Insert one message row as ``enqueue`` would have left it (plus ``fields``)."""
    now = utcnow() - dt.timedelta(seconds=1)
    values = message_values(key, status, next_attempt_at=now, created_at=now, updated_at=now)
    values.update(fields)
    with engine.begin() as conn:
        inserted = conn.execute(insert(messages_table).returning(messages_table.c.id), values)
        return int(inserted.scalar_one())
