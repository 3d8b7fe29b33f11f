"""The console's WSGI app: authentication, CSRF, one database session per request, errors.

``create_app(settings=..., users=...)`` builds it; ``delivery console`` serves it. Every
request authenticates (HTTP Basic: 401 otherwise); a POST needs an operator (403 for a
viewer) and the user's CSRF token (403 otherwise). Pages answer with a strict
Content-Security-Policy: no script, no remote resource, nothing framed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flask import Flask, Response, abort, g, render_template, request

from delivery.config.loading import load_settings
from delivery.config.settings import Settings
from delivery.console.auth import Users, parse_users
from delivery.console.context import ConsoleState
from delivery.console.pages import register
from delivery.errors import ConfigError, InvalidFilter, MessageNotFound
from delivery.runtime.db import make_engine, make_sessionmaker

__all__ = ["create_app"]

_HERE = Path(__file__).parent
_CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)


TRACE_URL_ENV = "DELIVERY_TRACE_URL"


def trace_url(env: dict[str, str]) -> str | None:
    """``DELIVERY_TRACE_URL``: an http(s) address with ``{trace_id}`` where the trace id goes
    (``https://jaeger.example/trace/{trace_id}``); ``ConfigError`` naming it otherwise."""
    url = env.get(TRACE_URL_ENV, "").strip()
    if not url:
        return None
    if not url.startswith(("http://", "https://")) or "{trace_id}" not in url:
        raise ConfigError(
            TRACE_URL_ENV, "must be an http(s) URL with {trace_id} where the trace id goes"
        )
    return url


def create_app(
    *,
    settings: Settings | None = None,
    users: Users | None = None,
    environ: dict[str, str] | None = None,
) -> Flask:
    """The console app on ``settings`` (default: ``DELIVERY_*`` from the environment) for
    ``users`` (default: ``DELIVERY_CONSOLE_AUTH`` / ``DELIVERY_CONSOLE_VIEWERS``; a
    ``ConfigError`` without operators)."""
    env = dict(os.environ if environ is None else environ)
    users = users or parse_users(env)
    settings = settings or load_settings()
    engine = make_engine(settings.database_url)
    sessions = make_sessionmaker(engine)
    console = ConsoleState(
        settings,
        users,
        sessions,
        flower_url=env.get("DELIVERY_FLOWER_URL"),
        trace_url=trace_url(env),
    )
    app = Flask(
        "delivery.console",
        template_folder=str(_HERE / "templates"),
        static_folder=str(_HERE / "static"),
    )
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024
    app.secret_key = os.urandom(32)  # signs the one-line notices shown after an action
    app.extensions["delivery_console"] = console
    app.jinja_env.autoescape = True

    @app.get("/healthz")
    def healthz() -> Response:
        """For health checks: answers without credentials and says nothing about the outbox."""
        return Response("ok\n", mimetype="text/plain")

    @app.before_request
    def authenticate() -> Response | None:
        g.console_state = console
        if request.path == "/healthz":
            return None
        auth = request.authorization
        role = None
        if auth is not None and auth.type == "basic" and auth.username is not None:
            role = console.users.check(auth.username, auth.password or "")
        if role is None:
            return Response(
                "authentication required\n",
                401,
                {"WWW-Authenticate": 'Basic realm="delivery console", charset="UTF-8"'},
                mimetype="text/plain",
            )
        g.user, g.role = auth.username, role  # type: ignore[union-attr]
        if request.method == "POST":
            if role != "operator":
                abort(403, "viewers cannot change anything")
            if not console.csrf.valid(g.user, request.form.get("csrf_token")):
                abort(403, "the form's CSRF token is missing or wrong: reload the page")
        return None

    @app.context_processor
    def inject() -> dict[str, Any]:
        user = g.get("user")
        return {
            "user": user,
            "is_operator": g.get("role") == "operator",
            "csrf_token": console.csrf.token(user) if user else "",
            "flower_url": console.flower_url,
            "trace_url": console.trace_url,
        }

    @app.after_request
    def harden(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = _CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    @app.teardown_request
    def close(_exc: BaseException | None) -> None:
        session = g.pop("db", None)
        if session is not None:
            session.close()

    @app.errorhandler(InvalidFilter)
    def bad_filter(exc: InvalidFilter) -> tuple[str, int]:
        return render_template("error.html", title="Bad filter", problem=str(exc)), 400

    @app.errorhandler(MessageNotFound)
    def not_found(exc: MessageNotFound) -> tuple[str, int]:
        return render_template("error.html", title="Not found", problem=str(exc)), 404

    @app.errorhandler(403)
    def forbidden(exc: Any) -> tuple[str, int]:
        return render_template("error.html", title="Forbidden", problem=exc.description), 403

    @app.errorhandler(400)
    def bad_request(exc: Any) -> tuple[str, int]:
        return render_template("error.html", title="Bad request", problem=exc.description), 400

    register(app)
    return app
