"""Provider failover end to end (issue 27): a worker, beat and two stub providers as real
processes. The sms channel sends through ``primary`` and fails over to ``backup``. The primary
accepts and then loses 30% of its answers (the message took effect there; the worker never
hears), and then goes down for 20 s mid-run (the stub's ``down``: every POST and every lookup
answered 503, also for a key it already holds); the backup is healthy. 500 OTPs with
``failover_after = 5`` are committed at a steady rate across the outage, and:

- every one ends ``sent``, and no key took effect at both providers (each at exactly one: the
  one its message records);
- every attempt row names its provider, no route goes back to the primary, and a message
  reached the backup only when none of its attempts at the primary could have taken effect
  (each created nothing: a 503 or 429, a connect error; or a lookup there said absent since);
- the share of the messages committed during the outage that were sent through the backup is
  reported (printed, and kept as a test property) and is above 0, and the failovers the
  worker counted (``delivery_failovers_total``) are the messages that moved.

One run through one outage carries two kinds side by side, 500 each: OTPs under the channel's
``lookup`` policy (a lost answer is looked up at the primary), and OTPs under ``retry`` (no
lookup: a message with an unknown attempt at the primary is pinned there and must never reach
the backup). Each test checks its kind; both check that messages pinned at the primary were
still waiting when it went down, or the outage would prove nothing about them.

The rig has its own database and broker (this slot's shared-state Redis db), as
``test_receipts_e2e`` does, so that no other worker of the suite takes its messages.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import httpx
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import delivery
from delivery.config.loading import load_settings
from delivery.config.settings import Settings
from delivery.guards.breaker import Breakers
from delivery.outbox import enqueue as outbox
from delivery.testing.processes import ServiceProcess, beat, start_all, stop_all, stub_provider
from delivery.testing.processes import worker as worker_process
from delivery.testing.stub_provider import StubClient
from tests.conftest import drained, free_port, own_outbox
from tests.factories import empty_outbox

pytestmark = pytest.mark.integration

MESSAGES = 500
HEALTHY = 4.0  # seconds of the run before the primary goes down
OUTAGE = 20.0
AFTER = 1.0  # seconds of the run after it comes back (the commits go on until then)
FAILOVER_AFTER = 5
PROVIDERS = ("primary", "backup")
REASONS = {"circuit_open", "rate_limited", "unavailable"}
#: What a send attempt at the primary may have ended with and still have created nothing
#: there (docs/concepts.md, "Failover"): the request never left, or a 503 / 429.
NOT_SENT_CODES = {"NETWORK_ConnectError", "NETWORK_ConnectTimeout", "NETWORK_PoolTimeout"}
NOT_SENT_STATUS = {429, 503}

TOML = """
[delivery]
relay_interval = 0.2
sweep_interval = 0.5

[providers.primary]
kind = "http"
base_url = "http://127.0.0.1:{primary}"

[providers.primary.breaker]
reset_timeout = 2       # probes every 2 s while it is down: back within seconds once it is up

[providers.backup]
kind = "http"
base_url = "http://127.0.0.1:{backup}"

[channels.sms]
providers = ["primary", "backup"]
on_unknown = "lookup"

# A retry waits up to 4 s, so that messages whose answer was lost just before the outage are
# still pinned to the primary when it goes down; 30 attempts outlast the outage at that pace
# (a wait behind the open breaker spends none). Where a message ends is under test here, not
# its budget.
[types.otp]
channel = "sms"
failover_after = {after}
max_attempts = 30
backoff = {{ base = 2, cap = 4 }}

