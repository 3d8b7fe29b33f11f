"""The state machine, proven (issue 12, section 7): hypothesis drives every step of the
pipeline in any order against real PostgreSQL and checks the invariants after each.

Steps: ``enqueue`` (committed or rolled back), the same key enqueued again (same payload or
another, committed or rolled back), the relay's claim, a worker's attempt with any
class of provider answer (delivered, retryable, in progress, permanent, lost after taking
effect, unknown without effect, refused before acting, an error after acting) or a crash
(before or after the provider acted, during a lookup), a worker that stalls inside the
provider call and answers late, time passing (due times and leases fall due), the sweeper,
and the ops commands redrive / resolve / cancel. Messages have a route of two providers
(``stub``, then ``backup``) and fail over (docs/concepts.md, "Failover") whenever the rule
lets them: every retry wait here is longer than their ``failover_after``.

Invariants, after every step:

- at most one provider can have taken effect per key, whatever the policy (failover);
- at most one effect per key, across providers *without* dedupe, for messages whose policy is
  ``lookup`` or ``give_up`` (``retry`` relies on the provider's dedupe by design);
- every committed message is in the outbox (rolled back ones are not), and is final or
  scheduled: ``pending`` with a due time, ``dispatched``/``sending`` with a lease;
- the attempt count (the fence) never goes back and never passes ``max_attempts``;
- no row is ``sending`` without a lease; final rows hold none;
- one message per key, and the keys table names it: the outbox is partitioned by day, and
  its today is cut into partitions of four ids (``fence_kit.split_today``), so a key's second
  enqueue runs in another partition than its first (issue 29).

Only the provider is a stand-in (an in-memory stub of its protocol); the relay, sender,
settle, sweeper and ops functions are the real ones, on a database of their own.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

import delivery
from delivery.config.settings import Backoff
from delivery.core import outcomes
from delivery.core.models import messages_table
from delivery.core.status import FINAL, Status
from delivery.errors import IdempotencyConflict, MessageNotFound
from delivery.ops.repair import cancel, redrive, resolve
from delivery.outbox import enqueue as outbox
from delivery.providers.base import Envelope
from delivery.relay.claims import Claim, relay_once
from delivery.relay.sweeper import sweep
from delivery.sending.sender import deliver
from delivery.transitions import IN_PROGRESS
from tests.fence_kit import fence_engine, service_on, two_providers, wipe

__all__ = ["fence_engine"]  # the fixture, used by name

pytestmark = pytest.mark.integration

SENDS = (
    "delivered",
    "retryable",
    "in_progress",
    "permanent",
    "lost",  # took effect, the answer was lost: unknown
    "unknown_nothing",  # written, no effect, no answer: unknown
    "refused",  # refused before acting (a 429, a 503, a refused connection): created nothing
    "error_after",  # took effect, then answered a 500: retryable, but it may have acted
    "crash_before",  # the worker dies after committing `sending`, before the request
    "crash_after",  # the worker dies after the provider acted
)
LOOKUPS = ("truthful", "failed", "crash")
POLICIES = ("lookup", "give_up", "retry")
#: How ``enqueue`` picks its key: new, mostly; or one enqueued before, with its payload or not.
AGAIN = ("new",) * 6 + ("same", "other")


class Crash(BaseException):
    """The worker process dies here: nothing after this line of the attempt runs."""


@dataclass
class Plan:
    """How the provider answers one worker's calls; ``gate`` stalls it (after any effect)."""

    send: str
    lookup: str
    gate: threading.Event | None = None
    reached: threading.Event = field(default_factory=threading.Event)  # it is at the gate

    def hold(self) -> None:
        if self.gate is not None:
            self.reached.set()
            self.gate.wait(30)


#: The plan of the worker running on this thread, whichever provider it calls.
_plans = threading.local()


