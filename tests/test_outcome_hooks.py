"""Telling the app (issue 26): an outcome hook (``delivery.add_outcome_hook``) is called with an
``Outcome`` (id, key, type, status, code; never the recipient) when a message ends
``delivered``, ``undelivered``, ``suppressed`` or ``dead``, only once that change is committed
(inside the hook a connection of its own already reads the new status), never when it is
rolled back.

Each path to those statuses is driven on a PostgreSQL outbox of its own: a receipt recorded in
a transaction, the sweeper applying a waiting one, the receiver, a permanent answer settled, a
provider not configured, a suppressed recipient, and an operator's resolve (the CLI, and a
``Session`` as the console's). A walk of the source checks that every transaction that can
reach one of them opens ``tell_outcomes_after()`` around it, so that none is left unscoped.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, Row, create_engine, select, text
from sqlalchemy.orm import Session
from standardwebhooks.webhooks import Webhook

import delivery
from delivery import Outcome, add_outcome_hook, remove_outcome_hook
from delivery.cli import main
from delivery.config.loading import load_settings
from delivery.config.settings import Backoff
from delivery.core.clock import db_now
from delivery.core.models import messages_table
from delivery.core.outcomes import Delivered, Permanent
from delivery.core.policies import UnknownPolicy
from delivery.core.status import Status
from delivery.errors import ConfigError
from delivery.observability.events import (
    OUTCOME_STATUSES,
    Transition,
    emit,
    held_outcomes,
    tell_outcomes_after,
)
from delivery.ops import resolve
from delivery.outbox import enqueue as outbox
from delivery.receipts import Receiver
from delivery.receipts.standard import StandardReceipts
from delivery.relay.claims import claim
from delivery.relay.sweeper import sweep
from delivery.runtime.hooks import outcome_hooks, use_outcome_hooks
from delivery.runtime.service import Service
from delivery.sending import attempt
from delivery.sending.sender import ROW, deliver
from delivery.sending.settle import after_send
from delivery.transitions import Sending
from delivery.transitions.receipts import ReceiptEvent, record
from tests.conftest import PG_SERVER
from tests.factories import RECIPIENT, add
from tests.fence_kit import FENCE_DB, fence_db, fence_engine

__all__ = ["fence_db", "fence_engine"]  # fixtures, used by name

ROOT = Path(__file__).resolve().parents[1]
OUTBOX_URL = f"{PG_SERVER}/{FENCE_DB}"
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@dataclass
class Told:
    """What the hook was called with, and the status a connection of its own read then."""

    outcomes: list[Outcome] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)


@pytest.fixture
def clean(
    fence_db: Engine, stub: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Engine]:
    """An outbox of this module's own (``fence_kit``'s database), emptied, with closed
    breakers and a stub without faults. No worker or beat of the suite's runs on it: on the
    suite's outbox, once a pipeline test has started them, the relay claims a pending row and
    the sweeper recovers a ``sending`` one under a test. The environment's
    DELIVERY_DATABASE_URL names it (for the CLI and ``load_settings``) during the test, and
    the process's settings are read again afterwards."""
    monkeypatch.setenv("DELIVERY_DATABASE_URL", OUTBOX_URL)
    redis_client.flushdb()
    stub.reset()
    yield fence_db
    delivery.configure(None)


@pytest.fixture
def told(clean: Engine) -> Iterator[Told]:
    """A hook that records each outcome and reads its message's status on an engine of its
    own (never a connection of the transaction that made it)."""
    observer = create_engine(OUTBOX_URL)
    record_of = Told()

    def hook(outcome: Outcome) -> None:
        with observer.connect() as conn:
            query = text("SELECT status FROM delivery_messages WHERE id = :id")
            record_of.seen.append(conn.scalar(query, {"id": outcome.message_id}))
        record_of.outcomes.append(outcome)

    add_outcome_hook(hook)
    yield record_of
    remove_outcome_hook(hook)
    observer.dispose()


@pytest.fixture
def service(clean: Engine) -> Iterator[Service]:
    made = Service.from_settings(load_settings())
    yield made
    made.close()


def message(engine: Engine, status: str, **fields: object) -> tuple[int, str]:
    """A message in ``status`` (type ``otp`` unless given): its id and key."""
    key = f"told-{uuid.uuid4().hex[:12]}"
    with Session(engine) as session:
        row = add(session, key, status, **{"message_type": "otp", **fields})
        return row.id, key


