"""``/audit``: every operator action, newest first, from the console, the CLI or the admin."""

from __future__ import annotations

from flask import Blueprint, render_template, request

from delivery import ops
from delivery.console.context import before, db

__all__ = ["blueprint"]

blueprint = Blueprint("audit", __name__)


@blueprint.get("/audit")
def audit_page() -> str:
    actor = request.args.get("actor", "").strip() or None
    rows = ops.entries(db(), actor=actor, before=before("an audit row id"), limit=51)
    more = len(rows) > 50
    rows = rows[:50]
    return render_template(
        "audit.html",
        rows=rows,
        actor=actor or "",
        next_before=rows[-1].id if more else None,
    )
