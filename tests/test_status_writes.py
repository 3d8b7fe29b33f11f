"""One room writes a message's status: ``delivery/transitions/``. Every other module
asks it (docs/concepts.md, "How a message travels"). The source of ``delivery/`` is read as
Python (its AST), and any UPDATE of the status column outside that room fails the test:

- ``.values(status=...)`` or ``.update(status=...)`` (SQLAlchemy, or a Django queryset);
- ``update(messages_table)`` or ``update(Message)`` in a function that names ``status`` as a
  column to set (a ``"status"`` key) or passes its columns as ``**values``;
- ``something.status = ...`` (an ORM object's attribute);
- SQL text ``UPDATE delivery_messages SET ... status = ...``.

An INSERT's initial status is the row's creation, not a transition: not an UPDATE, not looked
for.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "delivery"
ROOM = ROOT / "transitions"
_SQL = re.compile(r"UPDATE\s+delivery_messages\s+SET\b[^;]*\bstatus\s*=", re.I | re.S)
_TABLES = {"messages_table", "Message"}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _updates_messages(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and _name(node.func) == "update"
        and len(node.args) == 1
        and _name(node.args[0]) in _TABLES
    )


def _sets_status(scope: ast.AST) -> bool:
    """Whether ``scope`` names ``status`` as a column to set, or passes columns as ``**``."""
    for node in ast.walk(scope):
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if "status" in keys:
                return True
        if isinstance(node, ast.Call) and _name(node.func) == "values" and not _inserts(node):
            if any(k.arg is None or k.arg == "status" for k in node.keywords):
                return True
            if any(isinstance(a, (ast.Dict, ast.DictComp, ast.Name)) for a in node.args):
                return True
    return False


def status_writes(path: Path) -> Iterator[str]:
    """Where the module at ``path`` writes a message's status: ``path:line what``."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(ROOT.parent)
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in [tree, *scopes]:
        body = scope if scope is not tree else ast.Module(body=_top_level(tree), type_ignores=[])
        if any(_updates_messages(n) for n in ast.walk(body)) and _sets_status(body):
            line = next(
                n.lineno for n in ast.walk(body) if isinstance(n, ast.Call) and _updates_messages(n)
            )
            yield f"{where}:{line} UPDATE of the messages table setting its status"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in ("values", "update"):
            if any(k.arg == "status" for k in node.keywords) and not _inserts(node):
                yield f"{where}:{node.lineno} .{_name(node.func)}(status=...)"
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets):
                yield f"{where}:{node.lineno} assignment to .status"
        elif isinstance(node, ast.Constant) and _SQL.search(str(node.value)):
            yield f"{where}:{node.lineno} SQL UPDATE of delivery_messages' status"


def _inserts(node: ast.AST) -> bool:
    """Whether the method chain ``node`` starts with an ``insert(...)`` call."""
    while isinstance(node, (ast.Call, ast.Attribute)):
        if isinstance(node, ast.Call) and not isinstance(node.func, ast.Attribute):
            return _name(node.func) == "insert"
        node = node.func if isinstance(node, ast.Call) else node.value
    return False


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """The module's statements outside its functions (a statement built at import)."""
    return [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _modules() -> list[Path]:
    return sorted(
        p
        for p in ROOT.rglob("*.py")
        if ROOM not in p.parents and "migrations" not in p.relative_to(ROOT).parts
    )


def test_only_the_transitions_room_writes_a_messages_status() -> None:
    """No module of delivery/ outside ``transitions/`` UPDATEs the status column."""
    writes = [w for path in _modules() for w in status_writes(path)]
    assert writes == [], "status written outside delivery/transitions/:\n" + "\n".join(writes)


def test_the_room_is_where_status_is_written() -> None:
    """The scan sees the room's own writes (it is looking at the right thing)."""
    found = [w for path in sorted(ROOM.rglob("*.py")) for w in status_writes(path)]
    assert len(found) >= 5, found


@pytest.mark.parametrize(
    "source",
    [
        "from sqlalchemy import update\n"
        "def f(conn):\n"
        "    conn.execute(update(messages_table).where(x).values(status='sent'))\n",
        "def f(session, message):\n"
        "    values = {'status': 'pending', 'updated_at': now}\n"
        "    session.execute(update(Message).where(Message.id == 1).values(**values))\n",
        "def f(session):\n    session.execute(sa.update(m.Message).values({'status': 'dead'}))\n",
        "def f(qs):\n    qs.filter(status='dead').update(status='pending')\n",
        "def f(message):\n    message.status = 'cancelled'\n",
        "SQL = 'UPDATE delivery_messages SET attempts = 1, status = :s WHERE id = :id'\n",
    ],
    ids=["values-keyword", "values-dict-expanded", "values-dict", "django", "orm", "sql"],
)
def test_a_status_write_elsewhere_is_found(source: str) -> None:
    """Each way of writing the status column, added to a module outside the room, is found."""
    module = ROOT / "sending" / "_probe_status_write.py"
    module.write_text(source)
    try:
        assert list(status_writes(module)), source
    finally:
        module.unlink()


def test_reads_and_inserts_are_not_writes() -> None:
    """A query on the status, an INSERT with an initial status and a lease-only UPDATE are no
    transitions."""
    module = ROOT / "sending" / "_probe_status_read.py"
    module.write_text(
        "def f(conn):\n"
        "    conn.execute(select(m.id).where(m.status == 'pending'))\n"
        "    conn.execute(insert(messages_table).values(status='pending'))\n"
        "    conn.execute(update(messages_table).where(m.status == 'dispatched')"
        ".values(lease_expires_at=until))\n"
    )
    try:
        assert list(status_writes(module)) == []
    finally:
        module.unlink()