def status_of(engine: Engine, message_id: int) -> str:
    with engine.connect() as conn:
        query = select(messages_table.c.status).where(messages_table.c.id == message_id)
        return str(conn.scalar(query))


def only(told: Told, *expected: Outcome) -> None:
    """The hook got exactly ``expected``, each already committed when it was called."""
    assert told.outcomes == list(expected)
    assert told.seen == [outcome.status for outcome in expected]
    assert all(RECIPIENT not in repr(outcome) for outcome in told.outcomes)


# --- each path to the four statuses ------------------------------------------------------------


@pytest.mark.parametrize(("status", "code"), [("delivered", None), ("undelivered", "HARD_BOUNCE")])
def test_a_receipt_recorded_is_told_after_its_commit(
    clean: Engine, told: Told, status: str, code: str | None
) -> None:
    mid, key = message(clean, "sent")
    with tell_outcomes_after(), clean.begin() as conn:
        record(conn, ReceiptEvent("stub", f"evt-{key}", key, status, code))
        assert told.outcomes == []  # not before the commit
    only(told, Outcome(mid, key, "otp", status, code))


def test_a_rolled_back_receipt_tells_nothing(clean: Engine, told: Told) -> None:
    mid, key = message(clean, "sent")
    with pytest.raises(RuntimeError), tell_outcomes_after(), clean.begin() as conn:
        record(conn, ReceiptEvent("stub", f"evt-{key}", key, "delivered"))
        raise RuntimeError("the caller's transaction fails after the move")
    assert status_of(clean, mid) == "sent"
    only(told)


def test_the_sweeper_tells_a_receipt_that_waited(clean: Engine, told: Told) -> None:
    mid, key = message(clean, "sending", attempts=1)
    with tell_outcomes_after(), clean.begin() as conn:
        record(conn, ReceiptEvent("stub", f"evt-{key}", key, "delivered"))
    only(told)  # still sending: the receipt waits
    with clean.begin() as conn:  # as the worker's sent would
        conn.execute(
            text("UPDATE delivery_messages SET status = 'sent' WHERE id = :id"), {"id": mid}
        )
    assert sweep(clean).receipts == 1
    only(told, Outcome(mid, key, "otp", "delivered", None))


def test_the_receiver_tells_a_receipt_it_stored(clean: Engine, told: Told) -> None:
    mid, key = message(clean, "sent")
    app = Receiver(clean, {"stub": StandardReceipts("stub", "providers.stub.x", SECRET)})
    data = json.dumps({"id": "ref-1", "idempotency_key": key, "status": "delivered"}).encode()
    now, event = dt.datetime.now(dt.UTC), f"evt_{uuid.uuid4().hex}"
    headers = {
        "content-type": "application/json",
        "webhook-id": event,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(event, now, data),
    }
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://r") as client:
        assert client.post("/receipts/stub", content=data, headers=headers).status_code == 200
    only(told, Outcome(mid, key, "otp", "delivered", None))


def test_a_permanent_answer_settled_is_told_dead(
    clean: Engine, service: Service, told: Told
) -> None:
    mid, key = message(clean, "sending", attempts=1, message_type="marketing")
    msg = Sending(
        mid, key, "stub", 1, 5, UnknownPolicy.RETRY, Backoff(), dt.datetime.now(dt.UTC),
        message_type="marketing",
    )  # fmt: skip
    result = after_send(service, msg, Permanent("21211", "not a number"), time.perf_counter())
    assert result.status == "dead"
    only(told, Outcome(mid, key, "marketing", "dead", "21211"))


