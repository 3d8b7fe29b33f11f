"""``/breakers``: each provider's breaker (state, failures in the window, next probe) and,
for operators, a reset that is audited."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, url_for
from werkzeug.wrappers import Response

from delivery.config.settings import Settings
from delivery.console.context import actor, db, state
from delivery.guards.breaker import Breakers
from delivery.ops.breakers import BreakerRow, breaker_rows, reset_breaker

__all__ = ["blueprint", "read_breakers"]

blueprint = Blueprint("breakers", __name__)


#: Said, as a neutral note, when breakers are not shared: the embedded default and the demo.
IN_PROCESS = (
    "Each worker keeps its own breakers, in its process (DELIVERY_REDIS_URL is not set): "
    "there is no shared state to show or reset here."
)


def read_breakers(settings: Settings) -> tuple[list[BreakerRow], str | None]:
    """The breaker rows, or none and why Redis could not be read (a problem, shown as one).
    Without ``DELIVERY_REDIS_URL`` there are no rows and no problem: the page notes
    ``IN_PROCESS`` instead."""
    if settings.redis_url is None:
        return [], None
    breakers = Breakers(settings)
    try:
        return breaker_rows(breakers), None
    except Exception as exc:  # Redis down: the page still renders
        return [], f"the breakers' Redis is unreachable ({type(exc).__name__})"
    finally:
        breakers.close()


@blueprint.get("/breakers")
def breakers_page() -> str:
    settings = state().settings
    rows, problem = read_breakers(settings)
    note = IN_PROCESS if settings.redis_url is None else None
    return render_template("breakers.html", breakers=rows, problem=problem, note=note)


@blueprint.post("/breakers/<provider>/reset")
def reset(provider: str) -> Response:
    settings = state().settings
    if provider not in settings.providers:
        abort(404)
    if settings.redis_url is None:
        abort(400, "DELIVERY_REDIS_URL is not set: there is no shared breaker to reset")
    breakers = Breakers(settings)
    try:
        session = db()
        before = reset_breaker(session, breakers, provider, actor=actor())
        session.commit()
    finally:
        breakers.close()
    flash(f"breaker {provider}: {before} -> closed")
    return redirect(url_for("breakers.breakers_page"), 303)