@dataclass
class Provider:
    """An in-memory provider without dedupe: every accepted send is a new effect."""

    name: str = "stub"
    supports_lookup: bool = True
    in_progress_wait: float | None = None
    effects: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, envelope: Envelope) -> outcomes.Outcome:
        plan: Plan = _plans.plan
        if plan.send == "crash_before":
            raise Crash
        if plan.send in ("delivered", "lost", "crash_after", "error_after"):
            with self.lock:
                self.effects[envelope.key] += 1
                n = self.effects[envelope.key]
        plan.hold()
        match plan.send:
            case "delivered":
                return outcomes.Delivered(f"ref-{envelope.key}-{n}", 201)
            case "retryable":
                return outcomes.Retryable("HTTP_502", "bad gateway", 502)
            case "refused":
                return outcomes.Retryable("HTTP_503", "unavailable", 503, created_nothing=True)
            case "error_after":
                return outcomes.Retryable("HTTP_500", "failed while acting", 500)
            case "in_progress":
                return outcomes.Retryable(IN_PROGRESS, "our earlier send is running", 409)
            case "permanent":
                return outcomes.Permanent("21211", "invalid number", 400)
            case "lost" | "unknown_nothing":
                return outcomes.Unknown("NETWORK_ReadTimeout", "request sent, no answer")
        raise Crash  # crash_after

    def lookup(self, envelope: Envelope) -> outcomes.LookupOutcome:
        plan: Plan = _plans.plan
        if plan.lookup == "crash":
            raise Crash
        with self.lock:
            seen = self.effects[envelope.key]
        plan.hold()  # the answer is what was true when asked, returned late
        if plan.lookup == "failed":
            return outcomes.LookupFailed("HTTP_503", "lookup unavailable", 503)
        return outcomes.Found(f"ref-{envelope.key}") if seen else outcomes.Absent()

    def close(self) -> None:
        pass