def test_a_workers_attempt_answered_for_good_is_told_dead(
    clean: Engine, service: Service, told: Told, stub: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's own path (``deliver``: take, call, settle): the message's type travels
    with it (``Sending.message_type``)."""
    monkeypatch.setattr(outbox, "_nudge", None)
    to, key = "+12015550179", f"told-{uuid.uuid4().hex[:12]}"
    stub.set_faults(rules={to: {"status": 400, "json": {"code": 21211, "message": "bad"}}})
    with Session(clean) as session, session.begin():
        outbox.enqueue(session, type="otp", to=to, payload={"body": "b"}, key=key)
    with clean.begin() as conn:
        (claimed,) = claim(conn, limit=10, lease=60)
    result = deliver(service, claimed.id, claimed.key)
    assert (result.status, result.code) == ("dead", "21211")
    only(told, Outcome(claimed.id, key, "otp", "dead", "21211"))


def test_a_delivery_is_not_an_outcome(clean: Engine, service: Service, told: Told) -> None:
    """``sent`` is not told (a receipt may follow it)."""
    mid, key = message(clean, "sending", attempts=1)
    msg = Sending(mid, key, "stub", 1, 5, UnknownPolicy.RETRY, Backoff(), dt.datetime.now(dt.UTC))
    assert after_send(service, msg, Delivered("ref"), time.perf_counter()).status == "sent"
    only(told)


def dispatched_row(service: Service, engine: Engine, **fields: object) -> tuple[Row[Any], str]:
    lease = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    mid, key = message(engine, "dispatched", lease_expires_at=lease, **fields)
    with service.engine.connect() as conn:
        return conn.execute(ROW.where(messages_table.c.id == mid)).one(), key


def test_a_provider_not_configured_is_told_dead(
    clean: Engine, service: Service, told: Told
) -> None:
    row, key = dispatched_row(service, clean, provider="gone")
    with service.engine.connect() as conn:
        clock = attempt.Clock(db_now(conn), time.monotonic())
    result = attempt.check(service, row, clock)
    assert result is not None and result.status == "dead"
    only(told, Outcome(row.id, key, "otp", "dead", attempt.PROVIDER_NOT_CONFIGURED))


def test_a_suppressed_recipient_is_told(clean: Engine, service: Service, told: Told) -> None:
    row, key = dispatched_row(service, clean)
    assert attempt.suppress(service, row).status == "suppressed"
    only(told, Outcome(row.id, key, "otp", "suppressed", attempt.SUPPRESSED))


def test_a_resolve_to_dead_from_the_cli_is_told_after_its_commit(clean: Engine, told: Told) -> None:
    mid, key = message(clean, "unknown", attempts=1)
    result = CliRunner().invoke(main, ["resolve", key, "--as", "dead"])
    assert result.exit_code == 0, result.output
    only(told, Outcome(mid, key, "otp", "dead", None))


def test_a_resolve_in_a_session_is_told_at_its_commit_only(clean: Engine, told: Told) -> None:
    """As the console does: told at ``commit()``, not before; a rollback, a session closed
    without a commit, or a savepoint rolled back tells nothing (and leaves nothing held for
    the session's next commit); a savepoint released is told at the outer commit."""
    kept, gone, dropped, inner, nested = (message(clean, "unknown") for _ in range(5))
    with Session(clean) as session:
        assert resolve(session, kept[1], "dead").resolved
        only(told)
        session.commit()
    only(told, Outcome(*kept, "otp", "dead", None))
    told.outcomes.clear()
    told.seen.clear()
    with Session(clean) as session:
        assert resolve(session, gone[1], "dead").resolved
        session.rollback()
        assert resolve(session, dropped[1], "dead").resolved
        session.close()  # never committed
        with session.begin_nested():
            assert resolve(session, nested[1], "dead").resolved
        savepoint = session.begin_nested()
        assert resolve(session, inner[1], "dead").resolved
        savepoint.rollback()
        only(told)
        session.commit()
    only(told, Outcome(*nested, "otp", "dead", None))
    assert [status_of(clean, m[0]) for m in (gone, dropped, inner)] == ["unknown"] * 3


# --- the hooks themselves ---------------------------------------------------------------------


def transition(to: str, message_id: int = 7) -> Transition:
    return Transition(message_id, f"k-{to}", "stub", "sending", to, 1, code="C", message_type="t")


def test_only_the_four_statuses_are_outcomes_and_none_names_a_recipient() -> None:
    assert {f.name for f in fields(Outcome)} == {
        "message_id",
        "key",
        "message_type",
        "status",
        "code",
    }
    assert set(OUTCOME_STATUSES) == {"delivered", "undelivered", "suppressed", "dead"}
    got: list[Outcome] = []
    add_outcome_hook(got.append)
    try:
        with tell_outcomes_after():
            for status in Status:
                emit(transition(status))
    finally:
        remove_outcome_hook(got.append)
    assert [o.status for o in got] == [s for s in Status if s in OUTCOME_STATUSES]
    assert got[0] == Outcome(7, "k-dead", "t", "dead", "C")
    assert all(type(o.status) is str for o in got)


def test_a_failing_hook_is_logged_and_the_next_still_runs(caplog: pytest.LogCaptureFixture) -> None:
    got: list[Outcome] = []

    def broken(outcome: Outcome) -> None:
        raise ValueError("the app's bug")

    add_outcome_hook(broken)
    add_outcome_hook(got.append)
    add_outcome_hook(got.append)  # added twice: called once
    try:
        with caplog.at_level(logging.ERROR, "delivery.outcomes"), tell_outcomes_after():
            emit(transition("dead"))
    finally:
        remove_outcome_hook(broken)
        remove_outcome_hook(got.append)
    assert [o.key for o in got] == ["k-dead"]
    assert any("outcome hook" in r.getMessage() and r.exc_info for r in caplog.records)


def test_an_outcome_outside_a_scope_is_an_error_and_never_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    got: list[Outcome] = []
    add_outcome_hook(got.append)
    try:
        with caplog.at_level(logging.ERROR, "delivery.outcomes"):
            emit(transition("suppressed", 41))
        with held_outcomes() as held:  # a scope that holds: told by its caller, or never
            emit(transition("dead"))
    finally:
        remove_outcome_hook(got.append)
    assert got == [] and [o.status for o in held] == ["dead"]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "delivery.outcomes"]
    assert "suppressed" in line and "41" in line and RECIPIENT not in line


# --- the setting: hooks of processes the app does not start -------------------------------------

CALLED: list[Outcome] = []
NOT_CALLABLE = 3


def module_hook(outcome: Outcome) -> None:
    CALLED.append(outcome)


def test_a_named_hook_is_registered_once_in_a_process() -> None:
    settings = load_settings().with_(outcome_hooks=("tests.test_outcome_hooks:module_hook",))
    assert outcome_hooks(settings) == [module_hook]
    CALLED.clear()
    try:
        use_outcome_hooks(settings)
        Service.from_settings(settings).close()  # where a worker's service is built: again
        with tell_outcomes_after():
            emit(transition("undelivered"))
    finally:
        remove_outcome_hook(module_hook)
    assert [o.status for o in CALLED] == ["undelivered"]


@pytest.mark.parametrize(
    "name",
    [
        "tests.no_such_module:hook",
        "tests.test_outcome_hooks:no_such_hook",
        "tests.test_outcome_hooks:NOT_CALLABLE",
    ],
)
def test_a_hook_that_does_not_import_refuses_to_start(name: str) -> None:
    settings = load_settings().with_(outcome_hooks=(name,))
    for start in (use_outcome_hooks, Service.from_settings):
        with pytest.raises(ConfigError) as caught:
            start(settings)
        assert caught.value.key == "delivery.outcome_hooks"
        assert name in str(caught.value)


@pytest.mark.parametrize(
    ("name", "said"),
    [("tests.test_outcome_hooks:module_hook", "ok"), ("tests.test_outcome_hooks:gone", "gone")],
)
def test_config_check_imports_the_hooks(name: str, said: str, tmp_path: Path) -> None:
    """``delivery config check`` imports each hook as a process would at its start: ok, or
    exit 2 in one line naming ``delivery.outcome_hooks``."""
    config = tmp_path / "hooks.toml"
    config.write_text(f'[delivery]\noutcome_hooks = ["{name}"]\n')
    result = CliRunner().invoke(main, ["config", "check", str(config)])
    assert said in result.output
    if said != "ok":
        assert result.exit_code == 2 and "delivery.outcome_hooks" in result.output


def test_a_hook_name_is_checked_with_the_settings() -> None:
    from delivery.config.loading import settings_from_mapping

    with pytest.raises(ConfigError) as caught:
        settings_from_mapping(
            {"delivery": {"outcome_hooks": ["myapp.hooks"]}},
            database_url="sqlite://",
            broker_url="x",
            redis_url=None,
        )
    assert caught.value.key == "delivery.outcome_hooks"


@pytest.mark.integration
def test_a_worker_with_a_hook_that_does_not_import_stops_in_one_line(
    pg_engine: Engine, tmp_path: Path
) -> None:
    from tests.test_startup import refused

    config = tmp_path / "delivery.toml"
    config.write_text('[delivery]\noutcome_hooks = ["myapp_missing.hooks:told"]\n')
    line = refused("worker", {"DELIVERY_CONFIG": str(config)}, "delivery.outcome_hooks", tmp_path)
    assert "myapp_missing" in line


# --- every transaction that can reach the four statuses opens a scope -----------------------------

#: The transitions (public functions of ``delivery/transitions/`` that emit) whose move can end
#: in one of ``OUTCOME_STATUSES`` on a connection: their callers' transactions need a scope.
REACHES = {
    "worker.leave": "dispatched -> why.to (suppressed, dead)",
    "worker.stop": "sending -> failure.final (dead)",
    "worker.give_back": "sending -> why.to",
    "recovery.recover": "sending -> the caller's status",
    "receipts.record": "-> delivered, undelivered",
    "receipts.record_many": "-> delivered, undelivered",
    "receipts.apply_waiting": "-> delivered, undelivered",
}
#: Told at the caller's Session commit instead (``test_a_resolve_in_a_session_...``).
IN_A_SESSION = {"repair.resolve": "unknown -> sent, dead"}
#: The others, and why none reaches them.
NEVER = {
    "worker.take": "dispatched -> sending",
    "worker.finish_sent": "sending -> sent",
    "worker.park": "sending -> dispatched, pending",
    "recovery.expire": "-> expired",
    "recovery.requeue": "dispatched -> pending",
    "relay.dispatch": "pending -> dispatched",
    "relay.release": "dispatched -> pending",
    "repair.redrive": "dead, unknown -> pending",
    "repair.cancel": "pending -> cancelled",
    "failover.fail_over": "dispatched, sending -> pending",
}
EVENTS = "delivery.observability.events"
SCOPES = {f"{EVENTS}.tell_outcomes_after"}
OPENERS = {"begin", "connect"}  # engine.begin(), connection.begin(), autocommit.connect()


def sources() -> dict[str, str]:
    found = {}
    for path in sorted((ROOT / "delivery").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if "migrations" in parts:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path.read_text()
    return found


class Calls:
    """What every function of ``delivery/`` calls, by qualified name (calls of a name it
    defines or imports, of an imported module's attribute, or of ``self``'s method)."""

    def __init__(self, modules: Mapping[str, str]) -> None:
        self.trees = {name: ast.parse(text_) for name, text_ in modules.items()}
        self.imports = {name: _imported(tree) for name, tree in self.trees.items()}
        self.defined = {
            name: {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            for name, tree in self.trees.items()
        }
        self.calls: dict[str, set[str]] = {}
        for name, tree in self.trees.items():
            for node in tree.body:
                if isinstance(node, ast.FunctionDef):
                    self.calls[f"{name}.{node.name}"] = self.called(name, node)
                elif isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef):
                            where = f"{name}.{node.name}.{item.name}"
                            self.calls[where] = self.called(name, item, node.name)

    def resolve(self, name: str) -> str:
        """``name`` followed through re-exports (``delivery.transitions.X``) to its module."""
        for _ in range(5):
            module, _, attribute = name.rpartition(".")
            again = self.imports.get(module, {}).get(attribute)
            if again is None or name in self.calls:
                return name
            name = again
        return name

    def called(self, module: str, function: ast.AST, cls: str | None = None) -> set[str]:
        return {name for node in ast.walk(function) if (name := self.target(module, node, cls))}

    def target(self, module: str, node: ast.AST, cls: str | None = None) -> str | None:
        if not isinstance(node, ast.Call):
            return None
        func, imports = node.func, self.imports[module]
        if isinstance(func, ast.Name):
            if func.id in self.defined[module]:
                return f"{module}.{func.id}"
            return self.resolve(imports[func.id]) if func.id in imports else None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner == "self" and cls is not None:
                return f"{module}.{cls}.{func.attr}"
            if owner in imports:
                return self.resolve(f"{imports[owner]}.{func.attr}")
        return None

    def reaches(self, start: str, goals: set[str], seen: set[str] | None = None) -> bool:
        seen = set() if seen is None else seen
        if start in goals:
            return True
        if start in seen:
            return False
        seen.add(start)
        return any(self.reaches(c, goals, seen) for c in self.calls.get(start, ()))


def _imported(tree: ast.Module) -> dict[str, str]:
    """A module's imported names (at its top level), each by the qualified name it binds."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name] = alias.name
    return names


def unscoped(modules: Mapping[str, str], goals: set[str]) -> list[str]:
    """Each ``with`` outside ``delivery/transitions/`` that opens a transaction (``.begin()``,
    ``.connect()``) around a call reaching ``goals`` without ``tell_outcomes_after()`` before
    it (in the same ``with``, or one around it): ``module:line``."""
    calls = Calls(modules)
    found = []
    for module, tree in calls.trees.items():
        if module.startswith("delivery.transitions"):
            continue
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef):
                found += _unscoped_in(calls, module, function, goals)
    return found


def _unscoped_in(
    calls: Calls, module: str, function: ast.FunctionDef, goals: set[str]
) -> list[str]:
    cls = None
    for node in calls.trees[module].body:
        if isinstance(node, ast.ClassDef) and function in node.body:
            cls = node.name
    found = []

    def visit(node: ast.AST, scoped: bool) -> None:
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            and node is not function
        ):
            return
        if isinstance(node, ast.With):
            for item in node.items:
                expr = item.context_expr
                if calls.target(module, expr, cls) in SCOPES:
                    scoped = True
                opens = any(
                    isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute)
                    and n.func.attr in OPENERS
                    for n in ast.walk(expr)
                )
                inside = [c for s in node.body for c in ast.walk(s)]
                targets = {t for c in inside if (t := calls.target(module, c, cls))}
                if opens and not scoped and any(calls.reaches(t, goals) for t in targets):
                    found.append(f"{module}:{node.lineno}")
        for child in ast.iter_child_nodes(node):
            visit(child, scoped)

    visit(function, False)
    return found


def qualified(short: str) -> str:
    return f"delivery.transitions.{short}"


def test_every_emitting_transition_is_classified() -> None:
    """Each public function of ``delivery/transitions/`` that emits a ``Transition`` says
    whether it can reach one of the four statuses: a new one fails here until it does."""
    modules = sources()
    calls = Calls(modules)
    emitters = {f"{EVENTS}.emit", f"{EVENTS}.emit_moved"}
    emitting = set()
    for module in modules:
        if (
            module.startswith("delivery.transitions.")
            and module != "delivery.transitions.vocabulary"
        ):
            tree = calls.trees[module]
            public = next(
                (ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)),
                [],
            )  # fmt: skip
            short = module.removeprefix("delivery.transitions.")
            emitting |= {
                f"{short}.{name}" for name in public if calls.reaches(f"{module}.{name}", emitters)
            }
    classified = set(REACHES) | set(IN_A_SESSION) | set(NEVER)
    assert emitting - classified == set()
    assert {"worker.leave", "receipts.record", "repair.resolve", "relay.dispatch"} <= emitting


def test_every_transaction_that_can_reach_an_outcome_opens_a_scope() -> None:
    goals = {qualified(name) for name in REACHES}
    modules = sources()
    assert unscoped(modules, goals) == []
    # The walk sees the places it checks: each of them, unscoped, is found.
    bare = {
        module: text_.replace("tell_outcomes_after(), ", "")
        for module, text_ in modules.items()
        if not module.startswith("delivery.transitions")
    }
    found = {place.split(":")[0] for place in unscoped({**modules, **bare}, goals)}
    assert {
        "delivery.sending.settle",
        "delivery.sending.attempt",
        "delivery.relay.sweeper",
        "delivery.receipts.receiver",
    } <= found


def test_the_walk_finds_a_transaction_without_a_scope() -> None:
    probe = (
        "from delivery.transitions import tell_outcomes_after\n"
        "from delivery.transitions.worker import stop\n"
        "def _helper(conn, msg, failure):\n"
        "    return stop(conn, msg, failure)\n"
        "def bare(engine, msg, failure):\n"
        "    with engine.begin() as conn:\n"
        "        _helper(conn, msg, failure)\n"
        "def scoped(engine, msg, failure):\n"
        "    with tell_outcomes_after(), engine.begin() as conn:\n"
        "        _helper(conn, msg, failure)\n"
        "def around(engine, msg, failure):\n"
        "    with tell_outcomes_after():\n"
        "        with engine.connect() as conn:\n"
        "            stop(conn, msg, failure)\n"
    )
    modules = {**sources(), "delivery.sending._probe": probe}
    found = unscoped(modules, {qualified(name) for name in REACHES})
    assert found == ["delivery.sending._probe:6"]
