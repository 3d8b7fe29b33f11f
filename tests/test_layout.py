"""The package's shape, read from the source: the rooms stay small, free of Celery, and
free of import cycles (lazy, function-level imports included)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("delivery", "tasks")
MAX_LINES = 400
MAX_POSITIONAL = 5
CELERY = ("celery", "kombu")


def _modules() -> dict[str, Path]:
    """Every module of delivery/ and tasks/ by dotted name (the Alembic migrations aside: they
    are generated, and Alembic loads them by path)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative.parts[:2] == ("delivery", "migrations") or ".venv" in relative.parts:
                continue
            parts = list(relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """The absolute names every ``import`` and ``from ... import`` of a module reaches, at any
    depth (inside functions too), with their line numbers. ``from P import x`` reaches
    ``P.x`` when that is a module of ours, else ``P``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in MODULES else base), node.lineno


def _graph() -> dict[str, set[str]]:
    """Module -> the other modules of delivery/ and tasks/ it imports."""
    return {
        name: {target for target, _ in _imports(name, path) if target in MODULES} - {name}
        for name, path in MODULES.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more modules (Tarjan), as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_modules_are_found() -> None:
    """The walk sees the rooms (a moved tree would otherwise pass every check vacuously)."""
    for name in ("delivery", "delivery.sending.sender", "delivery.cli", "delivery.worker.deliver"):
        assert name in MODULES, name


def test_no_module_passes_the_line_limit() -> None:
    """No module of delivery/ or tasks/ (migrations aside) is longer than 400 lines."""
    long = {
        name: n
        for name, path in MODULES.items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"


def _in_worker(name: str) -> bool:
    return name == "delivery.worker" or name.startswith("delivery.worker.")


def test_only_the_worker_room_imports_celery() -> None:
    """Outside ``delivery.worker``, nothing under delivery/ imports celery, kombu, the Celery
    app ``delivery.worker`` or the repository's ``tasks``, at any depth (the core stays free of
    Celery; contrib loads ``delivery.worker`` by name, only when asked)."""
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for name, path in MODULES.items()
        if name.split(".")[0] == "delivery" and not _in_worker(name)
        for target, line in _imports(name, path)
        if target.split(".")[0] in (*CELERY, "tasks") or _in_worker(target)
    ]
    assert not found, found


def test_no_import_cycles() -> None:
    """The modules of delivery/ and tasks/ import each other without a cycle, counting the
    imports inside functions too."""
    assert _cycles(_graph()) == []


def test_cycle_finder_finds_a_cycle() -> None:
    """The cycle check can fail: a lazy import back to an importer is a cycle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_functions_take_at_most_five_positional_parameters() -> None:
    """A function of delivery/ or tasks/ takes at most five positional parameters (self and
    cls aside); beyond that it takes a small frozen object (or keyword-only options)."""
    long: list[str] = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
                if names[:1] in (["self"], ["cls"]):
                    names = names[1:]
                if len(names) > MAX_POSITIONAL:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}{names}")
    assert not long, long


def test_every_room_says_what_lives_there_and_what_it_may_import() -> None:
    """Each package of delivery/ opens with a docstring that names what it may import."""
    missing = []
    for name, path in MODULES.items():
        if path.name != "__init__.py" or not name.startswith("delivery.") or "migrations" in name:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if "may import" not in doc.lower():
            missing.append(name)
    assert not missing, missing


