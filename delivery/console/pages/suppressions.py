"""``/suppressions``: the newest entries of the suppression list (channel, hash prefix, code,
source; never a recipient) and, for operators, an audited add and lift.

A recipient typed in a form is hashed and forgotten: no page, notice, error or audit row
repeats it. Without the list's secret the page says the list is off and refuses changes.
"""

from __future__ import annotations

import re

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from delivery.config.settings import CHANNELS
from delivery.console.context import actor, db, state
from delivery.guards.suppression import Suppressions
from delivery.ops.suppression import lift, suppress, suppressions

__all__ = ["blueprint"]

blueprint = Blueprint("suppressions", __name__)

SHOWN = 100  # newest entries listed

#: The shape a recipient of each channel has in the outbox (what a worker hashes), and what
#: the error says otherwise; a rough check that catches a recipient typed on the wrong channel.
_SHAPES = {
    "sms": (
        re.compile(r"\+[1-9][0-9]{5,16}"),
        "is not a phone number in E.164 form (+14155550123)",
    ),
    "email": (re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+"), "is not an email address"),
    "webhook": (re.compile(r"(?i)https?://[^\s/?#]+.*"), "is not an http(s) URL"),
}


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
    """The form's channel and recipient; a 400 naming the field (and not echoing the
    recipient) when the list is off or either is unusable."""
    off = _off_note(lists)
    if off is not None:
        abort(400, f"{off} Nothing was written.")
    channel = request.form.get("channel", "")
    if channel not in CHANNELS:
        abort(400, f"channel: must be one of {', '.join(CHANNELS)}; nothing was written")
    recipient = request.form.get("recipient", "")
    if not recipient.strip():
        abort(400, "recipient: is empty; nothing was written")
    pattern, problem = _SHAPES[channel]
    if not pattern.fullmatch(recipient):
        abort(400, f"recipient: {problem} (for channel {channel}); nothing was written")
    return channel, recipient


@blueprint.post("/suppressions/add")
def add() -> Response:
    lists = Suppressions(state().settings)
    channel, recipient = _form(lists)
    session = db()
    added = suppress(session, lists, channel, recipient, actor=actor())
    session.commit()
    flash(f"{channel}: recipient " + ("added" if added else "was already on the list"))
    return redirect(url_for("suppressions.suppressions_page"), 303)


@blueprint.post("/suppressions/lift")
def lift_one() -> Response:
    lists = Suppressions(state().settings)
    channel, recipient = _form(lists)
    session = db()
    lifted = lift(session, lists, channel, recipient, actor=actor())
    session.commit()
    flash(f"{channel}: recipient " + ("lifted" if lifted else "was not on the list"))
    return redirect(url_for("suppressions.suppressions_page"), 303)