[types.otp_retry]
channel = "sms"
on_unknown = "retry"
failover_after = {after}
max_attempts = 30
backoff = {{ base = 2, cap = 4 }}
"""


@dataclass
class Rig:
    engine: Engine
    settings: Settings
    primary: StubClient
    backup: StubClient
    metrics: list[str]  # the worker's and beat's /metrics
    procs: list[ServiceProcess]

    def stub(self, name: str) -> StubClient:
        return self.primary if name == "primary" else self.backup


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory, redis_client: Any) -> Iterator[Rig]:
    run = tmp_path_factory.mktemp("failover")
    primary, backup, worker_metrics, beat_metrics = (free_port() for _ in range(4))
    config = run / "failover.toml"
    config.write_text(TOML.format(primary=primary, backup=backup, after=FAILOVER_AFTER))
    redis_client.flushdb()
    procs: list[ServiceProcess] = []
    with own_outbox("failover", run, config) as (engine, env):
        env["DELIVERY_METRICS_PORT"] = str(worker_metrics)
        env["DELIVERY_BEAT_METRICS_PORT"] = str(beat_metrics)
        try:
            procs = start_all(
                [
                    stub_provider(run / "primary.log", primary),
                    stub_provider(run / "backup.log", backup),
                    worker_process(run / "worker.log", env=env, concurrency=4, name="failover"),
                    beat(run / "beat.log", run / "beat-schedule", env=env),
                ]
            )
            with (
                StubClient(f"http://127.0.0.1:{primary}") as first,
                StubClient(f"http://127.0.0.1:{backup}") as second,
            ):
                metrics = [
                    f"http://127.0.0.1:{port}/metrics" for port in (worker_metrics, beat_metrics)
                ]
                yield Rig(engine, load_settings(env), first, second, metrics, procs)
        finally:
            stop_all(procs[::-1])
            redis_client.flushdb()


class Attempt(NamedTuple):
    provider: str | None
    kind: str
    outcome: str
    http_status: int | None
    error_code: str | None

    def created_nothing(self) -> bool:
        """A send that proves it created nothing at its provider."""
        return (
            self.kind == "send"
            and self.outcome == "retryable"
            and (self.http_status in NOT_SENT_STATUS or self.error_code in NOT_SENT_CODES)
        )


@dataclass
class Route:
    """One message as it ended, and its attempts in order."""

    status: str
    provider: str
    created: float  # epoch seconds (the app's clock: this process's)
    sent: float | None  # epoch seconds (the database's clock, on this host)
    attempts: list[Attempt] = field(default_factory=list)

    def providers(self) -> list[str | None]:
        return [a.provider for a in self.attempts]

    def went_back(self) -> bool:
        """An attempt at the primary after one at the backup."""
        providers = self.providers()
        return "backup" in providers and "primary" in providers[providers.index("backup") :]

    def pinned_then_refused(self) -> bool:
        """An unknown attempt at the primary, then one there answered 503 (sent again, or
        looked up, while it was down): the message stayed pinned through a refusal."""
        primary = self.at("primary")
        unknown = [i for i, a in enumerate(primary) if a.outcome == "unknown"]
        return bool(unknown) and any(a.http_status == 503 for a in primary[unknown[0] :])

    def at(self, provider: str) -> list[Attempt]:
        return [a for a in self.attempts if a.provider == provider]

    def free_to_leave(self, provider: str) -> bool:
        """No attempt at ``provider`` may have taken effect: each send created nothing, or a
        lookup there answered absent after the last one that may have."""
        pinned = False
        for attempt in self.at(provider):
            if attempt.kind == "lookup" and attempt.outcome == "absent":
                pinned = False
            elif attempt.kind == "send" and not attempt.created_nothing():
                pinned = True
        return not pinned


#: The kinds that travel side by side through the one outage, by key prefix.
KINDS = {"fo-lookup": "otp", "fo-retry": "otp_retry"}


@dataclass
class Run:
    down_at: float  # epoch seconds, this process's clock
    up_at: float
    pinned_at_down: set[str]  # waiting at the primary with an unknown attempt when it went down
    failovers: Counter[tuple[str, str, str, str]]  # (channel, from, to, reason), this run's


def failover_counts(rig: Rig) -> Counter[tuple[str, str, str, str]]:
    """``delivery_failovers_total`` as the worker and beat count it, by its labels."""
    counted: Counter[tuple[str, str, str, str]] = Counter()
    for url in rig.metrics:
        for line in httpx.get(url, timeout=10).text.splitlines():
            if not line.startswith("delivery_failovers_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
            where = (labels["channel"], labels["from"], labels["to"], labels["reason"])
            counted[where] += round(float(line.rsplit(" ", 1)[1]))
    return counted


def fresh(rig: Rig) -> None:
    """An empty outbox, both stubs without faults, both breakers closed."""
    with rig.engine.begin() as conn:
        empty_outbox(conn)
    rig.primary.reset()
    rig.backup.reset()
    breakers = Breakers(rig.settings)
    try:
        for name in PROVIDERS:
            breakers.get(name).reset()
    finally:
        breakers.close()


def waiting_pinned(engine: Engine, prefix: str = "fo") -> set[str]:
    """Keys not yet sent that have an unknown attempt at the primary: pinned there."""
    with engine.connect() as conn:
        return set(
            conn.scalars(
                text(
                    "SELECT m.key FROM delivery_messages m WHERE m.key LIKE :p "
                    "AND m.status <> 'sent' AND EXISTS (SELECT 1 FROM delivery_attempts a "
                    "WHERE a.message_id = m.id AND a.provider = 'primary' "
                    "AND a.outcome = 'unknown')"
                ),
                {"p": f"{prefix}-%"},
            )
        )


def run_through_outage(rig: Rig) -> Run:
    """Commit MESSAGES messages of each of ``KINDS`` at a steady pace over HEALTHY + OUTAGE +
    AFTER seconds while the primary loses 30% of its answers, down for OUTAGE seconds from
    HEALTHY on (once a few messages of each kind wait pinned to it); wait until all are
    final."""
    fresh(rig)
    before = failover_counts(rig)
    rig.primary.set_faults(drop_rate=0.3, seed=27)
    interval = (HEALTHY + OUTAGE + AFTER) / MESSAGES
    start = time.monotonic()
    down: float | None = None  # monotonic
    down_at = up_at = 0.0
    pinned: set[str] = set()

    def outage_step() -> None:
        nonlocal down, down_at, up_at, pinned
        now = time.monotonic()
        if down is None and now - start >= HEALTHY:
            # Wait (up to 10 s more) for messages pinned at the primary to go down with it.
            each = [len(waiting_pinned(rig.engine, prefix)) for prefix in KINDS]
            if min(each) >= 3 or now - start >= HEALTHY + 10:
                rig.primary.set_faults(down=True)
                down, down_at = time.monotonic(), time.time()
                pinned = waiting_pinned(rig.engine)
        elif down is not None and not up_at and now - down >= OUTAGE:
            rig.primary.set_faults(down=False)
            up_at = time.time()

    for i in range(MESSAGES):
        pause = start + i * interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        outage_step()
        for prefix, kind in KINDS.items():
            with Session(rig.engine) as session, session.begin():
                delivery.enqueue(
                    session,
                    type=kind,
                    to=f"+1201555{i:04d}",
                    payload={"body": f"Your code is {i:06d}"},
                    key=f"{prefix}-{i}",
                    settings=rig.settings,
                )
    while not up_at:
        time.sleep(0.05)
        outage_step()
    total = MESSAGES * len(KINDS)
    counts = drained(rig.engine, total, timeout=180)
    assert counts == {"sent": total}, counts
    failovers = failover_counts(rig)
    failovers.subtract(before)
    return Run(down_at, up_at, pinned, +failovers)


@pytest.fixture(scope="module")
def outage(rig: Rig) -> Iterator[Run]:
    """The one run through the outage both tests check (each its kind's messages)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(outbox, "_nudge", None)  # it would publish to the suite's broker
        run = run_through_outage(rig)
    # Every move was counted, once, with its reason (the metric has no kind: both at once).
    moved = sum(len(effects(rig.backup, prefix)) for prefix in KINDS)
    reasons = {("sms", "primary", "backup", reason) for reason in REASONS}
    assert set(run.failovers) <= reasons, run.failovers
    assert sum(run.failovers.values()) == moved, (dict(run.failovers), moved)
    yield run


def routes(engine: Engine, prefix: str) -> dict[str, Route]:
    found: dict[str, Route] = {}
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT m.key, m.status, m.provider, m.created_at, m.sent_at, a.id, a.provider, "
                "a.kind, a.outcome, a.http_status, a.error_code FROM delivery_messages m "
                "LEFT JOIN delivery_attempts a ON a.message_id = m.id WHERE m.key LIKE :p "
                "ORDER BY m.id, a.id"
            ),
            {"p": f"{prefix}-%"},
        )
        for key, status, provider, created, sent, attempt, *rest in rows:
            route = found.get(key)
            if route is None:
                sent_at = None if sent is None else sent.timestamp()
                route = found[key] = Route(status, provider, created.timestamp(), sent_at)
            if attempt is not None:
                route.attempts.append(Attempt(*rest))
    return found