#: Which rooms of delivery/ each room may import (a room is ``delivery.X``; ``delivery``
#: itself is the public API). A new arrow is a decision: add it here and to the room's
#: docstring. The shared vocabulary (``core``) and the status writer (``transitions``) are
#: below the three sides of a message's life (``outbox``, ``relay``, ``sending``), which
#: never import each other except for the relay's ``Claim``, the type the outbox's nudge
#: hands to the same publisher.
ROOMS: dict[str, set[str]] = {
    "delivery": {"config", "core", "errors", "observability", "outbox", "runtime"},
    "errors": set(),
    "core": {"config", "errors"},  # config.settings: the Backoff the backoff function reads
    "config": {"core", "errors", "providers"},
    "providers": {"config", "core", "errors"},
    "guards": {"config", "core", "observability"},
    "runtime": {"config", "errors", "guards", "observability", "providers"},  # outcome hooks
    "observability": {"core", "guards", "ops"},  # metrics read the ops' queries
    "transitions": {"config", "core", "observability"},
    "outbox": {
        "config",
        "core",
        "errors",
        "observability",
        "providers",
        "relay",
        "runtime",
        "transitions",
    },
    "relay": {"config", "core", "observability", "transitions"},
    "sending": {
        "config",
        "core",
        "errors",
        "guards",
        "observability",
        "providers",
        "runtime",
        "transitions",
    },
    # runtime: the current settings, whose routes a redrive follows (delivery.ops.repair)
    "ops": {
        "config",
        "core",
        "errors",
        "guards",
        "observability",
        "outbox",
        "runtime",
        "transitions",
    },
    "console": {"config", "core", "errors", "guards", "ops", "providers", "runtime"},
    "contrib": {
        "config",
        "core",
        "errors",
        "observability",
        "ops",
        "outbox",
        "receipts",
        "relay",
        "runtime",
    },
    "testing": {"config", "core", "outbox", "runtime"},
    "receipts": {
        "config",
        "core",
        "errors",
        "guards",
        "observability",
        "ops",
        "providers",
        "runtime",
        "transitions",
    },
    "cli": {
        "config",
        "console",
        "core",
        "errors",
        "guards",
        "observability",
        "ops",
        "receipts",
        "runtime",
        "testing",
    },
    "worker": {
        "config",
        "core",
        "errors",
        "guards",
        "observability",
        "outbox",
        "providers",
        "relay",
        "runtime",
        "sending",
        "transitions",
    },
}


def _room(name: str) -> str:
    parts = name.split(".")
    return parts[1] if parts[0] == "delivery" and len(parts) > 1 else parts[0]


def _room_imports() -> list[str]:
    """Each import of one room by another that ``ROOMS`` does not allow, as text."""
    found = []
    for name, path in MODULES.items():
        if not name.startswith("delivery"):
            continue
        room = _room(name)
        for target, line in _imports(name, path):
            other = _room(target)
            if target in MODULES and other != room and other not in ROOMS.get(room, set()):
                found.append(f"{path.relative_to(ROOT)}:{line} ({room}) imports {target}")
    return found


def test_rooms_import_only_the_rooms_they_may() -> None:
    """Every import between two rooms of delivery/ is one ``ROOMS`` allows (lazy imports
    included), and every room of the tree is listed there."""
    rooms = {_room(name) for name in MODULES if name.startswith("delivery.")}
    assert rooms <= ROOMS.keys(), rooms - ROOMS.keys()
    assert _room_imports() == []


def test_every_room_names_all_its_modules() -> None:
    """Each package's docstring names every module and sub-package in it (``__main__`` and
    the top-level public API aside), so a reader finds any module's room from its map."""
    missing = []
    for name, path in MODULES.items():
        if path.name != "__init__.py" or name == "delivery" or "migrations" in name:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        here = path.parent
        inside = [p.stem for p in here.glob("*.py") if p.stem not in ("__init__", "__main__")]
        inside += [p.name for p in here.iterdir() if (p / "__init__.py").is_file()]
        missing += [f"{name}: {m}" for m in inside if not re.search(rf"\b{m}\b", doc)]
    assert not missing, missing


def test_migrations_are_found_where_the_package_ships_them() -> None:
    """The Alembic ini and migrations the runtime reads exist where the package data puts them
    (a moved module must not lose them silently: Alembic ignores a missing ini file)."""
    from delivery.runtime import db

    assert db._INI == ROOT / "delivery" / "alembic.ini"
    assert db._INI.is_file()
    assert (ROOT / "delivery" / "migrations" / "env.py").is_file()
