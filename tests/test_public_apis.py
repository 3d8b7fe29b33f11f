"""The product reaches other libraries through their public APIs only: no module of delivery/
reads, calls or sets a private name (``_name``) of an object it did not define, so a minor
release of SQLAlchemy, httpx, phonenumbers or Celery cannot break it unannounced."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Underscore names that their libraries document as public.
DOCUMENTED = {
    "_mapping": "SQLAlchemy's Row._mapping (the documented mapping view of a row)",
    "_asdict": "namedtuple's documented API",
    "_fields": "namedtuple's documented API",
    "_replace": "namedtuple's documented API",
}
#: (module, name): a library's documented extension point, overridden in a subclass.
EXTENSION_POINTS = {
    ("delivery/worker/filebroker.py", "_queue_bind"): "kombu's virtual Channel hook",
    ("delivery/worker/filebroker.py", "_exchange_file"): "kombu's filesystem Channel hook",
}


def _ours(tree: ast.Module) -> set[str]:
    """Names a module binds to its own code: what it defines, and what it imports from
    ``delivery``."""
    names: set[str] = {"self", "cls"}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").startswith("delivery")
        ):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.startswith("delivery")
            )
    return names


def _private_uses(path: Path) -> list[str]:
    relative = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    tree = ast.parse(path.read_text(), relative)
    ours = _ours(tree)
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ours:
                continue
            name = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name = node.args[1].value
        if not name or not name.startswith("_") or name.startswith("__"):
            continue
        if name in DOCUMENTED or (relative, name) in EXTENSION_POINTS:
            continue
        found.append(f"{relative}:{node.lineno} {name}")
    return found


def _product() -> list[Path]:
    return [
        path
        for path in sorted((ROOT / "delivery").rglob("*.py"))
        if "migrations" not in path.relative_to(ROOT).parts
    ]


def test_no_module_uses_a_private_name_of_a_library() -> None:
    """No ``x._name`` (or ``getattr(x, "_name")``) on an object of another library, outside
    the documented exceptions listed above."""
    found = [use for path in _product() for use in _private_uses(path)]
    assert not found, found


def test_the_check_finds_a_private_call(tmp_path: Path) -> None:
    """The check can fail: a connection's private method, and a private attribute read by
    getattr, are found; our own module's private helper is not."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from delivery.core import models\n"
        "def f(conn):\n"
        "    conn._cursor_execute(1)\n"
        "    models._helper()\n"
        "    return getattr(conn.dialect, '_json_serializer', None)\n"
    )
    found = _private_uses(probe)
    assert sorted(use.split(" ")[1] for use in found) == ["_cursor_execute", "_json_serializer"]