def effects(stub: StubClient, prefix: str) -> dict[str, int]:
    return {key: n for key, n in stub.effects().items() if key.startswith(f"{prefix}-")}


def check(rig: Rig, run: Run, prefix: str, record: Any) -> dict[str, Route]:
    """What both kinds must show (the module docstring); reports the figures. Returns the
    routes of ``prefix``'s messages for the test's own checks."""
    label = prefix.removeprefix("fo-")
    got = routes(rig.engine, prefix)
    keys = {f"{prefix}-{i}" for i in range(MESSAGES)}
    assert got.keys() == keys
    assert {r.status for r in got.values()} == {"sent"}
    at = {name: effects(rig.stub(name), prefix) for name in PROVIDERS}
    both = sorted(at["primary"].keys() & at["backup"].keys())
    assert both == [], f"{len(both)} keys took effect at both providers: {both[:20]}"
    assert at["primary"].keys() | at["backup"].keys() == keys
    assert set(at["primary"].values()) | set(at["backup"].values()) == {1}
    for name in PROVIDERS:  # each took effect where its message says it was sent
        assert at[name].keys() == {k for k, r in got.items() if r.provider == name}, name

    no_provider = sorted(k for k, r in got.items() if not set(r.providers()) <= set(PROVIDERS))
    assert no_provider == [], f"attempt rows without a known provider: {no_provider[:20]}"
    went_back = sorted(k for k, r in got.items() if r.went_back())
    assert went_back == [], f"routes that went back to the primary: {went_back[:20]}"
    moved = {k: r for k, r in got.items() if r.at("backup")}
    assert moved.keys() == at["backup"].keys()  # no attempt at the backup without its effect
    unsafe = {k: r.at("primary") for k, r in moved.items() if not r.free_to_leave("primary")}
    assert unsafe == {}, (
        f"moved after an attempt at the primary that may have taken effect: {unsafe}"
    )
    pinned = {k for k in run.pinned_at_down if k in keys}
    stayed = sorted(pinned - at["primary"].keys())
    assert stayed == [], f"pinned to the primary when it went down, not sent there: {stayed}"
    assert pinned, "no message was pinned to the primary when it went down"

    during = [r for r in got.values() if run.down_at <= r.created < run.up_at]
    share = sum(r.provider == "backup" for r in during) / max(len(during), 1)
    sent_during = [
        r for r in got.values() if r.sent is not None and run.down_at <= r.sent < run.up_at
    ]
    sent_share = sum(r.provider == "backup" for r in sent_during) / max(len(sent_during), 1)
    started_at_primary = sum(bool(r.at("primary")) for r in moved.values())
    figures = {
        "backup_share_committed_during_outage": round(share, 4),
        "committed_during_outage": len(during),
        "backup_share_sent_during_outage": round(sent_share, 4),
        "sent_during_outage": len(sent_during),
        "sent_primary": len(at["primary"]),
        "sent_backup": len(at["backup"]),
        "moved_after_attempts_at_primary": started_at_primary,
        "pinned_when_down": len(pinned),
        "pinned_then_answered_503": sum(r.pinned_then_refused() for r in got.values()),
        "unknown_at_primary": sum(
            any(a.outcome == "unknown" for a in r.at("primary")) for r in got.values()
        ),
        "failovers_both_kinds": {r: n for (_, _, _, r), n in sorted(run.failovers.items())},
        "outage_s": round(run.up_at - run.down_at, 1),
    }
    record(f"failover_{label}", figures)
    print(f"\nfailover e2e ({label}): {figures}")
    assert len(during) > 0 and share > 0, figures
    return got