class OutboxMachine(RuleBasedStateMachine):
    engine: Engine  # set by the test before the machine runs
    #: Messages seen on the backup provider, per run: the runs reach failover.
    failed_over: Counter[int] = Counter()
    runs = 0

    def __init__(self) -> None:
        super().__init__()
        wipe(self.engine)
        self.provider, self.backup = Provider(), Provider("backup")
        # Waits are long (a seeded backoff of up to 3000 s) and due only when ``time_passes``:
        # no step depends on how fast the previous one ran, so hypothesis can replay a run.
        # Every retry wait passes failover_after (1 s): a message fails over when it may.
        slow = Backoff(base=1000.0, cap=3000.0)
        self.service = service_on(self.engine, self.provider, send_lease=60, backoff=slow)  # type: ignore[arg-type]
        self.service = two_providers(self.service, self.backup)
        self.service.rng = random.Random(0)
        delivery.configure(self.service.settings)  # the operators' redrive follows the route
        self.tasks: list[Claim] = []  # every task ever published: duplicates are possible
        self.committed: dict[str, str] = {}  # key -> policy
        self.policies: dict[str, str] = {}  # every key enqueued -> its policy
        self.bodies: dict[str, str] = {}  # every key enqueued -> its (committed) payload's body
        self.others = 0  # payloads no key had before
        self.fence: dict[str, int] = {}  # key -> highest attempt count seen
        self.stalled: list[tuple[threading.Thread, threading.Event]] = []
        self.n = 0
        OutboxMachine.runs += 1
        self.run = OutboxMachine.runs

    keys = Bundle("keys")

    # -- the steps -------------------------------------------------------------------------

    @initialize(target=keys)
    def first(self) -> str:
        return self._enqueue("lookup", commit=True)

    @rule(
        target=keys,
        policy=st.sampled_from(POLICIES),
        commit=st.booleans(),
        again=st.sampled_from(AGAIN),
        pick=st.integers(0, 2**16),
    )
    def enqueue(self, policy: str, commit: bool, again: str, pick: int) -> str:
        """A new key, mostly; else a key enqueued before (``again``: with the payload it has,
        or another): its message, ``IdempotencyConflict`` (another payload, the first
        committed), or a new message (the first rolled back). One rule, so that the other
        steps keep their share of a run (failover needs them)."""
        if again == "new":
            return self._enqueue(policy, commit)
        key = sorted(self.policies)[pick % len(self.policies)]
        self.others += 1
        body = self.bodies[key] if again == "same" else f"another body {self.others}"
        existed = key in self.committed
        try:
            self._add(key, body, self.policies[key], commit)
        except IdempotencyConflict:
            assert existed and again == "other"
        else:
            assert again == "same" or not existed
        return key

    def _enqueue(self, policy: str, commit: bool) -> str:
        self.n += 1
        key = f"sm-{self.n}"
        self._add(key, f"code {self.n}", policy, commit)
        return key

    def _add(self, key: str, body: str, policy: str, commit: bool) -> None:
        self.policies.setdefault(key, policy)
        self.bodies.setdefault(key, body)
        with Session(self.engine) as session:
            message = delivery.enqueue(
                session,
                channel="sms",
                to="+12015550123",
                payload={"body": body},
                key=key,
                on_unknown=policy,
                max_attempts=3,
            )
            assert message.key == key
            if commit:
                session.commit()
                self.committed[key], self.bodies[key] = policy, body
            else:
                session.rollback()

    @rule()
    def relay(self) -> None:
        relay_once(self.engine, self.tasks.extend, batch=50, lease=30)

    def _task(self, data: st.DataObject) -> Claim:
        """A task for a row that is ``dispatched`` now, mostly; any task ever published (a
        duplicate, a stale one) otherwise."""
        with self.engine.connect() as conn:
            live = set(
                conn.scalars(
                    select(messages_table.c.id).where(messages_table.c.status == "dispatched")
                )
            )
        fresh = [task for task in self.tasks if task.id in live]
        # Two draws of a fixed shape whatever the state, so that hypothesis can replay them.
        stale, pick = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 2**16))
        pool = fresh if fresh and stale else self.tasks
        return pool[pick % len(pool)]

    @precondition(lambda self: bool(self.tasks))
    @rule(data=st.data(), send=st.sampled_from(SENDS), lookup=st.sampled_from(LOOKUPS))
    def work(self, data: st.DataObject, send: str, lookup: str) -> None:
        self._attempt(self._task(data), Plan(send, lookup))

    @precondition(lambda self: bool(self.tasks))
    @rule(data=st.data(), lookup=st.sampled_from(LOOKUPS))
    def outage(self, data: st.DataObject, lookup: str) -> None:
        """A worker's attempt while its provider refuses every request before acting on it
        (down, rate limited): the answer that lets a message fail over, when nothing else
        pinned it."""
        self._attempt(self._task(data), Plan("refused", lookup))

    @precondition(lambda self: bool(self.tasks) and len(self.stalled) < 2)
    @rule(data=st.data(), send=st.sampled_from(SENDS[:6]), lookup=st.sampled_from(LOOKUPS[:2]))
    def stall(self, data: st.DataObject, send: str, lookup: str) -> None:
        """A worker hangs inside the provider call (after any effect); it answers later."""
        task = self._task(data)
        plan = Plan(send, lookup, threading.Event())
        thread = threading.Thread(target=self._attempt, args=(task, plan))
        thread.start()
        # The next step runs once this worker is inside the provider call (or is done).
        while thread.is_alive() and not plan.reached.wait(0.01):
            pass
        assert plan.gate is not None
        self.stalled.append((thread, plan.gate))

    @precondition(lambda self: bool(self.stalled))
    @rule(data=st.data())
    def answer_late(self, data: st.DataObject) -> None:
        thread, gate = self.stalled.pop(data.draw(st.integers(0, 1)) % len(self.stalled))
        gate.set()
        thread.join(30)
        assert not thread.is_alive()

    def _attempt(self, task: Claim, plan: Plan) -> None:
        _plans.plan = plan
        with contextlib.suppress(Crash):  # the worker died mid-attempt: the sweeper's turn
            deliver(self.service, task.id, task.key)

    @rule(seconds=st.sampled_from([1, 31, 61, 3600]))
    def time_passes(self, seconds: int) -> None:
        """Move every due time and lease ``seconds`` into the past (the clock advances)."""
        with self.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE delivery_messages SET "
                    "next_attempt_at = next_attempt_at - make_interval(secs => :s), "
                    "lease_expires_at = lease_expires_at - make_interval(secs => :s)"
                ),
                {"s": seconds},
            )

    @rule()
    def sweeper(self) -> None:
        sweep(self.engine)

    @rule()
    def beat_after_a_minute(self) -> None:
        """A minute passes (past every short wait and the send lease), then beat's sweeper
        and relay tick."""
        self.time_passes(61)
        self.sweeper()
        self.relay()

    @rule(key=keys)
    def ops_redrive(self, key: str) -> None:
        self._ops(lambda s: redrive(s, [key]))

    @rule(key=keys)
    def ops_resolve(self, key: str) -> None:
        """An operator checks with the provider first, then resolves truthfully."""
        to = Status.SENT if self.provider.effects[key] or self.backup.effects[key] else Status.DEAD
        self._ops(lambda s: resolve(s, key, to))

    @rule(key=keys)
    def ops_cancel(self, key: str) -> None:
        self._ops(lambda s: cancel(s, key))

    def _ops(self, action: Any) -> None:
        with Session(self.engine) as session:
            try:
                action(session)
            except MessageNotFound:
                return  # a rolled-back key
            session.commit()

    def teardown(self) -> None:
        for thread, gate in self.stalled:
            gate.set()
            thread.join(30)
        self.service.close()
        delivery.configure(None)

    # -- the invariants ----------------------------------------------------------------------

    def _effects(self) -> tuple[Counter[str], Counter[str]]:
        with self.provider.lock, self.backup.lock:
            return Counter(self.provider.effects), Counter(self.backup.effects)

    @invariant()
    def one_provider_per_key(self) -> None:
        primary, backup = self._effects()
        both = {k: (primary[k], backup[k]) for k in primary if backup[k]}
        assert not both, f"effects at both providers: {both}"

    @invariant()
    def one_effect_per_key_without_dedupe(self) -> None:
        primary, backup = self._effects()
        twice = {
            k: n
            for k, n in (primary + backup).items()
            if n > 1 and self.committed.get(k) in ("lookup", "give_up")
        }
        assert not twice, f"duplicate effects: {twice}"

    @invariant()
    def one_message_per_key_named_by_the_keys_table(self) -> None:
        with self.engine.connect() as conn:
            unnamed = conn.scalar(
                text(
                    "SELECT count(*) FROM delivery_messages m WHERE NOT EXISTS (SELECT 1 "
                    "FROM delivery_keys k WHERE k.key = m.key AND k.message_id = m.id)"
                )
            )
            twice = conn.scalar(
                text(
                    "SELECT count(*) FROM (SELECT key FROM delivery_messages "
                    "GROUP BY key HAVING count(*) > 1) AS t"
                )
            )
        assert (unnamed, twice) == (0, 0)

    @invariant()
    def committed_messages_are_final_or_scheduled(self) -> None:
        with self.engine.connect() as conn:
            rows = conn.execute(select(messages_table)).all()
        assert {r.key for r in rows} == set(self.committed)
        for r in rows:
            status = Status(r.status)
            where = f"{r.key} {status} attempts={r.attempts}/{r.max_attempts}"
            if status in FINAL:
                assert r.lease_expires_at is None, where
            elif status is Status.PENDING:
                assert r.next_attempt_at is not None, where
            else:  # dispatched, sending: a lease bounds how long they wait for a worker
                assert r.lease_expires_at is not None, where
            assert r.attempts >= self.fence.get(r.key, 0), f"fence went back: {where}"
            if r.provider == "backup":
                OutboxMachine.failed_over[self.run] += 1
            assert r.attempts <= r.max_attempts, where
            self.fence[r.key] = r.attempts


