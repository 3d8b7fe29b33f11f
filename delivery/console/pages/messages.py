"""``/messages``: search; ``/messages/<id or key>``: one message, its timeline and the
actions that apply, each behind a confirmation that says what will happen."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from delivery import ops
from delivery.console.context import actor, before, db, state
from delivery.core.models import Message
from delivery.core.status import Status
from delivery.errors import ConfigError
from delivery.providers.registry import adapter_for

__all__ = ["ACTIONS", "blueprint", "describe"]

blueprint = Blueprint("messages", __name__)

ACTIONS = {
    "redrive": "Redrive",
    "resolve-sent": "Resolve as sent",
    "resolve-dead": "Resolve as dead",
    "cancel": "Cancel",
}


#: The actions that apply to a message in each status (none in the others).
_APPLIES = {
    Status.DEAD.value: ["redrive"],
    Status.UNKNOWN.value: ["redrive", "resolve-sent", "resolve-dead"],
    Status.PENDING.value: ["cancel"],
}


def _supports_lookup(provider: str) -> bool:
    config = state().settings.providers.get(provider)
    try:
        return config is not None and adapter_for(config.kind).supports_lookup
    except ConfigError:
        return False


def describe(action: str, message: Message) -> str:
    """What ``action`` will do to ``message``, in the words of the confirmation page."""
    key, provider = message.key, message.provider
    if action == "redrive" and message.status == Status.UNKNOWN.value:
        if _supports_lookup(provider):
            return (
                f"It may already have been delivered, so a lookup runs first: the worker asks "
                f"{provider} whether key {key!r} exists, marks the message sent if it does, and "
                "sends it (same key) only if it does not."
            )
        return (
            f"It may already have been delivered, and {provider} cannot look a key up: it is "
            f"sent again with the same key {key!r}; only {provider}'s deduplication on that key "
            "prevents a second effect."
        )
    if action == "redrive":
        dedupe = (
            f"{provider} will dedupe on that key"
            if message.on_unknown == "retry"
            else f"its policy is on_unknown={message.on_unknown}: {provider} may not dedupe"
        )
        return (
            f"It goes back to pending and is sent again with the same key {key!r} "
            f"({dedupe}); it gets {message.max_attempts - message.budget_start} more attempts."
        )
    if action == "resolve-sent":
        return (
            "You checked with the provider that it was delivered: it becomes sent and is "
            "never sent again."
        )
    if action == "resolve-dead":
        return (
            "You checked with the provider that it was not delivered: it becomes dead "
            "(a redrive can still send it later, same key)."
        )
    return "It becomes cancelled and will never be sent (if no worker took it meanwhile)."


@blueprint.get("/messages")
def search_page() -> str:
    flt = ops.parse_filter(request.args)
    page = ops.search(db(), flt, before=before("a message id"), limit=50)
    return render_template(
        "messages.html",
        flt=flt,
        params=flt.query_params(),
        page=page,
        mask=ops.message_dict,
        statuses=[s.value for s in Status],
        providers=sorted(state().settings.providers),
    )


def _message_page(message: Message, revealed: dict[str, object] | None = None) -> str:
    session = db()
    _, attempts = ops.show(session, message.key)
    data = revealed or ops.message_dict(message)
    return render_template(
        "message.html",
        m=message,
        data=data,
        revealed=revealed is not None,
        events=ops.timeline(session, message, attempts),
        # Stored attempt text is masked as ``ops.show`` and the CLI mask it (older rows too).
        errors={a.id: ops.attempt_dict(a, recipient=message.recipient)["error"] for a in attempts},
        providers={a.id: ops.attempt_provider(a, message) for a in attempts},
        route=ops.route(message, attempts),
        # Why it last failed over: the stored reason, masked as the fields show it.
        moved=data["last_error"],
        actions=[(a, ACTIONS[a]) for a in _APPLIES.get(message.status, [])],
    )


@blueprint.get("/messages/<path:ref>")
def message_page(ref: str) -> str:
    return _message_page(ops.find(db(), ref))


def _by_id(message_id: int) -> Message:
    message = db().get(Message, message_id)
    if message is None:
        abort(404, f"no message with id {message_id}")
    return message


@blueprint.get("/act/<int:message_id>/<action>")
def confirm(message_id: int, action: str) -> str:
    if action not in ACTIONS:
        abort(404)
    message = _by_id(message_id)
    return render_template(
        "confirm.html",
        m=message,
        action=action,
        label=ACTIONS[action],
        text=describe(action, message),
        applies=action in _APPLIES.get(message.status, []),
    )


@blueprint.post("/act/<int:message_id>/<action>")
def act(message_id: int, action: str) -> Response:
    if action not in ACTIONS:
        abort(404)
    session = db()
    message = _by_id(message_id)
    who = actor()
    if action == "redrive":
        (result,) = ops.redrive(session, [message.key], actor=who)
        ok, reason = result.redriven, result.reason
    elif action == "cancel":
        cancelled = ops.cancel(session, message.key, actor=who)
        ok, reason = cancelled.cancelled, cancelled.reason
    else:
        resolved = ops.resolve(session, message.key, action.removeprefix("resolve-"), actor=who)
        ok, reason = resolved.resolved, resolved.reason
    session.commit()
    flash(f"{ACTIONS[action]}: done" if ok else f"{ACTIONS[action]}: nothing done ({reason})")
    return redirect(url_for("messages.message_page", ref=message.key), 303)


@blueprint.post("/act/<int:message_id>/reveal")
def reveal(message_id: int) -> str:
    session = db()
    message = _by_id(message_id)
    data = ops.reveal(session, message.key, actor=actor())
    session.commit()
    return _message_page(message, data)