def test_failover_with_lookup_never_sends_a_key_through_both_providers(
    rig: Rig, outage: Run, record_property: Any
) -> None:
    """The sms channel's ``lookup`` policy: a lost answer is looked up at the primary (where
    it took effect: found), also when the primary is down (the lookup fails, and the message
    waits for it). 500 OTPs across a 20 s outage: all sent, no key at both providers, moves
    only of messages that created nothing at the primary, some through the backup during
    the outage."""
    got = check(rig, outage, "fo-lookup", record_property)
    lost = [k for k, r in got.items() if any(a.outcome == "unknown" for a in r.at("primary"))]
    assert lost, "no answer was lost at the primary: the run proves nothing about them"
    found = [k for k in lost if any(a.kind == "lookup" for a in got[k].at("primary"))]
    assert found, "no lost answer was looked up at the primary"
    assert all(got[k].provider == "primary" for k in lost)


def test_failover_without_lookup_never_moves_a_message_with_an_unknown_attempt(
    rig: Rig, outage: Run, record_property: Any
) -> None:
    """``on_unknown = "retry"`` (no lookup): a message whose answer was lost at the primary is
    pinned there. It is sent again there with the same key, also through the outage (503s
    created nothing, but its first attempt may have), and is never sent through the backup."""
    got = check(rig, outage, "fo-retry", record_property)
    backup = effects(rig.backup, "fo-retry")
    lost = {k: r for k, r in got.items() if any(a.outcome == "unknown" for a in r.at("primary"))}
    assert lost, "no answer was lost at the primary: the run proves nothing about them"
    escaped = sorted(k for k, r in lost.items() if r.at("backup") or k in backup)
    assert escaped == [], f"unknown at the primary, then sent through the backup: {escaped}"
    assert all(r.provider == "primary" for r in lost.values())
    assert not any(a.kind == "lookup" for r in got.values() for a in r.attempts)