@pytest.mark.timeout(600)
def test_outbox_state_machine(fence_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any interleaving of enqueue, relay, worker attempts (every answer class, crashes,
    late answers), time, sweeper and ops commands keeps the outbox's invariants."""
    monkeypatch.setattr(outbox, "_nudge", None)  # the relay step publishes, nothing else
    OutboxMachine.engine = fence_engine
    run = OutboxMachine.TestCase
    run.settings = settings(
        # Bounded for CI (well under 2 minutes); DELIVERY_SM_EXAMPLES=500 explores deeper.
        max_examples=int(os.environ.get("DELIVERY_SM_EXAMPLES", "40")),
        stateful_step_count=40,
        # A failing run is reported with all its steps; DELIVERY_SM_SHRINK=1 shrinks it first
        # (which replays it hundreds of times: minutes).
        phases=[p for p in Phase if p is not Phase.shrink or os.environ.get("DELIVERY_SM_SHRINK")],
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        # The same runs every time (CI stays deterministic: random runs failed over in 1 to 16
        # of 40, so the check below failed about one time in five); DELIVERY_SM_EXAMPLES and
        # DELIVERY_SM_RANDOM=1 explore further.
        derandomize=not os.environ.get("DELIVERY_SM_RANDOM"),
        database=None,
    )
    OutboxMachine.failed_over, OutboxMachine.runs = Counter(), 0
    run().runTest()
    # 9 of the 41 derandomized runs fail over: 3 is far below
    assert len(OutboxMachine.failed_over) >= 3, "the runs never (or hardly) failed over"


class _Draw:
    """Stands in for ``st.data()`` in a scripted run: answers the given integers in order."""

    def __init__(self, *values: int) -> None:
        self.values = list(values)

    def draw(self, strategy: object) -> int:
        return self.values.pop(0)


def test_scripted_lookup_outliving_its_lease(
    fence_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine's own steps in one known order (a lookup that answers "absent" after its
    lease passed and another worker sent) keep the one-effect invariant."""
    monkeypatch.setattr(outbox, "_nudge", None)
    OutboxMachine.engine = fence_engine
    m = OutboxMachine()
    try:
        m.first()  # a message with policy lookup
        m.relay()
        m.work(_Draw(1, 0), "unknown_nothing", "truthful")  # type: ignore[arg-type]
        m.time_passes(3600)  # its retry is due: a lookup comes first
        m.stall(_Draw(1, 0), "delivered", "truthful")  # type: ignore[arg-type]
        m.beat_after_a_minute()  # the stalled worker's lease passes: recovered, published
        m.work(_Draw(1, 0), "delivered", "truthful")  # another worker: absent, sends
        m.one_effect_per_key_without_dedupe()
        m.answer_late(_Draw(0))  # the stalled lookup answers "absent" now
        m.one_effect_per_key_without_dedupe()
        m.committed_messages_are_final_or_scheduled()
    finally:
        m.teardown()


def _provider_of(engine: Engine, key: str) -> tuple[str, bool]:
    with engine.connect() as conn:
        row = conn.execute(
            select(messages_table.c.provider, messages_table.c.pinned).where(
                messages_table.c.key == key
            )
        ).one()
    return row.provider, row.pinned


@pytest.mark.parametrize("first", ["lost", "error_after", "in_progress", "crash_after"])
def test_scripted_an_attempt_that_may_have_acted_pins_its_provider(
    fence_engine: Engine, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """The machine's steps in known orders: an attempt that may have taken effect at ``stub``
    (an answer lost, a 500 after acting, our earlier attempt in progress, a worker killed
    after the call) pins the message there; the outage that follows (refused, nothing
    created) waits for ``stub`` instead of failing over, and it ends sent there only."""
    monkeypatch.setattr(outbox, "_nudge", None)
    OutboxMachine.engine = fence_engine
    m = OutboxMachine()
    try:
        key = m._enqueue("retry", commit=True)  # no lookup: only "pinned" stops a failover
        m.relay()
        m.work(_Draw(1, 0), first, "truthful")  # type: ignore[arg-type]
        m.beat_after_a_minute()  # a crashed worker's send is recovered; a retry comes due
        m.time_passes(3600)
        m.relay()
        m.outage(_Draw(1, 0), "truthful")  # type: ignore[arg-type]
        assert _provider_of(fence_engine, key) == ("stub", True)
        m.time_passes(3600)
        m.relay()
        m.work(_Draw(1, 0), "delivered", "truthful")  # type: ignore[arg-type]
        m.one_provider_per_key()
        m.committed_messages_are_final_or_scheduled()
        assert m.provider.effects[key] >= 1 and not m.backup.effects[key]
    finally:
        m.teardown()


def test_scripted_a_lookup_that_finds_nothing_lets_it_fail_over(
    fence_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown attempt pins the message to ``stub``; a lookup there that answers
    "absent" unpins it, so the refused send that follows fails over to ``backup``, where it
    is delivered: one effect, at one provider."""
    monkeypatch.setattr(outbox, "_nudge", None)
    OutboxMachine.engine = fence_engine
    m = OutboxMachine()
    try:
        key = m.first()  # policy lookup
        m.relay()
        m.work(_Draw(1, 0), "unknown_nothing", "truthful")  # type: ignore[arg-type]
        assert _provider_of(fence_engine, key) == ("stub", True)
        m.time_passes(3600)
        m.relay()
        m.outage(_Draw(1, 0), "truthful")  # absent, then refused
        assert _provider_of(fence_engine, key) == ("backup", False)
        m.relay()
        m.work(_Draw(1, 0), "delivered", "truthful")  # type: ignore[arg-type]
        m.one_provider_per_key()
        assert (m.provider.effects[key], m.backup.effects[key]) == (0, 1)
    finally:
        m.teardown()
