"""``/suppressions``: the newest entries of the suppression list (channel, hash prefix, code,
source; never a recipient) and, for operators, an audited add and lift.

A recipient typed in a form is hashed and forgotten: no page, notice, error or audit row
repeats it. Without the list's secret the page says the list is off and refuses changes.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from delivery.config.settings import CHANNELS
from delivery.console.context import actor, db, state
from delivery.errors import InvalidMessage
from delivery.guards.suppression import Suppressions
from delivery.ops.suppression import lift, suppress, suppressions

__all__ = ["blueprint"]

blueprint = Blueprint("suppressions", __name__)

SHOWN = 100  # newest entries listed


def _off_note(lists: Suppressions) -> str | None:
    """Why there is no list (no secret in the environment), or None when there is one."""
    if lists.active():
        return None
    variable = state().settings.suppression_secret_env
    return (
        f"The suppression list is off: {variable} is not set in the console's environment, "
        "so nothing is suppressed and nothing can be added or lifted here."
    )


@blueprint.get("/suppressions")
def suppressions_page() -> str:
    lists = Suppressions(state().settings)
    rows = suppressions(db(), lists, limit=SHOWN)
    return render_template(
        "suppressions.html", rows=rows, off=_off_note(lists), channels=CHANNELS, shown=SHOWN
    )


def _form(lists: Suppressions) -> tuple[str, str]:
    """The form's channel and recipient; a 400 when the list is off or the channel unknown
    (the recipient is checked where it is hashed, ``ops.suppression``: see ``_change``)."""
    off = _off_note(lists)
    if off is not None:
        abort(400, f"{off} Nothing was written.")
    channel = request.form.get("channel", "")
    if channel not in CHANNELS:
        abort(400, f"channel: must be one of {', '.join(CHANNELS)}; nothing was written")
    return channel, request.form.get("recipient", "")


@blueprint.post("/suppressions/add")
def add() -> Response:
    return _change(suppress, "added", "was already on the list")


@blueprint.post("/suppressions/lift")
def lift_one() -> Response:
    return _change(lift, "lifted", "was not on the list")


def _change(change: Callable[..., bool], done: str, not_done: str) -> Response:
    """Add or lift (``change``: ``ops.suppression``'s, audited) the form's recipient, and say
    which happened. A recipient it refuses is a 400 naming the field, the recipient not
    echoed (its problem never quotes it), nothing written."""
    lists = Suppressions(state().settings)
    channel, recipient = _form(lists)
    session = db()
    try:
        changed = change(session, lists, channel, recipient, actor=actor())
    except InvalidMessage as exc:
        abort(400, f"{exc}; nothing was written")
    session.commit()
    flash(f"{channel}: recipient " + (done if changed else not_done))
    return redirect(url_for("suppressions.suppressions_page"), 303)
